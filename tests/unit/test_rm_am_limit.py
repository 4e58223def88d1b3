"""The queue AM resource limit (YARN's maximum-am-resource-percent): pure gate, scheduler, core, REST view."""
from __future__ import annotations

import random

import pytest

from protocol import config as config_mod
from protocol import internal_api as api
from protocol.config import QueueConfig
from protocol.records import AppState, Resource
from rm.__main__ import load_configs, parse_args
from rm.am_limit import AM_LIMIT_DIAGNOSTICS, AmGate, am_resource_limit
from rm.rest_views import scheduler_info
from rm_testing import FakeClock, heartbeat, launch_and_register, make_core, register, submit

AM = Resource(1024, 1)


# ----- pure pieces ------------------------------------------------------------------------------

def full_pass_admit(g: AmGate, limit: Resource) -> tuple[list[str], list[str]]:
    """The oracle: every waiting app looked at on every call, in submission order (the gate before
    it looked only at what can have changed)."""
    g.limit = limit
    activated: list[str] = []
    newly_blocked: list[str] = []
    for app_id, (_, r) in sorted(g.pending.items(), key=lambda kv: kv[1][0]):
        if (g.used + r).fits_in(limit) or g.used == Resource(0, 0):
            g.used = g.used + r
            del g.pending[app_id]
            g.blocked.discard(app_id)
            activated.append(app_id)
        elif app_id not in g.blocked:
            g.blocked.add(app_id)
            newly_blocked.append(app_id)
    return activated, newly_blocked


@pytest.mark.parametrize("seed", range(40))
def test_the_gate_admits_exactly_what_a_full_pass_over_every_waiting_app_would(seed: int) -> None:
    """Random adds (out of order, re-adds with another size), drops, charges, uncharges and limits:
    the gate's answers, and its state after each, equal the full pass's."""
    rnd = random.Random(seed)
    fast, slow = AmGate(0.5), AmGate(0.5)
    active: list[Resource] = []
    seq = 0
    for _ in range(300):
        op = rnd.random()
        if op < 0.45:
            seq += 1
            app = f"app{rnd.randrange(60)}"
            r = Resource(rnd.choice([256, 512, 1024, 2048]), rnd.choice([1, 1, 2]))
            s_ = seq if rnd.random() < 0.8 else rnd.randrange(1, seq + 1)     # some arrive out of order
            fast.add(app, s_, r)
            slow.add(app, s_, r)
        elif op < 0.55:
            app = f"app{rnd.randrange(60)}"
            fast.drop(app)
            slow.drop(app)
        elif op < 0.65 and active:
            r = active.pop(rnd.randrange(len(active)))
            fast.uncharge(r)
            slow.uncharge(r)
        elif op < 0.7:
            r = Resource(rnd.choice([256, 512]), 1)      # an AM moved in from another queue
            active.append(r)
            fast.charge(r)
            slow.charge(r)
        limit = Resource(rnd.choice([2048, 3072, 4096, 8192]), rnd.choice([2, 3, 4, 8])) \
            if rnd.random() < 0.1 else slow.limit or Resource(4096, 4)
        waiting = dict(slow.pending)
        got, want = fast.admit(limit), full_pass_admit(slow, limit)
        assert got == want
        assert (fast.used, fast.pending, fast.blocked) == (slow.used, slow.pending, slow.blocked)
        active.extend(waiting[a][1] for a in want[0])     # their AMs, given back later


def test_admitting_thousands_of_waiting_apps_one_by_one_looks_at_each_once() -> None:
    """A new RM's recovery adds every waiting app and admits after each: with a full queue the
    gate looks at the new app only (a full pass per call was quadratic: 19 s for 5,000 apps)."""
    g = AmGate(0.1)
    looked = 0
    real_pending = g.pending

    class Counting(dict):     # counts the waiting apps' entries admit reads, however it reads them
        def __getitem__(self, k):   # type: ignore[no-untyped-def]
            nonlocal looked
            looked += 1
            return dict.__getitem__(self, k)

        def __iter__(self):     # type: ignore[no-untyped-def]
            nonlocal looked
            for k in dict.__iter__(self):
                looked += 1
                yield k

        def items(self):        # type: ignore[no-untyped-def]
            nonlocal looked
            for kv in dict.items(self):
                looked += 1
                yield kv
    g.pending = Counting(real_pending)
    for i in range(2000):
        g.add(f"app{i}", i, AM)
        g.admit(Resource(1024, 1))
    assert len(g.pending) == 1999 and g.used == AM
    assert looked <= 3 * 2000, looked

def test_limit_is_fraction_of_queue_capacity_rounded_up():
    total = Resource(6144, 6)
    assert am_resource_limit(total, 100.0, 0.5, 32) == Resource(3072, 3)
    # 10% of 6 vcores is 0.6: rounded up to one whole core; memory to the minimum allocation.
    assert am_resource_limit(total, 100.0, 0.1, 128) == Resource(640, 1)
    assert am_resource_limit(total, 50.0, 0.5, 32) == Resource(1536, 2)
    assert am_resource_limit(Resource(0, 0), 100.0, 0.5, 32) == Resource(0, 0)


def test_gate_admits_in_submission_order_and_always_one():
    g = AmGate(0.1)
    g.add("b", 2, AM)
    g.add("a", 1, AM)
    # A limit smaller than one AM still lets the first app in (YARN: at least one AM per queue).
    activated, blocked = g.admit(Resource(512, 1))
    assert activated == ["a"] and blocked == ["b"] and g.used == AM
    # Told once: admitting again does not repeat the diagnostics.
    assert g.admit(Resource(512, 1)) == ([], [])
    g.uncharge(AM)
    assert g.admit(Resource(512, 1)) == (["b"], []) and not g.pending and not g.blocked


def test_gate_skips_a_big_am_for_a_smaller_one_behind_it():
    g = AmGate(0.5)
    g.charge(AM)
    g.add("big", 1, Resource(4096, 1))
    g.add("small", 2, AM)
    activated, blocked = g.admit(Resource(2048, 2))
    assert activated == ["small"] and blocked == ["big"]


# ----- in the core ------------------------------------------------------------------------------

def _am_count(core) -> int:
    return sum(1 for c in core.containers.values() if c.is_am)


def test_second_am_waits_for_the_queue_limit_with_yarn_diagnostics():
    core = make_core(max_am_resource_percent=0.25)
    register(core, "n1:1", mem=4096, vcores=4)       # AM limit: 1024 MB, 1 vcore = one AM
    a = submit(core)
    b = submit(core)
    assert _am_count(core) == 1
    app_b = core.apps[b]
    assert app_b.state == AppState.ACCEPTED and app_b.diagnostics.startswith(AM_LIMIT_DIAGNOSTICS)
    assert "Queue Resource Limit for AM = <memory:1024, vCores:1>" in app_b.diagnostics
    assert core.scheduler.apps[b].am_request is not None and not core.scheduler.apps[b].am_active
    # Room on the node is not enough: heartbeats do not start B's AM.
    heartbeat(core, "n1:1")
    assert _am_count(core) == 1

    q = scheduler_info(core)["scheduler"]["schedulerInfo"]["queues"]["queue"][0]
    assert q["AMResourceLimit"] == {"memory": 1024, "vCores": 1}
    assert q["usedAMResource"] == {"memory": 1024, "vCores": 1}
    assert (q["numActiveApplications"], q["numPendingApplications"]) == (1, 1)

    # A finishes and its AM container exits: B is activated and gets its AM at once.
    claims = launch_and_register(core, a)
    core.am_finish(claims, api.AmFinishRequest(final_status="SUCCEEDED"))
    am_cid = core.attempts[claims["attempt_id"]].am_container_id
    heartbeat(core, "n1:1", [api.ContainerStatus(container_id=am_cid, state="COMPLETE", exit_status=0)])
    assert any(c.app_id == b and c.is_am for c in core.containers.values())
    assert core.apps[b].diagnostics == ""
    q = scheduler_info(core)["scheduler"]["schedulerInfo"]["queues"]["queue"][0]
    assert q["usedAMResource"] == {"memory": 1024, "vCores": 1} and q["numPendingApplications"] == 0


def test_killing_a_waiting_app_gives_back_nothing_it_did_not_hold():
    core = make_core(max_am_resource_percent=0.25)
    register(core, "n1:1", mem=4096, vcores=4)
    a = submit(core)
    b = submit(core)
    c = submit(core)
    core.kill(b)
    q = core.scheduler.queues["default"]
    assert q.am.used == AM and set(q.am.pending) == {c}
    # Killing the active one activates the next waiting app (after its NM frees the node).
    core.kill(a)
    assert core.scheduler.apps[c].am_active and q.am.used == AM


def test_limit_grows_with_the_cluster():
    core = make_core(max_am_resource_percent=0.5)
    a = submit(core)
    b = submit(core)          # no nodes yet: only the first app is activated
    assert core.scheduler.apps[a].am_active and not core.scheduler.apps[b].am_active
    register(core, "n1:1", mem=4096, vcores=4)   # limit now 2048 MB / 2 vcores
    assert _am_count(core) == 2 and core.apps[b].diagnostics == ""


def test_per_queue_override():
    queues = [QueueConfig("small", capacity=50.0, max_am_resource_percent=0.1),
              QueueConfig("big", capacity=50.0, max_am_resource_percent=1.0)]
    core = make_core(queues=queues, max_am_resource_percent=0.1)
    register(core, "n1:1", mem=8192, vcores=8)
    for _ in range(3):
        submit(core, queue="small")
        submit(core, queue="big")
    by_queue = {"small": 0, "big": 0}
    for c in core.containers.values():
        by_queue[core.apps[c.app_id].queue] += 1
    assert by_queue == {"small": 1, "big": 3}


def test_failed_attempt_is_activated_again():
    clock = FakeClock()
    core = make_core(clock, max_am_resource_percent=0.25, am_expiry_s=10.0, nm_expiry_s=10**6)
    register(core, "n1:1", mem=4096, vcores=4)
    a = submit(core, max_attempts=2)
    b = submit(core)
    launch_and_register(core, a)
    clock.advance(11)
    heartbeat(core, "n1:1")                   # the node lives: A's AM itself stopped
    core.tick()                               # A's AM times out: attempt 2 queues behind B
    assert len(core.apps[a].attempts) == 2
    # A's old AM no longer counts against the queue, so B (first in line) is activated; the node's
    # next heartbeat places its AM.
    assert core.scheduler.apps[b].am_active
    heartbeat(core, "n1:1")
    assert _am_count(core) == 1 and any(c.app_id == b and c.is_am for c in core.containers.values())
    assert not core.scheduler.apps[a].am_active
    assert core.apps[a].diagnostics.startswith(AM_LIMIT_DIAGNOSTICS)


@pytest.mark.parametrize("text,needle", [
    ("[rm]\nmax_am_resource_percent = 0.0\n", "max_am_resource_percent must be a fraction"),
    ("[rm]\nmax_am_resource_percent = 50\n", "max_am_resource_percent must be a fraction"),
    ('[[queues]]\nname = "q"\nmax_am_resource_percent = 1.5\n', "queue 'q': max_am_resource_percent"),
])
def test_bad_fraction_is_a_config_error(tmp_path, text, needle):
    (tmp_path / "rm.toml").write_text(text)
    (tmp_path / "cluster.toml").write_text('[cluster]\nsecret = "s"\n')
    with pytest.raises(config_mod.ConfigError, match=needle.replace("(", r"\(")):
        load_configs(parse_args(["--config", str(tmp_path / "rm.toml"),
                                 "--cluster-config", str(tmp_path / "cluster.toml")]))
