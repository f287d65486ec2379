"""One-line mutants of the core, and which test folder kills each.

    python tools/mutate.py                       # every mutant against tests/core (about 3 minutes)
    python tools/mutate.py --folders core book harness experiments

A mutant is one small edit that makes the core wrong: a sign flipped, a check skipped, a scale
dropped. A mutant is *killed* when the tests fail with it in place. The core's own tests
(``tests/core``) must kill every mutant of the core: otherwise editing ``softmax.py`` and running
its own tests can give a false green, and the bug would show up only in a chapter's tests, if at
all. The source files are restored after every run, also on Ctrl-C. Exit status 1 when
``tests/core`` lets a mutant survive.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "attn_utils"

# (file, exact text, replacement): each text occurs exactly once in its file
MUTANTS = [
    ("softmax.py", "    e /= _reduce(np.add, e, axis)", "    e /= _reduce(np.maximum, e, axis)"),
    ("softmax.py", "lambda g: p * (g - _reduce(np.add, g * p, axis))", "lambda g: p * g"),
    (
        "softmax.py",
        "lambda g: g - np.exp(lp) * _reduce(np.add, g, axis)",
        "lambda g: g + np.exp(lp) * _reduce(np.add, g, axis)",
    ),
    ("softmax.py", "    acc = np.array(columns[0])", "    acc = np.zeros_like(columns[0])"),
    ("multihead.py", "    if share_qk and self_attention:", "    if share_qk:"),
    ("multihead.py", 'params["W_q" if share_qk else "W_k"]', 'params["W_k"]'),
    ("softmax.py", "    x -= big\n", "    x -= 0.0\n"),
    ("softmax.py", "    total[total == 0] = 1.0", "    total[total == 0] = 0.0"),
    ("softmax.py", "    np.reciprocal(total, out=total)", "    np.sqrt(total, out=total)"),
    ("softmax.py", "np.copyto(x, -np.inf, where=~mask)", "np.copyto(x, -np.inf, where=mask)"),
    (
        "softmax.py",
        "    return shifted - np.log(_reduce(np.add, np.exp(shifted), axis))",
        "    return shifted - np.log1p(_reduce(np.add, np.exp(shifted), axis))",
    ),
    ("softmax.py", "    return -np.sum(p * logp, axis=axis)", "    return np.sum(p * logp, axis=axis)"),
    (
        "softmax.py",
        "p[..., :, None] * np.eye(p.shape[-1]) - p[..., :, None] * p[..., None, :]",
        "p[..., :, None] * np.eye(p.shape[-1]) + p[..., :, None] * p[..., None, :]",
    ),
    (
        "softmax.py",
        "    return s2 - 2 * np.sum(p**3, axis=-1) + s2**2",
        "    return s2 - np.sum(p**3, axis=-1) + s2**2",
    ),
    ("softmax.py", "    return log_r_over_m - np.log1p(np.exp(log_r_over_m))", "    return log_r_over_m"),
    (
        "softmax.py",
        "    bad = (np.abs(total - 1) > slack) & (total != 0)",
        "    bad = (np.abs(total - 1) > slack) & (total == 0)",
    ),
    ("softmax.py", "    return p + np.where(undefined, np.nan, 0.0) if undefined.any() else p", "    return p"),
    ("attention.py", '    return 1.0 / np.sqrt(positive_int("d_k", d_k))', '    return 1.0 / positive_int("d_k", d_k)'),
    (
        "attention.py",
        "    return np.arange(n_k)[None, :] <= np.arange(n_k - n_q, n_k)[:, None]",
        "    return np.arange(n_k)[None, :] < np.arange(n_k - n_q, n_k)[:, None]",
    ),
    (
        "attention.py",
        "    return np.arange(n_k)[None, :] <= np.arange(n_k - n_q, n_k)[:, None]",
        "    return np.arange(n_k)[None, :] <= np.arange(0, n_q)[:, None]",
    ),
    (
        "attention.py",
        "        return matmul(q * np.asarray(scale, dtype=q.dtype), np.swapaxes(k, -1, -2))",
        "        return matmul(q, np.swapaxes(k, -1, -2))",
    ),
    (
        "attention.py",
        "    if scores.size and not _cannot_overflow(q, k, scale) and not np.isfinite(scores.min()):",
        "    if False:",
    ),
    (
        "attention.py",
        "    return bound <= float(np.finfo(np.result_type(q, k)).max) / 4  # 4: room for rounding",
        "    return True",
    ),
    (
        "attention.py",
        "    bound = q.shape[-1] * q_max * float(np.abs(k).max())",
        "    bound = q_max * float(np.abs(k).max())",
    ),
    (
        "attention.py",
        "    if q_max > float(np.finfo(q.dtype).max) / 4:",
        "    if False:",
    ),
    ("attention.py", "    return matmul(weights, v), weights", "    return matmul(weights, v) / 2, weights"),
    ("attention.py", '        check_axis_size("v", v, -2, k.shape[-2], "n_k, must match k")', "        pass"),
    (
        "attention.py",
        "        ok = np.broadcast_shapes(mask.shape, scores_shape) == tuple(scores_shape)",
        "        ok = True",
    ),
    ("attention.py", "    return s * cov", "    return cov"),
    ("counting.py", "    record_macs(out.size * a.shape[-1])", "    record_macs(out.size)"),
    (
        "multihead.py",
        "    return np.swapaxes(x.reshape(*x.shape[:-1], h, x.shape[-1] // h), -3, -2)",
        "    return np.swapaxes(x.reshape(*x.shape[:-1], x.shape[-1] // h, h), -3, -2)",
    ),
    (
        "multihead.py",
        "    return np.swapaxes(x, -3, -2).reshape(*x.shape[:-3], n, h * d)",
        "    return x.reshape(*x.shape[:-3], n, h * d)",
    ),
    ("multihead.py", "    if h % h_kv:\n", "    if False:\n"),
    (
        "multihead.py",
        "    std_in, std_out = d_model**-0.5, (h * d_v) ** -0.5",
        "    std_in, std_out = d_model**-0.5, d_model**-0.5",
    ),
    (
        "multihead.py",
        "    return d_model * (h + h_kv) * d_k + d_model * (h_kv + h) * d_v",
        "    return d_model * (h + h_kv) * d_k + d_model * (h + h) * d_v",
    ),
    ("multihead.py", '        if w["W_k"].shape != (d_model, h_kv * d_k):', "        if False:"),
    ("multihead.py", "        params = MHAParams(params, h, h_kv)", "        params = MHAParams(params, h)"),
    (
        "multihead.py",
        '        if h is not None and positive_int("h", h) != self.h:\n            raise ValueError(\n',
        "        if False:\n            raise ValueError(\n",
    ),
    (
        "validation.py",
        "    bad = np.isnan(arr) | (arr == np.inf) | ((arr == -np.inf) & (not allow_neg_inf))",
        "    bad = np.isnan(arr)",
    ),
    ("validation.py", "    if any(lead != leads[0] for lead in leads[1:]):", "    if False:"),
    ("validation.py", "    if not np.isfinite(value) or value <= 0:", "    if not np.isfinite(value) or value < 0:"),
    ("validation.py", "    if value < minimum:", "    if value < minimum - 1:"),
    ("validation.py", "    if arr.shape[axis] != expected:", "    if False:"),
]


def killed(folder: str) -> bool:
    """True when the tests of ``tests/<folder>`` fail (the mutant is caught)."""
    cmd = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:xdist", "-p", "no:randomly", f"tests/{folder}"]
    result = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    return result.returncode != 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--folders", nargs="+", default=["core"], help="test folders under tests/ (default: core)")
    parser.add_argument("--only", nargs="+", type=int, help="run only these mutant numbers (as printed)")
    args = parser.parse_args(argv)
    for name, old, _ in MUTANTS:  # refuse a stale list before touching anything
        count = (PKG / name).read_text(encoding="utf-8").count(old)
        if count != 1:
            raise SystemExit(f"mutant text occurs {count} times in attn_utils/{name}, expected once: {old.strip()!r}")
    for folder in args.folders:
        if killed(folder):
            raise SystemExit(f"tests/{folder} fails without any mutant: fix that first")
    survived = {folder: [] for folder in args.folders}
    start = time.perf_counter()
    chosen = [(i, m) for i, m in enumerate(MUTANTS, 1) if not args.only or i in args.only]
    for i, (name, old, new) in chosen:
        path = PKG / name
        original = path.read_text(encoding="utf-8")
        path.write_text(original.replace(old, new), encoding="utf-8")
        try:
            verdicts = {folder: killed(folder) for folder in args.folders}
        finally:
            path.write_text(original, encoding="utf-8")
        for folder, dead in verdicts.items():
            if not dead:
                survived[folder].append(i)
        shown = "  ".join(f"{folder}: {'killed' if dead else 'SURVIVED'}" for folder, dead in verdicts.items())
        print(f"{i:3d} {name:<13} {shown}   {old.strip().splitlines()[0][:60]}", flush=True)
    print(f"\n{len(chosen)} mutants of the core, {time.perf_counter() - start:.0f} s")
    for folder, ids in survived.items():
        print(
            f"  tests/{folder}: kills {len(chosen) - len(ids)} of {len(chosen)}" + (f"; survivors {ids}" if ids else "")
        )
    return 1 if survived.get("core") else 0


if __name__ == "__main__":
    sys.exit(main())
