"""Optimus's parameter assignment (appmaster/ps/parameter_assignment.py, §5.3): blocks over servers
balancing parameter size and update requests; block sizes read from a checkpoint directory."""
from __future__ import annotations

import json

import numpy as np

from appmaster.ps.parameter_assignment import TINY_FRACTION, assign_blocks, checkpoint_block_sizes, owners


def spread(assignment: dict[str, list[int]], sizes: dict[int, float]) -> tuple[float, int]:
    held = [sum(sizes[b] for b in blocks) for blocks in assignment.values()]
    counts = [len(blocks) for blocks in assignment.values()]
    return max(held) - min(held), max(counts) - min(counts)


def round_robin(sizes: dict[int, float], servers: list[str]) -> dict[str, list[int]]:
    return {s: [b for b in sorted(sizes) if b % len(servers) == i] for i, s in enumerate(servers)}


def test_every_block_is_assigned_once_and_sizes_balance_better_than_round_robin():
    # Layers of very different sizes, as MXNet's blocks in §5.3: round-robin piles big ones together.
    sizes = {0: 4000.0, 1: 3000.0, 2: 2500.0, 3: 2000.0, 4: 900.0, 5: 800.0, 6: 700.0, 7: 300.0, 8: 5.0, 9: 3.0,
             10: 2.0, 11: 1.0}
    servers = ["s0", "s1", "s2"]
    got = assign_blocks(sizes, servers)
    assert sorted(b for blocks in got.values() for b in blocks) == sorted(sizes)
    paa_size, paa_requests = spread(got, sizes)
    rr_size, _ = spread(round_robin(sizes, servers), sizes)
    assert paa_size < rr_size and paa_size <= max(sizes.values()) / 2
    assert paa_requests <= 2


def test_tiny_blocks_go_to_the_server_with_the_fewest_requests():
    # One server takes the one big block; every tiny block then goes to the others, whose request
    # counts grow evenly (tiny = below 1% of the average size per server).
    sizes = {0: 1000.0, **{b: 0.1 for b in range(1, 9)}}
    assert 0.1 < TINY_FRACTION * 1000.0 / 3
    got = assign_blocks(sizes, ["a", "b", "c"])
    owner_of_big = next(s for s, blocks in got.items() if 0 in blocks)
    counts = {s: len(blocks) for s, blocks in got.items()}
    assert sorted(counts.values()) == [3, 3, 3]          # requests balanced, the big block counting as one
    assert counts[owner_of_big] == min(counts.values())


def test_a_block_larger_than_the_average_goes_whole_to_the_server_holding_least():
    got = assign_blocks({0: 10.0, 1: 1.0, 2: 1.0}, ["a", "b"])
    assert got == {"a": [0], "b": [1, 2]}


def test_equal_blocks_spread_evenly_and_the_result_is_deterministic():
    sizes = {b: 1.0 for b in range(10)}
    got = assign_blocks(sizes, ["a", "b", "c"])
    assert sorted(len(v) for v in got.values()) == [3, 3, 4]
    assert got == assign_blocks(dict(reversed(list(sizes.items()))), ["a", "b", "c"])
    table = owners(10, sizes, ["a", "b", "c"])
    assert len(table) == 10 and set(table) == {"a", "b", "c"}


def test_the_table_is_never_less_balanced_than_round_robin_and_mostly_better():
    rng = np.random.default_rng(3)
    better = 0
    for _ in range(50):
        n = int(rng.integers(8, 40))
        sizes = {b: float(s) for b, s in enumerate(rng.lognormal(6, 1.5, size=n))}
        servers = [f"s{i}" for i in range(int(rng.integers(2, 6)))]
        table = owners(n, sizes, servers)
        got = {s: [b for b in range(n) if table[b] == s] for s in servers}
        paa, rr = spread(got, sizes)[0], spread(round_robin(sizes, servers), sizes)[0]
        assert paa <= rr + 1e-9
        better += paa < rr
    assert better >= 40


def test_block_sizes_come_from_the_checkpoint_files(tmp_path):
    (tmp_path / "block_0.npz").write_bytes(b"x" * 100)
    (tmp_path / "block_1.npz").write_bytes(b"x" * 30)
    (tmp_path / "manifest-s0.json").write_text(json.dumps({
        "format": 2, "num_blocks": 2, "table_version": 1,
        "blocks": {"0": {"file": "block_0.npz", "other_keys": []}, "1": {"file": "block_1.npz", "other_keys": []}}}))
    assert checkpoint_block_sizes(tmp_path, 2) == {0: 100.0, 1: 30.0}
    assert checkpoint_block_sizes(tmp_path, 3) == {}           # another job shape: unknown
    assert checkpoint_block_sizes(tmp_path / "none", 2) == {}
