"""Execute chapters under other seed bases and report every check that fails.

    python tools/reseed.py --seed 12345                # every chapter under base 12345
    python tools/reseed.py --seed 7 chapters/04_*.ipynb
    python tools/reseed.py --bases 20                  # bases 1 … 20: how often each check fails
    python tools/reseed.py --bases 20 --first 101 chapters/10_parallelism.ipynb

Each notebook runs top to bottom in a fresh kernel with ``ATTN_SEED`` set (see
``attn_utils/book/seeding.py``); nothing is written back and no output is compared with the
committed one: the draws differ, so the numbers differ. What must not differ is the verdict.
A check raises when its claim fails, so a notebook that runs to the end under a base is a
notebook whose every check held for that draw. Exit status 1 when any run failed.

With ``--bases N`` the table lists, per check that failed anywhere, in how many of the N bases
it failed; a check that fails once in 20 is a coin, not evidence. Twenty clean bases do not show
that a check fails less than once in a thousand draws, so every check also logs how close it came
(``ATTN_CHECK_LOG``, see ``attn_utils/book/checks.py``): for the checks whose tolerance is made of
standard errors the script prints the ones with the least to spare, and an estimate of their
false-failure rate from the spread of that slack over the bases (normal approximation); for a count of seeds
(``check_count``) it pools the rate at which seeds met the condition over the bases and gives the binomial chance
that a draw of that many seeds leaves the count's range. Runs go ``--jobs`` at a time
(default 2, one per core), each kernel with one BLAS thread, as in ``make test``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FAILED = re.compile(r"check failed: (.*)")
NUMBER = re.compile(r"≈?-?\d[\d.]*(?:e[-+]?\d+)?")


def _texts(nb) -> list[str]:
    """Every printed text of a notebook, cell by cell (to see that a base changed the draws)."""
    out = []
    for cell in nb.cells:
        for o in cell.get("outputs", []):
            out.append(o.get("text", "") or o.get("data", {}).get("text/plain", ""))
    return out


def run(path: str, base: int, timeout: int = 600) -> tuple[str, int, float, str | None, int]:
    """Execute one notebook under one base.

    Returns (path, base, seconds, None or what failed, how many printed texts differ from the
    committed ones: 0 for a chapter with random draws means the base did not reach them, and
    the closeness record of every check that ran).
    """
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(var, "1")
    os.environ["ATTN_SEED"] = str(base)  # the kernel inherits this process's environment
    log = Path(tempfile.mkdtemp(prefix="reseed-")) / "checks.jsonl"
    os.environ["ATTN_CHECK_LOG"] = str(log)
    nb = nbformat.read(path, as_version=4)
    committed = _texts(nb)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    for attempt in range(3):
        start = time.perf_counter()
        failure = None
        try:
            NotebookClient(
                nb, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": str(Path(path).parent)}}
            ).execute()
        except CellExecutionError as err:
            text = str(err)
            found = FAILED.findall(text)
            failure = found[-1].strip() if found else text.strip().splitlines()[-1]
        except RuntimeError as err:  # a kernel that died at start (port race between two kernels): start again
            failure = f"{type(err).__name__}: {err}"
            if "died" in str(err) and attempt < 2:
                continue
        except Exception as err:  # a timeout or anything else: report it, do not hide it
            failure = f"{type(err).__name__}: {err}"
        break
    changed = sum(a != b for a, b in zip(committed, _texts(nb)))
    closeness = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    log.unlink(missing_ok=True)
    log.parent.rmdir()
    return path, base, time.perf_counter() - start, failure, changed, closeness


def check_name(failure: str) -> str:
    """What a failed line says without its numbers, so failures of one check under many bases group."""
    return NUMBER.sub("#", failure.split(" (", 1)[0])[:110]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("notebooks", nargs="*", help="default: every chapters/*.ipynb")
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--seed", type=int, help="one seed base")
    group.add_argument("--bases", type=int, help="run this many bases: --first, --first + 1, …")
    parser.add_argument("--first", type=int, default=1, help="first base of --bases (default 1)")
    parser.add_argument("--jobs", type=int, default=int(os.environ.get("JOBS", "2")))
    parser.add_argument("--save", metavar="FILE", help="write every check's closeness record (JSON lines) here")
    args = parser.parse_args(argv)

    notebooks = args.notebooks or sorted(str(p.relative_to(ROOT)) for p in (ROOT / "chapters").glob("*.ipynb"))
    bases = [args.seed] if args.seed is not None else list(range(args.first, args.first + args.bases))
    if any(b < 0 for b in bases):
        parser.error("seed bases must be non-negative")
    if 0 in bases:
        print("note: base 0 is the committed draw (what make test compares), not a new one", file=sys.stderr)
    jobs = [(nb, b) for b in bases for nb in notebooks]
    print(f"{len(notebooks)} notebook(s) × {len(bases)} base(s), {args.jobs} at a time", flush=True)

    failures: dict[str, Counter] = {}
    spare: dict[tuple[str, str], list[dict]] = {}
    closeness_of_counts: dict[tuple[str, str], list[dict]] = {}
    runs_failed = 0
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        for path, base, seconds, failure, changed, closeness in pool.map(run, *zip(*jobs)):
            if args.save:
                with open(args.save, "a", encoding="utf-8") as out:
                    for record in closeness:
                        out.write(json.dumps({"notebook": Path(path).name, "base": base, **record}) + "\n")
            for record in closeness:
                if record.get("seeds") is not None:
                    closeness_of_counts.setdefault((Path(path).name, record["name"][:110]), []).append(record)
                if record["spare_se"] is not None:
                    key = record["name"][:110]  # exact: numbers in a name tell checks apart (h=8, h=16)
                    spare.setdefault((Path(path).name, key), []).append(record)
            verdict = (
                f"ok ({changed} printed outputs differ from the committed draw)"
                if failure is None
                else f"FAILED: {failure}"
            )
            print(f"ATTN_SEED={base:<10} {seconds:6.1f} s  {Path(path).name}  {verdict}", flush=True)
            if failure is not None:
                runs_failed += 1
                failures.setdefault(Path(path).name, Counter())[check_name(failure)] += 1

    print(f"\n{len(jobs) - runs_failed} of {len(jobs)} runs passed every check")
    if failures:
        print("\nfailed checks (a failing check stops its notebook, so later checks did not run there):")
        for name, counter in sorted(failures.items()):
            for what, count in counter.most_common():
                print(f"  {name}: {count} of {len(bases)} bases  {what}")
    if len(bases) > 1 and spare:
        print(f"\nleast to spare (the {min(20, len(spare))} riskiest of {len(spare)} checks with a tolerance in SE):")
        print("  spare SE: min  mean   est. false-failure rate  check")
        ranked = sorted(spare.items(), key=lambda kv: _failure_rate(kv[1]), reverse=True)
        for (nb, what), records in ranked[:20]:
            values = [r["spare_se"] for r in records]
            print(
                f"           {min(values):4.1f} {_mean(values):5.1f}   {_failure_rate(records):9.1e}"
                f"                {nb}: {what}"
            )
    counts = {key: records for key, records in closeness_of_counts.items() if len(records) > 1}
    if len(bases) > 1 and counts:
        print(f"\ncounts of seeds (the {min(10, len(counts))} riskiest of {len(counts)}):")
        print("  seeds that met it   est. false-failure rate  check")
        ranked = sorted(counts.items(), key=lambda kv: _count_failure_rate(kv[1]), reverse=True)
        for (nb, what), records in ranked[:10]:
            met = sum(r["count"] for r in records)
            print(
                f"  {met:5d} of {sum(r['seeds'] for r in records):<5d}        {_count_failure_rate(records):9.1e}"
                f"                {nb}: {what}"
            )
    return 1 if runs_failed else 0


def _count_failure_rate(records: list[dict]) -> float:
    """How often a count of seeds would leave its range if each seed met the condition independently
    with the rate pooled over the bases (Jeffreys' estimate, so that 160 of 160 does not read as
    certainty): the binomial tails below ``at_least`` and above ``at_most``."""
    met, seeds = sum(r["count"] for r in records), sum(r["seeds"] for r in records)
    p = (met + 0.5) / (seeds + 1)
    n, low, high = records[0]["seeds"], records[0]["at_least"], records[0]["at_most"]
    pmf = [math.comb(n, k) * p**k * (1 - p) ** (n - k) for k in range(n + 1)]
    return sum(pmf[:low] if low is not None else []) + sum(pmf[high + 1 :] if high is not None else [])


def _mean(v: list[float]) -> float:
    return sum(v) / len(v)


def _sd(v: list[float]) -> float:
    return math.sqrt(sum((x - _mean(v)) ** 2 for x in v) / (len(v) - 1)) if len(v) > 1 else 0.0


def _tail(x: float) -> float:
    """P(N(0, 1) > x)."""
    return 0.5 * math.erfc(x / math.sqrt(2))


def _failure_rate(records: list[dict]) -> float:
    """How often the check would fail if what it measures varied over bases as it did here: rough,
    but it ranks the checks that twenty clean bases cannot tell apart.

    A two-sided check fails when its deviation from theory, in SE (about normal), leaves its
    allowance. A one-sided one fails when its margin (in SE, ``z + spare``) drops below ``z``; a
    margin is a ratio of two noisy numbers, skewed to the right, so its logarithm is taken as normal.
    """
    if len(records) < 2:
        return 0.0
    if all(r["dev_se"] is not None for r in records):
        dev = [r["dev_se"] for r in records]
        allowed = _mean([abs(r["dev_se"]) + r["spare_se"] for r in records])
        mean, sd = _mean(dev), max(_sd(dev), 1e-9)
        return _tail((allowed - mean) / sd) + _tail((allowed + mean) / sd)
    margins = [r["spare_se"] + r["z"] for r in records if r.get("z") is not None]
    if len(margins) == len(records) and min(margins) > 0:
        logs = [math.log(m) for m in margins]
        return _tail((_mean(logs) - math.log(records[0]["z"])) / max(_sd(logs), 1e-9))
    values = [r["spare_se"] for r in records]
    return _tail(_mean(values) / max(_sd(values), 1e-9))


if __name__ == "__main__":
    sys.exit(main())
