"""`--policy harmony` inside a ResourceManager (in-process, fake clock): three scripted PS AMs
report COMP / COMM times at the shape they were told; the policy profiles them one node each,
groups the complementary ones, pauses the one left out, resumes it in place of a similar job that
finishes, and the RM's REST API shows each job's Harmony state."""
from __future__ import annotations

from aiohttp.test_utils import TestClient, TestServer

from protocol import internal_api as api
from protocol.internal_api import RunState
from protocol.job_report import JobReport, WorkerTiming
from protocol.records import Resource
from rm.__main__ import load_configs, parse_args
from rm.model import AmSpec
from rm.policies import HarmonyPolicy, describe
from rm.policy_runner import run_policy
from rm.server import ResourceManagerServer
from rm_testing import FakeClock, launch_and_register, ps_spec, register

BASE = "/ws/v1/cluster"
WAIT_S = 0.5


def submit_ps(core, name: str) -> str:
    app_id = core.new_application()
    spec = {"app": "mlr", "workers": 1, "servers": 1, "executor_memory_mb": 1024, "executor_vcores": 1}
    core.submit(app_id, "alice", name, "default", "ELASTANE_PS", AmSpec(["true"], {}, {}, Resource(1024, 1)),
                1, ps_job=ps_spec(spec))
    core.app_saved(app_id)
    return app_id


class ScriptedAm:
    """An AM that obeys each directive at once and reports the times of its true profile there."""

    def __init__(self, core, app_id: str, t_cpu1: float, t_net: float):
        self.core, self.app_id, self.t_cpu1, self.t_net = core, app_id, t_cpu1, t_net
        self.claims = launch_and_register(core, app_id)
        self.response_id = 0
        self.directive: api.ShapeDirective | None = None
        self.iterations = 0
        self.seen: list[api.ShapeDirective] = []

    def report(self) -> JobReport:
        d = self.directive
        if d is None or d.run_state is RunState.PAUSE:
            return JobReport(workers=0, servers=0, started=True, iterations=self.iterations,
                             directive_version=0 if d is None else d.version)
        self.iterations += 10
        return JobReport(workers=d.workers, servers=d.servers, started=True, iterations=self.iterations,
                         directive_version=d.version, executor_resource=d.executor_resource,
                         # Each mini-batch also waits WAIT_S for its grants: not the job's own time.
                         worker_times=WorkerTiming(compute_s=self.t_cpu1 / d.workers + WAIT_S, comm_s=self.t_net,
                                                   workers=d.workers, compute_held_s=self.t_cpu1 / d.workers,
                                                   comm_held_s=self.t_net, compute_wait_s=WAIT_S))

    def allocate(self) -> None:
        r = self.core.allocate(self.claims, api.AllocateRequest(response_id=self.response_id, shape=self.report()))
        self.response_id = r.response_id
        if r.shape_directive is not None:
            self.directive = r.shape_directive
            self.seen.append(r.shape_directive)


async def test_harmony_groups_pauses_and_resumes_scripted_jobs_inside_the_rm(tmp_path):
    (tmp_path / "cluster.toml").write_text('[cluster]\nsecret = "test-secret-0123456789"\n')
    cfg, cluster = load_configs(parse_args(["--policy", "harmony", "--state-dir", str(tmp_path / "rm"),
                                            "--cluster-config", str(tmp_path / "cluster.toml")]))
    rm = ResourceManagerServer(cfg, cluster, clock=FakeClock(), run_timers=False)
    core = rm.core
    client = TestClient(TestServer(rm.build_app()))
    await client.start_server()
    try:
        assert isinstance(rm.policy, HarmonyPolicy)
        for i in (1, 2, 3, 4):
            register(core, f"n{i}:1", mem=16 * 1024, vcores=16)
        ams: dict[str, ScriptedAm] = {}
        # A and C are COMP-heavy, B and D COMM-heavy (COMP on one machine, COMM; seconds).
        for name, (c, n) in {"A": (8.0, 1.0), "B": (1.0, 1.8), "C": (6.0, 0.6), "D": (0.8, 2.0)}.items():
            ams[name] = ScriptedAm(core, submit_ps(core, name), c, n)

        def round_trip() -> None:
            run_policy(core, rm.policy)
            for am in ams.values():
                if not core.apps[am.app_id].state.is_final:
                    am.allocate()

        def state(name: str) -> tuple[object, object]:
            s = describe(rm.policy).get(ams[name].app_id, {})
            return s.get("state"), s.get("group")

        # Round 1: every job is profiled alone: one worker and one server on a node of its own.
        round_trip()
        assert [state(x)[0] for x in "ABCD"] == ["profiling"] * 4
        assert sorted(ams[x].directive.nodes[0] for x in "ABCD") == ["n1:1", "n2:1", "n3:1", "n4:1"]
        # The AMs got their directives on that allocate: the reports the next round reads are the
        # first taken at the profiling shape, so it is round 3 that sees them profiled.
        round_trip()
        assert [state(x)[0] for x in "ABCD"] == ["profiling"] * 4
        # Round 3: all profiled; Algorithm 1 groups A, B, C on every node and leaves D out (paused).
        round_trip()
        group = state("A")[1]
        assert [state(x) for x in "ABC"] == [("running", group)] * 3 and state("D") == ("paused", None)
        for x in "ABC":
            d = ams[x].directive
            assert (d.group, d.run_state, d.nodes) == (group, RunState.RUN, ["n1:1", "n2:1", "n3:1", "n4:1"])
            assert all((p.workers, p.servers) == (1, 1) for p in d.placement) and d.executor_resource is not None
        assert (ams["D"].directive.run_state, ams["D"].directive.workers) == (RunState.PAUSE, 0)
        versions = {x: ams[x].directive.version for x in "ABCD"}
        round_trip()                      # nothing changed: no directive is re-issued
        assert {x: ams[x].directive.version for x in "ABCD"} == versions

        # E, like A within 5 %, arrives: it is profiled on a node borrowed from the group, then
        # waits (paused) behind D.
        ams["E"] = ScriptedAm(core, submit_ps(core, "E"), 7.9, 1.0)
        round_trip()
        round_trip()
        assert state("E") == ("profiling", None)
        round_trip()
        assert state("E") == ("paused", None) and ams["E"].directive.run_state is RunState.PAUSE
        # A finishes: E takes its place in the group and is resumed on the group's nodes.
        ams["A"].allocate()
        core.am_finish(ams["A"].claims, api.AmFinishRequest(final_status="SUCCEEDED"))
        round_trip()
        assert state("E") == ("running", group) and state("A") == (None, None)
        d = ams["E"].directive
        assert (d.run_state, d.group) == (RunState.RESUME, group) and d.nodes == ams["B"].directive.nodes
        assert [x.run_state for x in ams["E"].seen] == [RunState.RUN, RunState.PAUSE, RunState.RESUME]

        # The RM's REST API shows the Harmony state per app (generic: Policy.describe()).
        r = await client.get(f"{BASE}/apps/{ams['B'].app_id}/shape", params={"user.name": "alice"})
        shape = (await r.json())["shape"]
        assert shape["policy"] == "harmony" and shape["policyState"]["state"] == "running"
        # B's profile is the time its subtasks held their grants (1.0 s on one machine), not waited.
        assert (shape["policyState"]["tCpu1"], shape["policyState"]["tNet"]) == (1.0, 1.8)
        assert {"profilingS", "regroupS", "pausedS", "moves"} <= set(shape["policyState"])
        assert shape["directive"]["group"] == state("B")[1] and shape["directive"]["executorResource"]
        r = await client.get(f"{BASE}/scheduler", params={"user.name": "alice"})
        info = (await r.json())["scheduler"]["schedulerInfo"]["policy"]
        assert info["name"] == "harmony" and set(info["apps"]) == {ams[x].app_id for x in "BCDE"}
    finally:
        await client.close()
        rm.store.close()


async def test_a_policy_that_places_new_jobs_says_so_at_registration_and_a_new_attempt_gets_its_directive(tmp_path):
    # Harmony places a new job before it starts, so its AM is told to wait for the first directive;
    # an AM of a later attempt is given the latest directive again (its predecessor's is not its own).
    (tmp_path / "cluster.toml").write_text('[cluster]\nsecret = "test-secret-0123456789"\n')
    clock = FakeClock()
    for policy, places in (("static", False), ("harmony", True)):
        cfg, cluster = load_configs(parse_args(["--policy", policy, "--state-dir", str(tmp_path / policy),
                                                "--cluster-config", str(tmp_path / "cluster.toml"),
                                                "--am-expiry-s", "5"]))
        rm = ResourceManagerServer(cfg, cluster, clock=clock, run_timers=False)
        core = rm.core
        register(core, "n1:1", mem=16 * 1024, vcores=16)
        am = ScriptedAm(core, submit_ps(core, "A"), 4.0, 1.0)
        reply = core.am_register(am.claims, api.AmRegisterRequest())
        assert reply.policy_places_new_jobs is places
        if not places:
            continue
        run_policy(core, rm.policy)
        am.allocate()
        first = am.directive
        assert first is not None and first.run_state is RunState.RUN and first.nodes == ["n1:1"]
        am.allocate()
        assert am.seen == [first]                      # delivered once to this attempt
        clock.advance(6)                               # the AM stops heartbeating: a new attempt
        register(core, "n1:1", mem=16 * 1024, vcores=16)
        core.tick()
        assert len(core.apps[am.app_id].attempts) == 2
        second = ScriptedAm(core, am.app_id, 4.0, 1.0)
        second.allocate()
        assert second.seen and second.seen[0].version == first.version
