"""Capacity preemption by elastic shrink on the multi-host testbed (docs/preemption.md, docs/testbed.md).

Three node hosts of 2 vcores (1-vcore executors) and the master running the AMs (am_host). Queues:
a (45 %, max 100 %), b (45 %, max 100 %) and c (10 %, max 100 %, disable_preemption). Every test
builds its own testbed, started and stopped with bin/start-cluster / bin/stop-cluster.

- Queue a's elastic job holds the whole cluster (4 workers + 2 servers); a job arrives in queue b:
  the RM shrinks a's job by a directive (EPS remove, live), b's job gets its guarantee and trains,
  a's job keeps training and succeeds, every mini-batch applied exactly once (the AM's audit) and
  its objective within 1 % of the same job run unshrunk,
  no container is killed, and a's job gets exactly one reclaim directive (nothing oscillates).
- A plain YARN app (distributed shell) fills the cluster from the opted-out queue c: nothing is
  taken from it while b's job waits; the same app in queue a has its containers named in a
  preemption message and killed (PREEMPTED) after the grace period, and b's job runs.
"""
from __future__ import annotations

import json
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import pytest

from appmaster.distributed_shell import build_submission
from appmaster.ps.submission import build_ps_submission
from conftest import get_app, rest, submit_app, wait_app
from elastane_cli import testbed_hosts
from elastane_cli.testbed_cluster import TestbedCluster
from polling import wait_until

_reason = testbed_hosts.unavailable_reason(sshd=True)
pytestmark = [pytest.mark.cluster,
              pytest.mark.skipif(_reason is not None, reason=f"no multi-host testbed here: {_reason}")]

QUEUES = [{"name": "a", "capacity": 45.0, "max_capacity": 100.0},
          {"name": "b", "capacity": 45.0, "max_capacity": 100.0},
          {"name": "c", "capacity": 10.0, "max_capacity": 100.0, "disable_preemption": True}]
RM_CONF = {"preemption": "shrink", "preemption_natural_termination_factor": 1.0,
           "preemption_max_wait_before_kill_s": 8.0, "preemption_hold_rounds": 60}
# A's job must still train when b's arrives and its shrink lands: at the tiny preset's 4,000 rows its
# 60 epochs took 2.5 s on a quiet machine and ended before b's AM started (the room came from its
# end, not a shrink). Ten times the rows make an epoch ~0.4 s at 4 workers (bench/queue_reclaim.py's
# default), so the run outlasts b's start by tens of seconds even on a quiet host.
A_SPEC: dict[str, Any] = {"app": "mlr", "workers": 4, "servers": 2, "min_workers": 1, "min_servers": 1,
                          "max_epochs": 60, "convergence_threshold": 1e-12, "checkpoint_every_epochs": 0,
                          "hparams": {"learning_rate": 0.5}, "executor_memory_mb": 320, "audit_updates": True,
                          "data": {"num_samples": 40_000}}
B_SPEC: dict[str, Any] = {"app": "mlr", "workers": 2, "servers": 1, "max_epochs": 2, "convergence_threshold": 1e-12,
                          "executor_memory_mb": 320}


@contextmanager
def reclaim_testbed(base: Path) -> Iterator[TestbedCluster]:
    # Liveness timeouts for a loaded 2-core host: an AM that starts slowly must not expire first.
    c = TestbedCluster(base, workers=3, node_memory_mb=1024, node_vcores=2, am_host=True, queues=QUEUES,
                       rm_conf=RM_CONF, nm_expiry_s=30.0, am_expiry_s=60.0)
    c.start()
    try:
        yield c
    finally:
        c.stop()
    assert c.stop_returncode == 0, c.stop_output
    assert c.leftovers == {}, c.stop_report()


def submit_ps(c: TestbedCluster, spec: dict[str, Any], name: str, queue: str) -> str:
    return submit_app(c.rm_url, build_ps_submission(spec, name=name, queue=queue, am_memory=384))


def queue_info(c: TestbedCluster) -> dict[str, dict[str, Any]]:
    info = rest(c.rm_url, "GET", "/ws/v1/cluster/scheduler")["scheduler"]["schedulerInfo"]
    return {q["queueName"]: q for q in info["queues"]["queue"]}


def training(c: TestbedCluster, app_id: str, workers: int, servers: int) -> bool:
    """The RM's record of the job: it runs and holds its AM and this many executors."""
    app = get_app(c.rm_url, app_id)
    return app["state"] == "RUNNING" and app["runningContainers"] == 1 + workers + servers


def policy_rounds(c: TestbedCluster) -> int:
    with urllib.request.urlopen(c.rm_url + "/metrics/prometheus", timeout=5) as r:
        text = r.read().decode()
    return sum(int(float(line.rsplit(" ", 1)[1])) for line in text.splitlines()
               if line.startswith("elastane_rm_policy_rounds_total"))


def final_objective(c: TestbedCluster, app_id: str) -> float:
    """A's final objective from its AM's last status, after checking it trained every epoch and
    applied every mini-batch it ran exactly once (the AM's audit, across the shrink's moves)."""
    st = c.final_status(app_id)
    assert [h.epoch for h in st.objective_history] == list(range(A_SPEC["max_epochs"]))
    eps = st.eps
    assert eps is not None and eps.audit_mismatches == [] and eps.minibatches_applied == eps.minibatches_run > 0, eps
    objective = st.objective_history[-1].objective
    assert objective is not None, st.objective_history      # finite
    return objective


def post_mortem(c: TestbedCluster, *app_ids: str) -> str:
    """What the RM says of the apps and queues, and its log's tail."""
    out = []
    for app_id in app_ids:
        try:
            app = get_app(c.rm_url, app_id)
            shape = rest(c.rm_url, "GET", f"/ws/v1/cluster/apps/{app_id}/shape")["shape"]
            out.append(f"{app_id}: {app['state']} containers={app['runningContainers']} "
                       f"preempted={app['numNonAMContainerPreempted']} diagnostics={app['diagnostics']!r} "
                       f"directive={shape.get('directive')} current={shape.get('current')}")
        except Exception as e:  # noqa: BLE001 - the RM may be what failed
            out.append(f"{app_id}: no report ({e})")
    try:
        out.append(json.dumps({k: {x: q.get(x) for x in ("resourcesUsed", "idealResource", "pendingResource",
                                                         "beingReclaimed", "numContainersShrunk")}
                               for k, q in queue_info(c).items()}))
    except Exception as e:  # noqa: BLE001
        out.append(f"no scheduler info ({e})")
    return "\n".join(out) + "\n" + c.logs(30)


# Two 60-epoch runs of a's job (shrunk, then undisturbed): on a loaded 2-core machine with the
# suite's other worker busy too they outlast the suite's 300 s default (which only bounds a hang).
@pytest.mark.timeout(900)
def test_elastic_jobs_shrink_live_for_another_queue_and_lose_nothing(tmp_path: Path) -> None:
    with reclaim_testbed(tmp_path / "c") as c:
        a = submit_ps(c, A_SPEC, "a-grown", "a")
        try:
            _shrink_scenario(c, a)
        except BaseException as e:
            e.add_note(post_mortem(c, *[x["id"] for x in (rest(c.rm_url, "GET", "/ws/v1/cluster/apps")["apps"]
                                                          or {}).get("app", [])]))
            raise


def _shrink_scenario(c: TestbedCluster, a: str) -> None:
    wait_until(lambda: training(c, a, 4, 2), 180, "a's job training on the whole cluster")
    b = submit_ps(c, B_SPEC, "b-arrives", "b")
    # b's guarantee (45 % of 6 vcores, its job asks 3) comes back: a's job shrinks by 3 executors.
    wait_until(lambda: training(c, b, 2, 1), 180, "b's job holding its guarantee")
    # The reclaim counts the shrink done at its next round, once the RM sees the executors gone.
    app_a = wait_until(lambda: (x := get_app(c.rm_url, a))["numNonAMContainerPreempted"] == 3 and x, 30,
                       "a's shrink counted")
    assert app_a["numAMContainerPreempted"] == 0, app_a
    assert "shrunk from 4 workers + 2 servers to 1 + 2" in app_a["diagnostics"], app_a["diagnostics"]
    wait_app(c.rm_url, b, ("FINISHED",), 300)
    done = wait_app(c.rm_url, a, ("FINISHED",), 600)
    assert done["finalStatus"] == "SUCCEEDED", done["diagnostics"]
    q = queue_info(c)
    assert q["a"]["numContainersShrunk"] == 3 and q["a"]["numContainersKilledByPreemption"] == 0, q["a"]
    reclaims = [d for d in rest(c.rm_url, "GET", f"/ws/v1/cluster/apps/{a}/shape")["shape"]["decisions"]
                if d["reason"].startswith("queue reclaim")]
    assert len(reclaims) == 1, reclaims         # one shrink, never regrown and shrunk again
    shrunk = final_objective(c, a)
    # The same job undisturbed.
    ref = submit_ps(c, A_SPEC, "a-undisturbed", "a")
    assert wait_app(c.rm_url, ref, ("FINISHED",), 600)["finalStatus"] == "SUCCEEDED"
    expected = final_objective(c, ref)
    assert abs(shrunk - expected) <= 0.01 * abs(expected), (shrunk, expected)


def test_a_plain_app_is_killed_after_the_grace_period_unless_its_queue_opted_out(tmp_path: Path) -> None:
    with reclaim_testbed(tmp_path / "c") as c:
        shell = ["sh", "-c", "sleep 600"]
        opted = submit_app(c.rm_url, build_submission("fills-c", shell, 6, 256, 1, queue="c", am_memory=256))
        wait_until(lambda: get_app(c.rm_url, opted)["runningContainers"] == 7, 120, "c's app holding the cluster")
        b = submit_ps(c, B_SPEC, "b-waits", "b")
        seen = policy_rounds(c)
        wait_until(lambda: policy_rounds(c) >= seen + 10, 60, "ten policy rounds")
        assert get_app(c.rm_url, b)["state"] == "ACCEPTED"          # c opted out: b's job waits
        assert get_app(c.rm_url, opted)["numNonAMContainerPreempted"] == 0
        assert queue_info(c)["c"]["preemptionDisabled"] is True
        rest(c.rm_url, "PUT", f"/ws/v1/cluster/apps/{opted}/state", {"state": "KILLED"}, user="alice")
        wait_app(c.rm_url, b, ("FINISHED",), 300)
        # The same plain app in queue a is warned, then its latest containers are killed.
        plain = submit_app(c.rm_url, build_submission("fills-a", shell, 6, 256, 1, queue="a", am_memory=256))
        wait_until(lambda: get_app(c.rm_url, plain)["runningContainers"] == 7, 120, "a's app holding the cluster")
        b2 = submit_ps(c, B_SPEC, "b-again", "b")
        wait_until(lambda: training(c, b2, 2, 1), 180, "b's second job holding its guarantee")
        app = wait_until(lambda: (x := get_app(c.rm_url, plain))["numNonAMContainerPreempted"] == 3 and x, 30,
                         "the kill counted")
        assert "killed for another queue" in app["diagnostics"], app["diagnostics"]
        assert "told to give back 3 containers" in app["diagnostics"]
        rest(c.rm_url, "PUT", f"/ws/v1/cluster/apps/{plain}/state", {"state": "KILLED"}, user="alice")
        wait_app(c.rm_url, b2, ("FINISHED",), 300)
