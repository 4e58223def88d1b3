"""Rate parsing, the token bucket on an injected clock, and the paced data plane (emulated caps)."""
from __future__ import annotations

import asyncio

import numpy as np
import pytest

from nodemanager import launcher, node_settings
from polling import async_wait_until
from protocol import config as pconfig
from protocol import container_env
from protocol.internal_api import LaunchContext
from psruntime.wire import bandwidth, frame_protocol
from psruntime.wire.bandwidth import Pacer, TokenBucket, format_rate, parse_rate
from psruntime.wire.dataplane import DataPlaneConnection, DataPlaneServer
from fakes import FakeClock


# ----- rates ---------------------------------------------------------------------------------

@pytest.mark.parametrize("text, bps", [
    ("100mbit", 100_000_000), ("1gbit", 10**9), ("1Gbit", 10**9), ("10gbit", 10**10),
    ("500kbit", 500_000), ("12.5mbps", 100_000_000), ("125mbps", 10**9), ("1mibit", 2**20),
    ("1000000", 1_000_000), ("1000000bit", 1_000_000), ("1000bps", 8000), (" 2.5 gbit ", 2_500_000_000),
    (100_000_000, 100_000_000),
])
def test_parse_rate_takes_tc_units(text, bps):
    assert parse_rate(text) == bps


@pytest.mark.parametrize("text, message", [
    ("fast", "bad rate 'fast'"), ("10 furlongs", "bad rate"), ("", "bad rate"), ("-5mbit", "bad rate"),
    ("1e9", "bad rate"), ("0mbit", "out of range"), ("10bit", "out of range"), ("100tbps", "out of range"),
    (True, "bad rate"),
])
def test_parse_rate_rejects_bad_values_naming_them(text, message):
    with pytest.raises(ValueError, match=message):
        parse_rate(text)


def test_format_rate_round_trips():
    for bps in (100_000_000, 10**9, 2_500_000_000, 512_000, 8000):
        assert parse_rate(format_rate(bps)) == pytest.approx(bps, rel=1e-3)
    assert format_rate(10**9) == "1gbit"


# ----- token bucket --------------------------------------------------------------------------

def test_bucket_starts_full_then_charges_debt_at_the_rate():
    clock = FakeClock(100.0)
    b = TokenBucket(rate_bytes_s=1000, burst_bytes=500, clock=clock)
    assert b.reserve(500) == 0.0           # the burst goes at once
    assert b.reserve(250) == pytest.approx(0.25)
    assert b.reserve(250) == pytest.approx(0.5)  # queued behind the first reservation: FIFO
    clock.t += 0.5
    assert b.tokens == pytest.approx(0.0)
    assert b.reserve(0) == 0.0


def test_bucket_refills_only_up_to_the_burst():
    clock = FakeClock(100.0)
    b = TokenBucket(1000, 500, clock)
    b.reserve(500)
    clock.t += 60                         # a long idle spell does not bank more than the burst
    assert b.tokens == pytest.approx(500)
    assert b.reserve(1500) == pytest.approx(1.0)


def test_bucket_long_run_rate_is_the_cap_whatever_the_write_sizes():
    clock = FakeClock(100.0)
    b = TokenBucket.for_rate(80_000_000, clock)   # 10 MB/s
    sent = 0
    for size in [1 << 20, 100, 5 << 20, 64 << 10, 3] * 20:
        clock.t += b.reserve(size)                # a sender that waits exactly as told
        sent += size
    elapsed = clock.t - 100.0
    # Waiting as told, the sender finishes exactly when the bytes beyond the burst have drained.
    assert elapsed == pytest.approx((sent - b.burst) / 10e6, rel=1e-9)


def test_bucket_rejects_nonsense():
    with pytest.raises(ValueError, match="rate_bytes_s"):
        TokenBucket(0, 10)
    with pytest.raises(ValueError, match="burst_bytes"):
        TokenBucket(10, 0)
    with pytest.raises(ValueError, match="nbytes"):
        TokenBucket(10, 10).reserve(-1)


def virtual_pacer(bps: int) -> tuple[Pacer, FakeClock, list[float]]:
    """A pacer whose sleeps advance a fake clock instead of waiting (yielding to the loop once)."""
    clock = FakeClock(100.0)
    slept: list[float] = []

    async def sleep(s: float) -> None:
        slept.append(s)
        clock.t += s
        await asyncio.sleep(0)

    return Pacer(TokenBucket.for_rate(bps, clock), sleep), clock, slept


async def test_pacer_sleeps_only_when_the_bucket_is_empty():
    pacer, clock, slept = virtual_pacer(8_000_000)   # 1 MB/s, burst 64 KiB
    await pacer.acquire(64 << 10)
    assert slept == []
    await pacer.acquire(1_000_000)
    assert slept == [pytest.approx(1.0)] and clock.t == pytest.approx(101.0)
    assert pacer.bytes_paced == (64 << 10) + 1_000_000 and pacer.bps == 8_000_000


def test_bandwidth_from_env():
    assert bandwidth.bandwidth_from_env({}) is None
    assert bandwidth.bandwidth_from_env({container_env.NODE_BANDWIDTH_BPS: "0"}) is None
    assert bandwidth.bandwidth_from_env({container_env.NODE_BANDWIDTH_BPS: "1000000000"}) == 10**9
    with pytest.raises(ValueError, match="ELASTANE_NODE_BANDWIDTH_BPS='1gbit'"):
        bandwidth.bandwidth_from_env({container_env.NODE_BANDWIDTH_BPS: "1gbit"})


def test_process_pacer_reads_the_env_once(monkeypatch):
    monkeypatch.setattr(bandwidth, "_process_pacer_read", False)
    monkeypatch.setattr(bandwidth, "_process_pacer", None)
    monkeypatch.setenv(container_env.NODE_BANDWIDTH_BPS, "100000000")
    p = bandwidth.process_pacer()
    assert p is not None and p.bps == 100_000_000 and bandwidth.process_pacer() is p
    monkeypatch.setattr(bandwidth, "_process_pacer_read", False)
    monkeypatch.setenv(container_env.NODE_BANDWIDTH_BPS, "lots")   # bad: run uncapped, not crash
    assert bandwidth.process_pacer() is None


# ----- the paced data plane ------------------------------------------------------------------

@pytest.fixture
def paced(monkeypatch):
    """Every FrameProtocol made in this test shares one virtual-clock pacer at 8 Mbit/s (1 MB/s)."""
    pacer, clock, slept = virtual_pacer(8_000_000)
    monkeypatch.setattr(bandwidth, "_process_pacer_read", True)
    monkeypatch.setattr(bandwidth, "_process_pacer", pacer)
    return pacer, clock, slept


async def test_paced_frames_arrive_whole_and_in_order_at_the_cap(paced):
    pacer, clock, slept = paced
    got: list[tuple[int, np.ndarray]] = []

    def handler(frame):
        got.append((frame.header["n"], frame.arrays[0].copy()))
        return {"op": "ok"}, ()

    server = DataPlaneServer(handler)
    address = await server.start()
    conn = await DataPlaneConnection.open(address)
    try:
        blocks = [np.full(250_000, n, np.float32) for n in range(3)]   # 1 MB each
        futs = [conn.submit({"op": "put", "n": n}, [b]) for n, b in enumerate(blocks)]
        for b in blocks:
            b[:] = -1                      # write_frame took the data: later changes are not sent
        await conn.drain()
        await asyncio.wait_for(asyncio.gather(*futs), 10)
    finally:
        await conn.close()
        await server.stop()
    assert [n for n, _ in got] == [0, 1, 2]
    for n, arr in got:
        assert arr.shape == (250_000,) and (arr == n).all()
    # 3 MB at 1 MB/s: the virtual clock moved by the bytes over the rate, less the initial burst.
    assert pacer.bytes_paced > 3_000_000
    assert clock.t - 100.0 == pytest.approx((pacer.bytes_paced - pacer.bucket.burst) / 1e6, rel=0.05)


async def test_small_frames_are_not_held_back(paced):
    pacer, clock, slept = paced
    server = DataPlaneServer(lambda f: ({"op": "pong"}, ()))
    conn = await DataPlaneConnection.open(await server.start())
    try:
        for _ in range(20):
            reply = await asyncio.wait_for(conn.request({"op": "ping"}), 5)
            assert reply.header["op"] == "pong"
    finally:
        await conn.close()
        await server.stop()
    assert slept == [] and 0 < pacer.bytes_paced < frame_protocol.PACE_MIN_BYTES * 20


async def test_close_flushes_what_was_queued(paced):
    got = []
    server = DataPlaneServer(lambda f: (got.append(f.arrays[0].nbytes), ({"op": "ok"}, ()))[1])
    conn = await DataPlaneConnection.open(await server.start())
    try:
        conn.submit({"op": "put"}, [np.zeros(300_000, np.uint8)])
        await conn.close()                 # queued bytes still go out before the FIN
        await async_wait_until(lambda: got == [300_000], 5, "the queued bytes delivered", interval_s=0.01)
    finally:
        await server.stop()


def test_unpaced_protocol_is_unchanged_without_the_env(monkeypatch):
    monkeypatch.setattr(bandwidth, "_process_pacer_read", True)
    monkeypatch.setattr(bandwidth, "_process_pacer", None)
    p = frame_protocol.FrameProtocol(lambda f: None, lambda e: None, 1 << 20)
    assert p._pacer is None


# ----- the NM side: config -> container env ---------------------------------------------------

def _spec(tmp_path, bps: int) -> launcher.LaunchSpec:
    return launcher.LaunchSpec(container_id="container_1_0001_01_000001", app_id="application_1_0001",
                               attempt_id="", user="u", memory_mb=128, vcores=1, work_dir=str(tmp_path),
                               log_dir=str(tmp_path), exit_file=str(tmp_path / "exit"), nm_host="10.0.0.1",
                               nm_port=1, network_bandwidth_bps=bps)


def test_nm_passes_the_cap_to_containers_only_when_set(tmp_path):
    ctx = LaunchContext(commands=["true"])
    assert launcher.build_env(_spec(tmp_path, 10**9), ctx)[container_env.NODE_BANDWIDTH_BPS] == "1000000000"
    assert container_env.NODE_BANDWIDTH_BPS not in launcher.build_env(_spec(tmp_path, 0), ctx)


def test_nm_config_rejects_a_negative_cap():
    cluster = pconfig.ClusterConfig(secret="s")
    node_settings.validate(pconfig.NMConfig(network_bandwidth_bps=10**9), cluster)
    with pytest.raises(pconfig.ConfigError, match="network_bandwidth_bps must be >= 0"):
        node_settings.validate(pconfig.NMConfig(network_bandwidth_bps=-1), cluster)
