"""BufferPool: a buffer is handed out again only once nothing references it, and what a pool keeps
follows the sizes it serves."""
from __future__ import annotations

import weakref

import numpy as np

from psruntime.wire.buffer_pool import MIN_BYTES, BufferPool

N = 4 * MIN_BYTES


def test_a_buffer_is_reused_once_dropped() -> None:
    pool = BufferPool()
    a = pool.take(N)
    address = a.ctypes.data
    del a
    b = pool.take(N)
    assert b.ctypes.data == address and b.shape == (N,) and b.dtype == np.uint8


def test_a_referenced_buffer_is_never_handed_out() -> None:
    pool = BufferPool(count=2)
    a = pool.take(N)
    view = np.frombuffer(a.data, np.float32)[10:20]     # a view of a view: still a reference
    mv = memoryview(pool.take(N))                        # a buffer export (e.g. a transport sending it)
    del a
    taken = [pool.take(N) for _ in range(3)]
    spans = [(x.ctypes.data, x.ctypes.data + x.nbytes) for x in taken]
    held = [(view.ctypes.data, view.ctypes.data + view.nbytes),
            (np.frombuffer(mv, np.uint8).ctypes.data, np.frombuffer(mv, np.uint8).ctypes.data + N)]
    for lo, hi in spans:
        assert all(hi <= h_lo or lo >= h_hi for h_lo, h_hi in held)
    assert len({lo for lo, _ in spans}) == 3             # nor one buffer twice


def test_take_array_has_the_shape_and_dtype() -> None:
    pool = BufferPool()
    a = pool.take_array((N // 64, 4), np.dtype("<f8"))
    assert a.shape == (N // 64, 4) and a.dtype == np.float64 and a.flags.c_contiguous and a.flags.writeable


def test_a_kept_buffer_over_twice_the_size_is_not_pinned_by_a_smaller_one() -> None:
    pool = BufferPool(count=1)
    big = pool.take(8 * N)
    address = big.ctypes.data
    del big
    small = pool.take(N)
    assert small.ctypes.data != address and len(small) == N


def test_sizes_outside_the_kept_range_still_get_a_buffer() -> None:
    pool = BufferPool(max_bytes=N)
    for size in (0, MIN_BYTES - 1, N + 1):
        assert pool.take(size).shape == (size,)


def test_a_pipelining_caller_holding_two_values_while_a_third_arrives_reuses_them() -> None:
    """Two loops each holding their last pull's values while the next arrives: three in use at
    once, all kept and handed out again (the default pool), so no fresh mapping per pull."""
    pool = BufferPool()
    held = [pool.take(N) for _ in range(3)]
    owners = [weakref.ref(b.base) for b in held]        # weak: the pool counts references
    for _ in range(4):
        held.pop(0)                          # a loop drops its last values...
        held.append(pool.take(N))            # ...when its next pull's arrive
        assert all(any(b.base is o() for o in owners) for b in held)
