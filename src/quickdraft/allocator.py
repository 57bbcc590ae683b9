"""Giving freed memory back to the operating system, and keeping the cycle collector off what stays.

Two things keep memory resident after Python lets go of a large tensor: a reference cycle holds
it until the cycle collector runs, and glibc's allocator keeps freed heap pages for reuse
(after a large block is freed, it serves blocks up to 32 MiB from the heap instead of fresh
mappings). Replacing a model's layers one at a time, or finishing a long prompt, leaves hundreds
of MiB behind either way; ``give_back_memory`` frees both.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
from collections.abc import Callable


def _load_malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``, which returns free heap pages to the system; None elsewhere."""
    name = ctypes.util.find_library("c")
    libc = ctypes.CDLL(name) if name else None
    return getattr(libc, "malloc_trim", None)


_malloc_trim = _load_malloc_trim()


def give_back_memory() -> None:
    """Collect reference cycles, then hand the allocator's free pages back to the system."""
    gc.collect()
    if _malloc_trim is not None:
        _malloc_trim(0)


def freeze_long_lived() -> None:
    """Put every object alive now out of the cycle collector's reach (``gc.freeze``), so that a
    full collection scans only what came after: with two models loaded, hundreds of thousands of
    tracked objects (modules, parameters, tokenizers) make each ``give_back_memory`` take a
    hundred milliseconds or more against under one frozen, and the server runs one each time its
    batch empties, which a lone client's next request waits for. A frozen object is never collected: freeze only what
    the process keeps until ``thaw`` (a server, from start to stop)."""
    gc.freeze()


def thaw() -> None:
    """Give every frozen object back to the collector (``gc.unfreeze``): what any
    ``freeze_long_lived`` froze, so one of two servers in a process stopping thaws the other's too
    (only its collections get slower again)."""
    gc.unfreeze()
