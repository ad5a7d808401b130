"""results/heap.py: glibc keeps the fleet analysis's freed arrays (issue #27). Checked in a process of its own with
glibc's own account (``mallinfo2``): a 64 MiB array comes from an ``mmap`` of its own before, from the heap after
keep_freed_memory, and after it is freed the heap keeps it for the next one."""

from __future__ import annotations

import subprocess
import sys

CODE = """
import ctypes, numpy as np
from gpuaccept.results.heap import keep_freed_memory
class Info(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                               "fsmblks", "uordblks", "fordblks", "keepcost")]
libc = ctypes.CDLL(None)
libc.mallinfo2.restype = Info
def mib(): i = libc.mallinfo2(); return i.hblkhd >> 20, i.arena >> 20
a = np.ones(8 << 20); mapped = mib(); del a
took = keep_freed_memory()
b = np.ones(8 << 20); heap = mib(); del b
freed = mib()
print(took, *mapped, *heap, *freed, keep_freed_memory())
"""


def test_big_arrays_come_from_the_heap_and_stay_there_when_freed() -> None:
    out = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, check=True, timeout=60)
    took, mapped_mmap, _, heap_mmap, heap_arena, freed_mmap, freed_arena, again = out.stdout.split()
    assert took == "True" and again == "True", out.stdout
    assert int(mapped_mmap) >= 64  # before: the array is a mapping of its own, given back when freed
    assert int(heap_mmap) < 64 <= int(heap_arena), out.stdout  # after: in the heap
    assert int(freed_mmap) < 64 <= int(freed_arena), out.stdout  # and kept there once freed
