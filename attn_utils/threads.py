"""Thread control shared by the numpy fast paths and the training harness.

* :func:`single_thread_blas` — run a block with one BLAS thread (restored afterwards).
* :func:`worker_pool` — one process-wide thread pool, one worker per available core.

numpy's ufuncs and BLAS calls release the GIL, so Python threads give real parallelism for
large array work; BLAS's own threads must then be switched off or the two compete for cores.
"""
from __future__ import annotations

import contextlib
import os
from concurrent.futures import ThreadPoolExecutor

from threadpoolctl import threadpool_limits

_POOL: ThreadPoolExecutor | None = None


def n_workers() -> int:
    """Cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def worker_pool() -> ThreadPoolExecutor:
    """The shared pool (created on first use)."""
    global _POOL
    if _POOL is None:
        _POOL = ThreadPoolExecutor(n_workers(), thread_name_prefix="attn_utils")
    return _POOL


@contextlib.contextmanager
def single_thread_blas():
    """Run the block with one BLAS thread, then restore the previous count (``threadpoolctl``).

    Used where the caller parallelises itself (one BLAS call per worker thread) and where the
    matrices are tiny (training: BLAS threads only add synchronisation; on a busy 2-core machine
    spinning BLAS threads made training 5–10× slower). The thread count does not change any
    printed result of the book (CONTRIBUTING.md, "Portable outputs"). Process-wide while the
    block runs, as every BLAS thread setting is.
    """
    with threadpool_limits(limits=1, user_api="blas"):
        yield


__all__ = ["n_workers", "single_thread_blas", "worker_pool"]
