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
it failed; a check that fails once in 20 is a coin, not evidence. Runs go ``--jobs`` at a time
(default 2, one per core), each kernel with one BLAS thread, as in ``make test``.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
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
    committed ones: 0 for a chapter with random draws means the base did not reach them).
    """
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(var, "1")
    os.environ["ATTN_SEED"] = str(base)  # the kernel inherits this process's environment
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
    return path, base, time.perf_counter() - start, failure, changed


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
    runs_failed = 0
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        for path, base, seconds, failure, changed in pool.map(run, *zip(*jobs)):
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
    return 1 if runs_failed else 0


if __name__ == "__main__":
    sys.exit(main())
