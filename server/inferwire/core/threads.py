"""Names inferwire's own threads for the operating system, so that `top -H`, py-spy and
the benchmarks' per-thread CPU split (bench/cpu.py) can tell them apart.

Python's `threading` names are invisible outside the interpreter; Linux keeps its own
15-byte name per thread (`/proc/<pid>/task/<tid>/comm`), set with prctl(PR_SET_NAME).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

_PR_SET_NAME = 15
_OS_NAME_BYTES = 15
_libc = (
    ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True) if sys.platform == "linux" else None
)


def name_this_thread(name: str) -> None:
    """Give the calling thread an OS-visible name, `iw-` + name, cut to 15 bytes."""
    if _libc is None:
        return
    encoded = f"iw-{name}".encode(errors="replace")[:_OS_NAME_BYTES]
    _libc.prctl(_PR_SET_NAME, ctypes.c_char_p(encoded), 0, 0, 0)
