"""Repository-wide pytest configuration.

nbval compares every text output of every chapter notebook. Glued figures and
images are binary and differ by matplotlib version, so they are skipped here
(nbval's documented ``skip_compare`` hook); glued *numbers* are text and are
compared.
"""

import os
import sys

import nbval.plugin

# One BLAS thread per process: pytest-xdist already runs one notebook kernel per core, and
# oversubscribed OpenBLAS threads on a 2-core machine slow small matrix products ~100x.
# Notebook kernels inherit this environment (tools/execute_notebook.py sets the same).
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

os.environ.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")

# nbval compares with the committed outputs, which the default seed base made: a reader's ATTN_SEED
# must not leak into make test (make test-reseed is where other bases run).
os.environ.pop("ATTN_SEED", None)


class _KernelWithRetry(nbval.plugin.RunningKernel):
    """nbval's kernel, started up to three times.

    With pytest-xdist, two workers start kernels at the same moment, and jupyter_client picks each
    kernel's five TCP ports in the parent process before the kernel binds them: another worker can
    take one in between, and the kernel then exits ("Kernel died before replying to kernel_info"),
    which fails every cell of that notebook although nothing in it ran. A fresh start picks new ports.
    """

    def __init__(self, *args, **kwargs):
        for attempt in range(1, 4):
            try:
                super().__init__(*args, **kwargs)
                return
            except RuntimeError as err:
                if attempt == 3:
                    raise
                print(f"kernel start {attempt} failed ({err}); starting a new kernel", file=sys.stderr)


nbval.plugin.RunningKernel = _KernelWithRetry


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
