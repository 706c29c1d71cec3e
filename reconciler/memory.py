"""Giving the heap back: glibc keeps what a big pass (10,000 plans, a note of 10,000 lines) freed unless
asked, so an idle daemon would stay at its peak. Called after full passes and big status batches."""

from __future__ import annotations

import ctypes
import ctypes.util


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
