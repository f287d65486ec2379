"""BLAS thread control for the training harness.

* :func:`single_thread_blas` — run a block with one BLAS thread (restored afterwards).

The package starts no threads of its own: numpy and BLAS are the only parallelism, so every
function is safe to call from any thread and in a child process after ``fork``.
"""

from __future__ import annotations

import contextlib
import threading

from threadpoolctl import threadpool_limits


@contextlib.contextmanager
def single_thread_blas():
    """Run the block with one BLAS thread, then restore the count it had (``threadpoolctl``).

    Used where the matrices are tiny (training: BLAS threads only add synchronisation; on a busy
    2-core machine spinning BLAS threads made training 5–10× slower). The thread count does not
    change any printed result of the book (CONTRIBUTING.md, "Portable outputs").

    BLAS has one thread count for the whole process, so only the main thread changes it (recent
    OpenBLAS builds ignore the call from other threads anyway). Blocks in the main thread nest
    and restore in order; a block in another thread changes nothing. No interleaving of blocks
    across threads can therefore leave the process with a count it did not have.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    with threadpool_limits(limits=1, user_api="blas"):
        yield


__all__ = ["single_thread_blas"]
