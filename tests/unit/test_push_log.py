"""psruntime.push_log: a worker's pushes since the checkpoint, summed by key, a clock's pushes
counted only once a later clock begins, a clock run again replacing its first run, and a
checkpoint's cut resetting the sums (or, past it, leaving them not whole). Checked against the sums
recomputed from the pushes by hand."""
from __future__ import annotations

import numpy as np

from psruntime.push_log import PushLog
from psruntime.store.ownership_table import block_of, blocks_of_int_keys

NUM_KEYS, NUM_BLOCKS, ROW = 40, 4, 3


def push(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    keys = np.sort(rng.choice(NUM_KEYS, size=8, replace=False)).astype(np.int64)
    return keys, rng.normal(size=(8, ROW)).astype(np.float32)


def expected(pushes: list[tuple[np.ndarray, np.ndarray]], blocks: set[int]) -> dict[int, np.ndarray]:
    out: dict[int, np.ndarray] = {}
    for keys, values in pushes:
        for k, v in zip(keys.tolist(), values):
            out[k] = out.get(k, np.zeros(ROW, np.float32)) + v
    in_blocks = blocks_of_int_keys(np.array(sorted(out), np.int64), NUM_BLOCKS)
    return {k: out[k] for k, b in zip(sorted(out), in_blocks) if int(b) in blocks}


def as_dict(keys: np.ndarray, rows: np.ndarray) -> dict[int, np.ndarray]:
    return {int(k): r for k, r in zip(keys, rows)}


def test_counted_clocks_are_summed_and_a_clock_run_again_replaces_its_first_run() -> None:
    rng = np.random.default_rng(1)
    log = PushLog(NUM_KEYS)
    counted = []
    for clock in range(3):
        log.begin_clock(clock)
        for _ in range(2):
            k, v = push(rng)
            log.record(clock, k, v)
            counted.append((k, v))
        log.record(clock, "audit", np.ones(1, np.float32))
    # Clock 3 runs partly, a server is lost, the AM has counted 3 clocks: clock 3 is run again.
    log.begin_clock(3)
    log.record(3, *push(rng))
    blocks = {0, 2}
    keys, rows, named = log.sums_for(3, blocks, NUM_BLOCKS)
    want = expected(counted, blocks)
    got = as_dict(keys, rows)
    assert sorted(got) == sorted(want) and all(np.allclose(got[k], want[k], atol=1e-5) for k in want)
    assert set(blocks_of_int_keys(keys, NUM_BLOCKS).tolist()) <= blocks
    assert ("audit" in named) == (block_of("audit", NUM_BLOCKS) in blocks)
    if "audit" in named:
        assert named["audit"].tolist() == [3.0]          # clocks 0-2, not the one run again
    # Its run again records anew; begun as clock 3 again, the first run's push is gone.
    log.begin_clock(3)
    again = push(rng)
    log.record(3, *again)
    log.begin_clock(4)                        # clock 3 counted: the run again is what is summed
    keys, rows, _ = log.sums_for(4, set(range(NUM_BLOCKS)), NUM_BLOCKS)
    want = expected(counted + [again], set(range(NUM_BLOCKS)))
    got = as_dict(keys, rows)
    assert sorted(got) == sorted(want) and all(np.allclose(got[k], want[k], atol=1e-5) for k in want)


def test_the_audit_count_is_summed_by_name() -> None:
    log = PushLog(NUM_KEYS)
    for clock in range(5):
        log.record(clock, "audit", np.ones(1, np.float32))
    every = set(range(NUM_BLOCKS))
    _, _, named = log.sums_for(5, every, NUM_BLOCKS)
    assert named["audit"].tolist() == [5.0]


def test_a_checkpoint_cut_resets_the_sums_unless_a_later_clock_was_folded() -> None:
    rng = np.random.default_rng(2)
    log = PushLog(NUM_KEYS)
    log.record(0, *push(rng))
    log.record(1, *push(rng))
    log.reset(2)                              # the cut after clock 1: everything is in the checkpoint
    assert log.whole
    after = push(rng)
    log.record(2, *after)
    keys, rows, _ = log.sums_for(3, set(range(NUM_BLOCKS)), NUM_BLOCKS)
    want = expected([after], set(range(NUM_BLOCKS)))
    assert sorted(as_dict(keys, rows)) == sorted(want)
    # A cut the log has folded past (clock 2 is in the sums) cannot be split: not whole.
    log.reset(2)
    assert not log.whole
    log.reset(5)                              # the next checkpoint makes it whole again
    assert log.whole and log.sums is not None and not log.sums.any()
    keys, rows, _ = log.sums_for(5, set(range(NUM_BLOCKS)), NUM_BLOCKS)
    assert len(keys) == 0
