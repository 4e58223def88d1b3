"""The arbiter as a real NM's auxiliary service: containers of two Harmony jobs interleave their
COMP / COMM subtasks through it (the grant log on /ws/v1/node/arbiter shows COMP of different jobs
never overlapping), a killed container's held slot is reclaimed at once, the Harmony containers get
weighted CPU, and a container of a job not run by Harmony never hears of the arbiter."""
from __future__ import annotations

from pathlib import Path

import aiohttp
import pytest

from nodemanager.arbiter import GrantRecord, overlapping_cpu_grants
from polling import async_wait_until
from protocol import container_env as cenv
from protocol import internal_api as api
from protocol.arbiter_wire import name_hash
from protocol.nm_client import NMClient
from protocol.records import ContainerState
from nm_harness import FakeNodeRM, container_token, new_ids, start_nm, stop_nm

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(120)]

ITERATIONS = 20

# A stand-in executor: per iteration PULL (COMM), COMP (a few ms of busy CPU), PUSH (COMM), each
# through the HarmonyRunner it builds from its launch environment, as psruntime.executor does.
WORKER = """
import asyncio, sys, time
from pathlib import Path
from psruntime.harmony_runner import from_environment
from psruntime.training_pipeline import Subtask

async def comp():
    t = time.perf_counter()
    while time.perf_counter() - t < 0.004:
        pass

async def comm():
    await asyncio.sleep(0.001)

async def main(mode, n, marker):
    runner = await from_environment()
    if runner is None:
        print("not harmony")
        return
    if mode == "hold":        # takes the CPU slot and never gives it back (until killed)
        await runner.client.acquire(1)
        Path(marker).touch()
        await asyncio.Event().wait()
    for _ in range(n):
        await runner.run(Subtask.PULL, comm)
        await runner.run(Subtask.COMP, comp)
        await runner.run(Subtask.PUSH, comm)
    await runner.close()
    print("done", n)

asyncio.run(main(sys.argv[1], int(sys.argv[2]), sys.argv[3]))
"""


@pytest.fixture
async def rm():
    r = await FakeNodeRM().start()
    yield r
    await r.stop()


async def _launch(client: NMClient, nm, commands: list[str], env: dict[str, str], weighted: bool):
    app, attempt, cid = new_ids()
    tok = container_token(nm.node_id, cid, app, attempt, 128, 1)
    ctx = api.LaunchContext(commands=commands, environment=env, cpu_weighted=weighted)
    st = await client.start_container(nm.address, tok, ctx)
    assert st.state == ContainerState.RUNNING.value, st
    return app, cid, tok


async def _arbiter(nm) -> dict:
    return (await _get_json(f"{nm.url}/ws/v1/node/arbiter?limit=100000"))["arbiter"]


def _records(view: dict) -> list[GrantRecord]:
    return [GrantRecord(g["role"], int(g["job"], 16), int(g["executor"], 16), g["request_id"], g["asked_at"],
                        g["granted_at"], g["released_at"], g["promoted_at"], g["reclaimed"]) for g in view["grantLog"]]


async def test_two_harmony_jobs_interleave_through_the_nm_arbiter(tmp_path: Path, rm) -> None:
    # A one-core CPU pool: one COMP at a time, the paper's case (a COMP holds the machine).
    nm = await start_nm(tmp_path / "nm", rm, vcores=4, extra_nm="arbiter_cpu_pool = 1\n")
    client = NMClient(timeout_s=30)
    try:
        script = tmp_path / "worker.py"
        script.write_text(WORKER)
        marker = tmp_path / "holding"
        harmony = {cenv.HARMONY: "1"}
        run = f"python {script}"
        hold_app, hold_cid, hold_tok = await _launch(client, nm, [f"{run} hold 0 {marker}"], harmony, True)
        await async_wait_until(marker.exists, 30, what="the holder took the CPU slot")
        jobs = [await _launch(client, nm, [f"{run} run {ITERATIONS} -"], harmony, True) for _ in range(2)]
        plain = await _launch(client, nm, [f"{run} run 1 - && env"], {}, False)

        # Harmony containers get weighted CPU: no quota, though this NM's cpu mode is hard.
        if (await _get_json(f"{nm.url}/ws/v1/node/info"))["nodeInfo"]["enforcement"] == "v1":
            cpu_dir = Path("/sys/fs/cgroup/cpu/elastane") / nm.node_id.replace(":", "_") / hold_cid
            assert (cpu_dir / "cpu.cfs_quota_us").read_text().strip() == "-1"
            assert (cpu_dir / "cpu.shares").read_text().strip() == "1024"

        # Both jobs wait behind the holder; killing it hands the slot on.
        async def both_waiting() -> bool:
            return (await _arbiter(nm))["cpu_waiting"] == 2
        await async_wait_until(both_waiting, 30, what="both jobs waiting for the CPU slot")
        await client.stop_container(nm.address, hold_cid, hold_tok)

        async def finished(cid: str, tok: str):
            st = await client.container_status(nm.address, cid, tok)
            return st if st.state == ContainerState.COMPLETE.value else None
        for _, cid, tok in [*jobs, plain]:
            st = await async_wait_until(lambda c=cid, t=tok: finished(c, t), 60, what=f"{cid} done")
            assert st.exit_status == 0, st

        view = await _arbiter(nm)
        records = _records(view)
        assert overlapping_cpu_grants(records) == []
        cpu_by_job = {}
        for r in records:
            if r.role == "cpu":
                cpu_by_job[r.job] = cpu_by_job.get(r.job, 0) + 1
        assert cpu_by_job == {name_hash(hold_app): 1, **{name_hash(a): ITERATIONS for a, _, _ in jobs}}
        held = [r for r in records if r.job == name_hash(hold_app)]
        assert len(held) == 1 and held[0].reclaimed
        # The two jobs' COMPs alternated at least once (arrival order across jobs, no batching).
        order = [r.job for r in records if r.role == "cpu" and r.job != name_hash(hold_app)]
        assert sum(1 for a, b in zip(order, order[1:]) if a != b) >= 2
        assert view["cpu"] == [] and view["primary"] is None and view["connections"] == 0
        assert view["cpu_pool"] == 1 and view["cpu_in_use"] == 0
        # The NM names the grants' jobs and executors by its containers.
        named = {(g["app_id"], g["container_id"]) for g in view["grantLog"] if g["role"] == "cpu"}
        assert named == {(hold_app, hold_cid), *((a, c) for a, c, _ in jobs)}

        # The plain job's container ran without the arbiter and never saw its socket.
        plain_out = (nm.dirs["logs"] / plain[0] / plain[1] / "stdout").read_text()
        assert "not harmony" in plain_out and cenv.ARBITER_SOCKET not in plain_out
    finally:
        await client.close()
        await stop_nm(nm)


async def _get_json(url: str) -> dict:
    async with aiohttp.ClientSession() as s:
        async with s.get(url) as r:
            return await r.json(content_type=None)
