"""Thread control shared by the numpy fast paths and the training harness.

* :func:`single_thread_blas` — run a block with one OpenBLAS thread (restored afterwards).
* :func:`worker_pool` — one process-wide thread pool, one worker per available core.

numpy's ufuncs and BLAS calls release the GIL, so Python threads give real parallelism for
large array work; BLAS's own threads must then be switched off or the two compete for cores.
"""
from __future__ import annotations

import contextlib
import ctypes
import functools
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

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


@functools.lru_cache(maxsize=1)
def _openblas_thread_controls() -> tuple[Callable, Callable] | None:
    """(get, set) for the OpenBLAS that numpy loaded, or None if it cannot be found."""
    try:
        with open("/proc/self/maps") as fh:
            paths = sorted({ln.split()[-1] for ln in fh if "openblas" in ln.lower() and ".so" in ln})
    except OSError:
        return None
    for path in paths:
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for get_name, set_name in (("openblas_get_num_threads", "openblas_set_num_threads"),
                                   ("scipy_openblas_get_num_threads64_", "scipy_openblas_set_num_threads64_"),
                                   ("openblas_get_num_threads64_", "openblas_set_num_threads64_")):
            if hasattr(lib, get_name) and hasattr(lib, set_name):
                return getattr(lib, get_name), getattr(lib, set_name)
    return None


@contextlib.contextmanager
def single_thread_blas():
    """Run the block with one OpenBLAS thread, then restore the previous count.

    Used where the caller parallelises itself (one BLAS call per worker thread) and where the
    matrices are tiny (training: BLAS threads only add synchronisation; on a busy 2-core machine
    spinning BLAS threads made training 5–10× slower). Process-wide while the block runs.
    Does nothing if numpy's BLAS is not OpenBLAS.
    """
    controls = _openblas_thread_controls()
    if controls is None:
        yield
        return
    get, set_ = controls
    before = int(get())
    set_(1)
    try:
        yield
    finally:
        set_(before)


__all__ = ["n_workers", "single_thread_blas", "worker_pool"]
