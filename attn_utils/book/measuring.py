"""Measuring: costs, times, memory, slopes and finite differences, as the chapters report them.

* :func:`count_macs` — count the multiply-adds of the array products run inside a block
  (the book's one cost unit: a multiply-add, MAC; 1 MAC = 2 FLOPs)
* :func:`min_seconds`, :func:`traced_peak_memory` — wall time and peak traced memory of a call
* :func:`loglog_slope`, :func:`running_mean` — the fitted exponent of a scaling law; a smoothed curve
* :func:`numerical_jacobian` — central finite differences, to check a derived Jacobian
* :func:`single_thread_blas` — run a block with one BLAS thread (restored afterwards)
* :func:`keep_freed_memory` — stop a training loop from faulting its temporaries in at every step

The package starts no threads of its own: numpy and BLAS are the only parallelism, so every
function is safe to call from any thread and in a child process after ``fork``.
"""

from __future__ import annotations

import contextlib
import threading
import time
import tracemalloc

import numpy as np
from threadpoolctl import threadpool_limits

from ..counting import MacCounter, count_macs, counted_matmul, record_macs
from ..validation import as_float_array, positive_int, positive_scalar


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


def keep_freed_memory() -> None:
    """Make glibc keep freed memory for reuse; training loops call it before their first step.

    Memory, not results: a training step allocates and frees megabytes of temporaries. glibc hands
    freed memory back to the OS when more than twice its adaptive mmap threshold is free, and
    raises that threshold only when a larger block is freed; left low, it makes every step fault
    its temporaries in again (measured: the first training run of a fresh process took twice as
    long, half of it system time, 3·10^5 page faults; chapter 4 lost 2–3 s). Freeing one untouched
    30 MB block (below glibc's 32 MB cap for the threshold) raises it for the rest of the process.
    Elsewhere than glibc it costs an allocation and changes nothing. No value depends on this.
    """
    np.empty(30 * 2**20, dtype=np.uint8)  # allocated and freed at once, never touched


def use_single_thread_blas():
    """Give BLAS one thread for the rest of the process (a chapter's first cell calls this).

    The book's matrices are small, so BLAS threads only add synchronisation, and on a busy machine
    spinning threads made training several times slower. No printed result depends on the thread
    count (CONTRIBUTING.md, "Portable outputs"; ``make test-portable`` runs the chapters with two).
    Returns the ``threadpoolctl`` limiter; ``.restore_original_limits()`` undoes it.
    """
    return threadpool_limits(limits=1, user_api="blas")


def loglog_slope(x, y) -> float:
    """Least-squares slope of ``log y`` against ``log x``: the exponent ``a`` in ``y ∝ x^a``."""
    x = as_float_array("x", x, min_ndim=1)
    y = as_float_array("y", y, min_ndim=1)
    if x.shape != y.shape or x.ndim != 1 or x.size < 2:
        raise ValueError(f"x and y must be 1-D of equal length ≥ 2, received {x.shape} and {y.shape}")
    if (x <= 0).any() or (y <= 0).any():
        raise ValueError("x and y must be positive for a log-log fit")
    return float(np.polyfit(np.log(x), np.log(y), 1)[0])


def min_seconds(fn, *args, repeat: int = 5, **kwargs) -> float:
    """Fastest wall-clock seconds of ``fn(*args, **kwargs)`` over ``repeat`` calls, after one warm-up.

    The minimum (not the mean) is the least disturbed by other processes sharing the machine.
    """
    repeat = positive_int("repeat", repeat)
    fn(*args, **kwargs)
    best = np.inf
    for _ in range(repeat):
        start = time.perf_counter()
        fn(*args, **kwargs)
        best = min(best, time.perf_counter() - start)
    return float(best)


def traced_peak_memory(fn, *args, **kwargs) -> tuple[int, float]:
    """Peak bytes allocated while ``fn(*args, **kwargs)`` runs, and its wall-clock seconds.

    Uses :mod:`tracemalloc`, which sees numpy's array buffers (numpy reports them to it) but
    not memory that BLAS allocates internally. Arrays alive before the call (the inputs) are
    not counted; the result of the call is, because it is alive at the peak. The result is
    discarded. Raises ``RuntimeError`` if tracing is already on (nested measurements would be
    wrong).
    """
    if tracemalloc.is_tracing():
        raise RuntimeError("traced_peak_memory: tracemalloc is already tracing")
    tracemalloc.start()
    try:
        start = time.perf_counter()
        fn(*args, **kwargs)
        seconds = time.perf_counter() - start
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return peak, seconds


def numerical_jacobian(f, x, h: float = 1e-6) -> np.ndarray:
    """Central-difference Jacobian of ``f`` at ``x``.

    Parameters
    ----------
    f : callable
        Maps an array of shape ``x.shape`` to an array of a fixed shape ``out_shape``.
    x : array, any shape (a scalar is allowed)
        The point; converted to float64.
    h : float > 0
        Step. The error is ``O(h²)`` from truncation plus ``O(ε·|f|/h)`` from rounding
        (ε ≈ 2.2e-16), so ``h = 1e-6`` gives about 1e-9 for functions of size 1.

    Returns
    -------
    jac : array of shape ``out_shape + x.shape``
        ``jac[..., j] = (f(x + h e_j) − f(x − h e_j)) / (2h)`` for every coordinate ``j``
        of ``x`` (one pair of calls per coordinate: ``f`` need not accept a batch).
    """
    if not callable(f):
        raise TypeError(f"f must be callable, received {type(f).__name__}")
    x = as_float_array("x", x, min_ndim=0)
    h = positive_scalar("h", h)
    flat = x.reshape(-1)
    columns = []
    out_shape = None
    for j in range(flat.size):
        step = np.zeros_like(flat)
        step[j] = h
        up = np.asarray(f((flat + step).reshape(x.shape)), dtype=float)
        down = np.asarray(f((flat - step).reshape(x.shape)), dtype=float)
        if out_shape is None:
            out_shape = up.shape
        if up.shape != out_shape or down.shape != out_shape:
            raise ValueError(
                f"f must return one fixed shape; received {out_shape}, then {up.shape} "
                f"and {down.shape} at coordinate {j}"
            )
        columns.append((up - down) / (2 * h))
    jac = np.stack(columns, axis=-1)
    return jac.reshape(out_shape + x.shape)


def running_mean(x, window: int, axis: int = 0) -> np.ndarray:
    """Trailing moving average along ``axis``: entry ``t`` is the mean of ``x[max(0, t−window+1) … t]``.

    x : any shape with at least one axis; returns the same shape (the first ``window − 1``
    entries average over the shorter prefix, so nothing is dropped or padded).
    """
    x = as_float_array("x", x, min_ndim=1)
    window = positive_int("window", window)
    x = np.moveaxis(x, axis, 0)
    c = np.cumsum(x, axis=0)
    out = c.copy()
    out[window:] = c[window:] - c[:-window]
    counts = np.minimum(np.arange(1, x.shape[0] + 1), window).reshape((-1,) + (1,) * (x.ndim - 1))
    return np.moveaxis(out / counts, 0, axis)


__all__ = [
    "single_thread_blas",
    "keep_freed_memory",
    "use_single_thread_blas",
    "MacCounter",
    "count_macs",
    "record_macs",
    "counted_matmul",
    "loglog_slope",
    "min_seconds",
    "traced_peak_memory",
    "numerical_jacobian",
    "running_mean",
]
