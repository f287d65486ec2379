"""Repository-wide pytest configuration.

nbval compares every text output of every chapter notebook. Glued figures and
images are binary and differ by matplotlib version, so they are skipped here
(nbval's documented ``skip_compare`` hook); glued *numbers* are text and are
compared.
"""

import os

# One BLAS thread per process: pytest-xdist already runs one notebook kernel per core, and
# oversubscribed OpenBLAS threads on a 2-core machine slow small matrix products ~100x.
# Notebook kernels inherit this environment (tools/execute_notebook.py sets the same).
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

os.environ.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")


def pytest_collectstart(collector):
    if collector.fspath and collector.fspath.ext == ".ipynb":
        collector.skip_compare += (
            "image/png",
            "image/jpeg",
            "image/svg+xml",
            "application/pdf",
            "text/html",
            "application/papermill.record/image/png",
            "application/papermill.record/text/html",
            "application/vnd.jupyter.widget-view+json",
        )
