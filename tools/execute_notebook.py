"""Execute chapter notebooks in place, top to bottom, in a fresh kernel.

Usage: python tools/execute_notebook.py chapters/01_dot_product_variance.ipynb [...]

Run this before committing a notebook: the committed outputs are what nbval
re-runs and compares, and what the website shows. Prints the time each took.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

# Same environment as the test suite (conftest.py), so outputs are produced the way nbval re-runs them.
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")


def merged_streams(outputs: list) -> list:
    """Consecutive prints to one stream as one output: how the kernel split them depends on timing
    (a busy machine flushes more often), and a split would be a diff with no change in the text."""
    merged = []
    for out in outputs:
        prev = merged[-1] if merged else None
        if out.output_type == "stream" and prev is not None and prev.output_type == "stream" and prev.name == out.name:
            prev.text += out.text
        else:
            merged.append(out)
    return merged


def execute(path: Path, timeout: int = 300) -> float:
    nb = nbformat.read(path, as_version=4)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    start = time.perf_counter()
    # Run from the notebook's folder so relative paths behave as in Jupyter Lab.
    NotebookClient(
        nb,
        timeout=timeout,
        kernel_name="python3",
        record_timing=False,
        resources={"metadata": {"path": str(path.parent)}},
    ).execute()
    elapsed = time.perf_counter() - start
    for cell in nb.cells:  # timestamps would make every re-run a diff
        cell.metadata.pop("execution", None)
        if cell.cell_type == "code":
            cell.outputs = merged_streams(cell.outputs)
    nbformat.write(nb, path)
    return elapsed


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    for arg in sys.argv[1:]:
        print(f"{execute(Path(arg)):6.1f} s  {arg}", flush=True)
