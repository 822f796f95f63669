"""The kernels never touch memory outside their operands: operands sit against PROT_NONE pages.

A stray access would kill the process with SIGSEGV, so the checks run in a subprocess."""

from __future__ import annotations

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent('''
    import ctypes, mmap
    import numpy as np
    import tilefold.linalg as tl

    libc = ctypes.CDLL(None)
    libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    PAGE = mmap.PAGESIZE
    keep = []

    def guarded(shape, at_end, transpose=False, neg=False):
        """A float32 array touching a PROT_NONE page right after (or before) its bytes."""
        n = int(np.prod(shape))
        nbytes = n * 4
        pages = -(-nbytes // PAGE) + 2
        mm = mmap.mmap(-1, pages * PAGE)
        keep.append(mm)
        base = np.frombuffer(mm, np.uint8)
        addr = base.ctypes.data
        assert libc.mprotect(addr, PAGE, 0) == 0
        assert libc.mprotect(addr + (pages - 1) * PAGE, PAGE, 0) == 0
        start = (pages - 1) * PAGE - nbytes if at_end else PAGE
        flat = np.frombuffer(mm, np.float32, n, start)
        store = shape[::-1] if transpose else shape
        arr = flat.reshape(store)
        arr[...] = np.random.default_rng(n).standard_normal(store)
        arr = arr.T if transpose else arr
        return arr[::-1, ::-1] if neg else arr

    shapes = [(1, 1, 1), (7, 5, 3), (97, 61, 37), (1, 777, 301), (301, 1, 77), (16, 48, 256),
              (9, 49, 17), (130, 130, 130), (3, 300, 5), (301, 16, 77), (61, 9, 400)]
    count = 0
    for m, n, k in shapes:
        for at_end in (True, False):
            for ta, tb, neg in ((False, False, False), (True, False, False),
                                (False, True, False), (False, False, True)):
                a = guarded((m, k), at_end, ta, neg)
                b = guarded((k, n), at_end, tb, neg)
                out = guarded((m, n), at_end)
                for threads in (1, 2):
                    tl.matmul(a, b, out=out, threads=threads)
                    ref = a.astype(np.float64) @ b
                    assert np.allclose(out, ref, rtol=1e-4, atol=1e-4 * k), (m, n, k)
                    count += 1
                packed = tl.prepack(b)
                tl.matmul(a, packed, out=out)
    print("checked", count)
''')


def test_no_access_outside_operands():
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    assert "checked" in proc.stdout
