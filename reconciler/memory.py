"""Giving the heap back: glibc keeps what a big pass (10,000 plans, a note of 10,000 lines) freed unless
asked, so an idle daemon would stay at its peak. Called after full passes and big status batches."""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import os


def _load_libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
    except OSError:
        return None
    return libc if libc is not None and hasattr(libc, "malloc_trim") else None


_LIBC = _load_libc()


def release_memory() -> None:
    """Return the free heap to the system (malloc_trim): a daemon of 10,000 apps idles tens of MB lower
    (bench/scale_bench.py). A no-op without glibc."""
    if _LIBC is not None:
        _LIBC.malloc_trim(0)


_M_ARENA_MAX = -8  # glibc's mallopt parameter number (malloc.h)


def limit_arenas(n: int = 2) -> None:
    """Cap glibc's malloc arenas, as MALLOC_ARENA_MAX does: each thread that allocates (scheduler, HTTP,
    notes writer, executor pool) otherwise gets an arena of its own whose freed pages stay mapped. With
    PYTHONMALLOC=malloc (the image sets both) a 10,000-app shard idles at 142 MB instead of 177
    (bench/scale_bench.py). Called before the daemon starts its threads; a no-op without glibc or when the
    environment already sets it."""
    if _LIBC is not None and "MALLOC_ARENA_MAX" not in os.environ and hasattr(_LIBC, "mallopt"):
        _LIBC.mallopt(_M_ARENA_MAX, n)


# A gen-0 collection every 50,000 container allocations instead of 700 (and a gen-1 one every 20 of them).
DAEMON_GC_THRESHOLD = (50_000, 20, 10)


def tune_gc() -> None:
    """Collect cycles less often. A shard holds its 10,000 loaded specs (a few hundred thousand tracked
    objects) while a pass allocates as many again, and CPython's default thresholds scanned them so often
    that the collector took a fifth of a shard's start-up CPU and half of its planning time
    (bench/scale_bench.py). Garbage without cycles is freed at once either way (reference counting); what
    waits longer is only cyclic garbage, at most one young generation of it."""
    gc.set_threshold(*DAEMON_GC_THRESHOLD)
