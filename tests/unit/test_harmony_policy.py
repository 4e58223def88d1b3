"""The pure `harmony` policy in a scripted world (tests/support/harmony_world.py): AMs that obey every
directive at once and report the COMP / COMM times of their true profiles."""
from __future__ import annotations

from protocol.internal_api import NodePlacement, RunState
from protocol.records import Resource
from rm.policies import HarmonyPolicy, create
from rm.policies.harmony import HarmonyConfig

from harmony_world import AM, World


def states(policy: HarmonyPolicy) -> dict[str, tuple[str, object]]:
    return {a: (v["state"], v["group"]) for a, v in policy.describe().items()}


def four_jobs() -> tuple[World, HarmonyPolicy]:
    w, p = World(4), HarmonyPolicy()
    w.submit("a", 8.0, 1.0)      # COMP-heavy
    w.submit("b", 1.0, 1.8)      # COMM-heavy
    w.submit("c", 6.0, 0.6)      # COMP-heavy
    w.submit("d", 0.8, 2.0)      # COMM-heavy
    return w, p


def test_harmony_is_registered():
    assert isinstance(create("harmony"), HarmonyPolicy)


def test_new_jobs_are_profiled_alone_on_a_node_each_then_grouped():
    w, p = four_jobs()
    d = w.step(p)
    assert {a: s for a, (s, _) in states(p).items()} == dict.fromkeys("abcd", "profiling")
    # One worker and one server each, on a node of its own, no group yet; the spec's executor.
    assert sorted(jd.nodes[0] for jd in d.jobs.values()) == ["n1", "n2", "n3", "n4"]
    assert all((jd.workers, jd.servers, jd.group, jd.run_state) == (1, 1, None, RunState.RUN) for jd in d.jobs.values())
    assert all(jd.executor_resource == Resource(1024, 1) for jd in d.jobs.values())
    assert "profiling" in d.jobs["a"].reason

    d = w.step(p)                                   # every report now has timings
    st = states(p)
    running = {a for a, (s, _) in st.items() if s == "running"}
    assert running and {s for s, _ in st.values()} <= {"running", "paused"}
    for a, (s, g) in st.items():
        jd = d.jobs[a]
        if s == "paused":
            assert (jd.workers, jd.servers, jd.placement, jd.run_state) == (0, 0, (), RunState.PAUSE)
            continue
        # A grouped job runs a worker and a server on EVERY node of its group.
        members = [x for x, (_, gx) in st.items() if gx == g]
        assert jd.group == g and jd.run_state is RunState.RUN
        assert all((pl.workers, pl.servers) == (1, 1) for pl in jd.placement)
        assert all(d.jobs[x].nodes == jd.nodes for x in members)
        # The group's containers and the AMs' room fit every node of the group.
        size = jd.executor_resource
        assert size is not None
        per_node = size.scale(2 * len(members)) + AM.scale(1)
        assert per_node.fits_in(Resource(16384, 16))
    # Groups hold every node, each node once.
    nodes = [n for g in {g for s, g in st.values() if s == "running"} for n in
             next(d.jobs[a].nodes for a, (_, ga) in st.items() if ga == g)]
    assert sorted(nodes) == ["n1", "n2", "n3", "n4"]


def test_a_grouped_job_keeps_its_profiling_size_while_it_fits_and_shrinks_when_not():
    # A new size means new containers, i.e. a checkpoint-restart; on roomy nodes a job enters its
    # group with the executors it was profiled with. On nodes that cannot hold the group at that
    # size, its containers shrink to the group's share.
    w, p = four_jobs()
    w.step(p)
    d = w.step(p)
    grouped = [jd for jd in d.jobs.values() if jd.group is not None]
    assert grouped and all(jd.executor_resource == Resource(1024, 1) for jd in grouped)

    w, p = World(2, mem=2048, vcores=8), HarmonyPolicy()
    for app_id, (cpu, net) in {"a": (8.0, 1.0), "b": (1.0, 1.8)}.items():
        w.submit(app_id, cpu, net)
    w.step(p)
    d = w.step(p)
    grouped = [jd for jd in d.jobs.values() if jd.group is not None]
    assert grouped
    for jd in grouped:
        members = sum(x.group == jd.group for x in d.jobs.values())
        assert jd.executor_resource is not None and jd.executor_resource.memory < 1024
        assert (jd.executor_resource.scale(2 * members) + AM.scale(1)).fits_in(Resource(2048, 8))


def test_groups_fit_beside_the_ams_the_scheduler_packed_on_one_node():
    # Found on a real cluster: every AM on one node, containers sized as if AMs were spread evenly,
    # and a grouped job's resume waited until its partner finished for room the AMs held.
    w, p = World(2, mem=2048, vcores=8), HarmonyPolicy()
    for app_id, (cpu, net) in {"a": (8.0, 1.0), "b": (1.0, 1.8), "c": (6.0, 0.6)}.items():
        w.submit(app_id, cpu, net).am_node = "n1"
    for _ in range(4):
        d = w.step(p)
    used = {n.node_id: AM.scale(sum(a.am_node == n.node_id for a in w.apps.values())) for n in w.nodes}
    for jd in d.jobs.values():
        for pl in jd.placement:
            assert jd.executor_resource is not None
            used[pl.node] = used[pl.node] + jd.executor_resource.scale(pl.workers + pl.servers)
    assert any(jd.placement for jd in d.jobs.values())
    assert all(u.fits_in(Resource(2048, 8)) for u in used.values()), used


def test_a_new_job_is_profiled_on_the_free_node_with_room_beside_the_ams():
    w, p = World(3, mem=2048, vcores=8), HarmonyPolicy()
    for app_id in ("a", "b"):
        w.submit(app_id, 4.0, 1.0).am_node = "n1"      # n1 holds both AMs
    d = w.step(p)
    assert sorted(jd.nodes[0] for jd in d.jobs.values()) == ["n2", "n3"]


def test_a_profiled_arrival_waits_behind_a_paused_job_and_replaces_a_similar_finished_one():
    w, p = four_jobs()
    w.step(p)
    w.step(p)
    assert states(p)["d"] == ("paused", None)        # the initial grouping left d out
    # e arrives: it borrows a node of the group to be profiled on ...
    w.submit("e", 7.9, 1.0)                          # like a (8, 1) within 5 %
    w.step(p)
    assert states(p)["e"] == ("profiling", None)
    # The group's executors were on that node when e got it: its first report is not its own.
    w.step(p)
    assert states(p)["e"] == ("profiling", None)
    # ... and, profiled alone, waits: d already waits (no group is reshuffled for it).
    w.step(p)
    assert states(p)["e"] == ("paused", None)
    assert "waits" in w.apps["e"].directive.reason
    # a finishes: e, similar within 5 %, takes its place in a's group and is resumed there.
    group_a = states(p)["a"][1]
    w.finish("a")
    w.step(p)
    assert states(p)["e"] == ("running", group_a)
    resumed = w.apps["e"].directive
    assert resumed.run_state is RunState.RESUME and resumed.group == group_a
    assert resumed.nodes == w.apps["b"].directive.nodes or resumed.nodes == w.apps["c"].directive.nodes
    assert [dv.run_state for dv in w.apps["e"].history] == [RunState.RUN, RunState.PAUSE, RunState.RESUME]
    assert states(p)["d"] == ("paused", None)


def test_no_regrouping_for_under_five_percent_gain():
    w, p = World(4), HarmonyPolicy()
    for name, c, n in [("a", 6.3, 1.4), ("b", 3.0, 2.2), ("c", 3.0, 0.9), ("d", 8.9, 0.6)]:
        w.submit(name, c, n)
    for _ in range(3):
        w.step(p)
    before = {a: app.directive for a, app in w.apps.items()}
    w.finish("d")
    w.step(p)
    # Regrouping a, b, c would raise U by 4.9 %: they keep their group, nodes and directives.
    notes = {a: v["note"] for a, v in p.describe().items()}
    assert all("kept" in notes[a] and "< 5% gain" in notes[a] for a in "abc")
    assert all(w.apps[a].directive == before[a] for a in "abc")


def test_a_finished_job_frees_its_groups_nodes_for_the_others():
    w, p = World(3), HarmonyPolicy()
    for name, c, n in [("a", 8.0, 2.0), ("b", 2.0, 4.0), ("x", 0.3, 0.2)]:
        w.submit(name, c, n)
    for _ in range(3):
        w.step(p)
    assert states(p)["x"][0] == "running" and states(p)["x"][1] != states(p)["a"][1]
    w.finish("x")
    w.step(p)
    # x's group is gone; its node went to the remaining group (moved: RUN with the new placement).
    assert w.apps["a"].directive.nodes == ["n1", "n2", "n3"] == w.apps["b"].directive.nodes
    assert w.apps["a"].directive.run_state is RunState.RUN
    assert "x" not in p.describe()


def test_a_lost_node_leaves_its_group_and_a_profiling_job_waits_again():
    w, p = four_jobs()
    w.step(p)
    w.nodes = w.nodes[:3]                            # n4, where d is being profiled, is lost
    w.step(p)
    # a, b, c are profiled and grouped on n1-n3; d went back to waiting and is profiled again on a
    # node borrowed from that group.
    assert states(p)["d"] == ("profiling", None)
    assert w.apps["d"].directive.nodes[0] in ("n1", "n2", "n3")
    w.step(p)
    grouped = [a for a, (s, _) in states(p).items() if s == "running"]
    assert grouped
    w.nodes = w.nodes[:2]                            # n3 is lost too: groups keep n1, n2 only
    w.step(p)
    assert all(set(w.apps[a].directive.nodes) <= {"n1", "n2"} for a in grouped if states(p)[a][0] == "running")


def test_reports_from_before_the_latest_directive_are_not_profiled():
    w, p = World(1), HarmonyPolicy()
    app = w.submit("a", 4.0, 1.0)
    w.step(p)
    # The AM has not acted on its profiling directive yet: its timings describe another shape.
    app.directive = app.directive.__class__(**{**{f: getattr(app.directive, f) for f in
                                                  app.directive.__struct_fields__}, "version": 5})
    real = app.report

    def stale():
        r = real()
        return r.__class__(**{**{f: getattr(r, f) for f in r.__struct_fields__}, "directive_version": 4})
    app.report = stale      # type: ignore[method-assign]
    w.step(p)
    assert states(p)["a"] == ("profiling", None)
    app.report = real       # type: ignore[method-assign]
    w.step(p)
    assert states(p)["a"][0] == "running"


def test_groups_are_capped_so_every_container_gets_a_vcore():
    # 6-vcore nodes with one AM's room each: 5 vcores, 2 containers per job -> 2 jobs a group.
    w, p = World(2, mem=16384, vcores=6), HarmonyPolicy(HarmonyConfig())
    for i in range(6):
        w.submit(f"j{i}", 4.0 if i % 2 else 0.5, 0.5 if i % 2 else 2.0)
    for _ in range(8):
        w.step(p)
    groups: dict[object, int] = {}
    for s, g in states(p).values():
        if s == "running":
            groups[g] = groups.get(g, 0) + 1
    assert groups and max(groups.values()) <= 2


def test_invariants_hold_through_arrivals_completions_and_node_changes():
    # A seeded churn of jobs and nodes; after every round: each node serves one group or one
    # profiling job at most, a grouped job is placed on exactly its group's nodes, the lifecycle
    # and the run states agree, and no group holds more jobs than its containers allow.
    import random
    rng = random.Random(3)
    w, p = World(6, mem=16384, vcores=8), HarmonyPolicy()
    names = iter(f"j{i:02d}" for i in range(100))
    for _ in range(5):
        w.submit(next(names), rng.uniform(0.5, 12.0), rng.uniform(0.2, 3.0))
    for step in range(60):
        event = rng.random()
        live = [a for a, app in w.apps.items() if app.state == "RUNNING"]
        if event < 0.25:
            w.submit(next(names), rng.uniform(0.5, 12.0), rng.uniform(0.2, 3.0))
        elif event < 0.45 and live:
            w.finish(rng.choice(live))
        elif event < 0.5 and len(w.nodes) > 3:
            w.nodes = w.nodes[:-1]
        elif event < 0.55:
            w.nodes.append(w.nodes[0].__class__(f"m{step}", "/r", "RUNNING", Resource(16384, 8),
                                                w.nodes[0].used))
        decision = w.step(p)
        alive = {n.node_id for n in w.nodes}
        owner: dict[str, str] = {}
        for a, v in p.describe().items():
            jd = decision.jobs[a]
            key = v["group"] or a
            if v["state"] in ("running", "profiling", "profiled"):
                assert jd.run_state is not RunState.PAUSE and jd.nodes and set(jd.nodes) <= alive
                for n in jd.nodes:
                    assert owner.setdefault(n, key) == key, f"{n} serves {owner[n]} and {key}"
                assert (jd.group is not None) == (v["state"] == "running")
            else:
                assert (jd.run_state, jd.workers, jd.group) == (RunState.PAUSE, 0, None)
        groups: dict[object, list[str]] = {}
        for a, v in p.describe().items():
            if v["state"] == "running":
                groups.setdefault(v["group"], []).append(a)
        for members in groups.values():
            assert len({tuple(decision.jobs[a].nodes) for a in members}) == 1
            assert len(members) <= 3            # (8 vcores - the AMs' room) / 2 containers per job


# ----- profiles as the paper takes them -------------------------------------------------------------------------
def test_a_profile_is_the_time_subtasks_held_their_grants_not_the_time_they_waited():
    w, p = World(1), HarmonyPolicy()
    w.submit("a", 4.0, 1.0).wait_s = 3.0            # e.g. queued behind a partner's COMPs
    w.step(p)
    w.step(p)
    d = p.describe()["a"]
    assert (d["tCpu1"], d["tNet"]) == (4.0, 1.0)


def test_whole_times_without_held_ones_are_profiled_only_while_the_job_runs_alone():
    w, p = World(2), HarmonyPolicy()
    a = w.submit("a", 4.0, 1.0)
    b = w.submit("b", 1.0, 4.0)
    a.held = b.held = False                          # AMs that report whole times only
    for _ in range(3):
        w.step(p)
    assert states(p)["a"][0] == states(p)["b"][0] == "running" and states(p)["a"][1] == states(p)["b"][1]
    assert p.describe()["a"]["tCpu1"] == 4.0
    # Grouped, a's whole COMP time now counts the waits behind b's COMPs: not a's profile.
    a.wait_s = 2.0
    for _ in range(3):
        w.step(p)
    assert p.describe()["a"]["tCpu1"] == 4.0
    # With held times it is the job's own again, and the moving average follows them.
    a.held, a.t_cpu1 = True, 6.0
    w.step(p)
    assert 4.0 < p.describe()["a"]["tCpu1"] < 6.0


def test_no_profile_is_taken_while_another_jobs_executors_share_the_node():
    w, p = World(2), HarmonyPolicy()
    w.submit("a", 4.0, 1.0)
    x = w.submit("x", 1.0, 1.0)
    x.state = "ACCEPTED"                 # not tracked yet, but its executors are on n1 (lingering)
    x.lingering = (NodePlacement(node="n1", workers=1, servers=0),)
    w.apps["x"] = x
    d = w.step(p)
    node = d.jobs["a"].nodes[0]
    x.state = "RUNNING"
    x.lingering = (NodePlacement(node=node, workers=1, servers=0),)
    for _ in range(3):
        w.step(p)
        assert states(p)["a"][0] == "profiling"
    # x's executor leaves: a's times from then on are its own, after `profile_iterations`.
    x.lingering = ()
    w.step(p)
    assert states(p)["a"][0] == "profiling"
    w.step(p)
    assert p.describe()["a"]["profileSamples"] == 1


def test_jobs_profiled_in_the_same_round_arrive_in_turn_instead_of_all_waiting():
    w, p = World(4), HarmonyPolicy(HarmonyConfig(profiling_nodes=2))
    w.submit("a", 8.0, 1.0)
    w.submit("b", 1.0, 8.0)
    for _ in range(3):
        w.step(p)
    assert {s for s, _ in states(p).values()} == {"running"}
    w.submit("c", 8.0, 1.0)
    w.submit("d", 1.0, 8.0)
    for _ in range(2):
        w.step(p)
        assert states(p)["c"][0] == states(p)["d"][0] == "profiling"   # two nodes lent, both alone
    w.step(p)
    # Measured in the same round: c goes first, d after it sees where c went. Before, each saw the
    # other as a job "already waiting" and both were paused.
    assert states(p)["c"][0] == "running", w.apps["c"].directive.reason
    assert "wait before it" not in w.apps["d"].directive.reason


def test_describe_reports_profiling_and_regrouping_time_on_the_snapshots_clock():
    w, p = World(2), HarmonyPolicy()
    a = w.submit("a", 4.0, 1.0)
    w.step(p)                                        # t: profiling on a node of its own
    w.step(p)                                        # t + 1: measured and grouped (RUN)
    assert p.describe()["a"]["profilingS"] == 1.0
    assert p.describe()["a"]["moves"] == 1
    # Its AM takes two rounds to act on the directive that grouped it (migrating there).
    real = a.report
    version = a.directive.version

    def late():
        r = real()
        return r.__class__(**{**{f: getattr(r, f) for f in r.__struct_fields__}, "directive_version": version - 1})
    a.report = late      # type: ignore[method-assign]
    w.step(p)
    w.step(p)
    a.report = real      # type: ignore[method-assign]
    w.step(p)
    d = p.describe()["a"]
    assert d["regroupS"] == 2.0 and d["profilingS"] == 1.0 and d["pausedS"] == 0.0


def test_a_job_whose_node_never_clears_is_profiled_from_held_times_after_a_while():
    # On a real cluster an AM may start its executors before its directive, where the scheduler
    # put its AM: the node stays shared, and waiting for ever would hold up every grouping.
    w, p = World(2), HarmonyPolicy(HarmonyConfig(alone_wait_s=5.0))
    a = w.submit("a", 4.0, 1.0)
    d = w.step(p)
    other = w.submit("x", 1.0, 1.0)
    other.directive = d.jobs["a"].directive(1)          # x's executors sit on a's node for good
    other.lingering = (NodePlacement(node=d.jobs["a"].nodes[0], workers=1, servers=1),)
    a.wait_s = 3.0
    seen = []
    for _ in range(9):
        w.step(p)
        seen.append(p.describe()["a"]["profileSamples"])
    assert seen[:4] == [0, 0, 0, 0] and seen[-1] >= 1, seen
    assert p.describe()["a"]["tCpu1"] == 4.0          # its held time, not the wait beside x


def test_a_move_its_am_gave_up_on_is_retried_by_pausing_and_resuming_the_job_in_its_group():
    # A PS AM's move is all or nothing, new executors first: when two groups swap nodes both AMs
    # can time out and go on where they were, reporting steady. The policy must not count such a
    # job as placed in its group: it checkpoints it and resumes it on the group's nodes.
    w, p = four_jobs()
    p = HarmonyPolicy(HarmonyConfig(move_retry_s=3.0))
    w.step(p)
    w.step(p)
    st = states(p)
    job = next(a for a, (s, _) in sorted(st.items()) if s == "running")
    group = st[job][1]
    app = w.apps[job]
    group_nodes = set(app.directive.nodes)
    # Its executors stayed on one node of the old placement, not on the group's nodes.
    app.stuck = (NodePlacement(node=sorted(group_nodes)[0], workers=1, servers=1),)
    before = len(app.history)
    for _ in range(3):                                  # under move_retry_s: nothing happens
        w.step(p)
    assert states(p)[job] == ("running", group) and len(app.history) == before
    w.step(p)                                           # misplaced for move_retry_s: paused
    assert states(p)[job] == ("paused", group)
    assert app.directive.run_state is RunState.PAUSE and app.directive.workers == 0
    assert "failed" in p.describe()[job]["note"]
    app.stuck = None                                    # paused: its executors are released
    w.step(p)                                           # its AM has paused: resumed in its group
    assert states(p)[job] == ("running", group)
    assert app.directive.run_state is RunState.RESUME and set(app.directive.nodes) == group_nodes
    for _ in range(5):                                  # placed now: it stays
        w.step(p)
    assert states(p)[job] == ("running", group)


def test_a_job_paused_to_migrate_is_not_a_waiting_job_that_holds_up_arrivals():
    w, p = four_jobs()
    p = HarmonyPolicy(HarmonyConfig(move_retry_s=0.0))
    w.step(p)
    w.step(p)
    for a, (s, _) in states(p).items():
        if s == "paused":
            w.finish(a)                 # nothing waits but the job paused to migrate below
    job = next(a for a, (s, _) in sorted(states(p).items()) if s == "running")
    group = states(p)[job][1]
    app = w.apps[job]
    app.stuck = (NodePlacement(node="elsewhere", workers=1, servers=1),)
    w.step(p)
    w.step(p)
    assert states(p)[job] == ("paused", group)
    # Its AM takes a while to pause; a job arrives meanwhile and is profiled: the paused one is in
    # its group, not a job waiting before the arrival.
    real, version = app.report, app.directive.version

    def late():
        r = real()
        return r.__class__(**{**{f: getattr(r, f) for f in r.__struct_fields__}, "directive_version": version - 1})
    app.report = late      # type: ignore[method-assign]
    app.stuck = None
    w.submit("e", 4.0, 1.0)
    notes = []
    for _ in range(4):
        w.step(p)
        notes.append(p.describe()["e"]["note"])
    assert states(p)[job] == ("paused", group)
    assert not any("wait before it" in n for n in notes), notes
    app.report = real      # type: ignore[method-assign]
    w.step(p)
    assert states(p)[job][0] == "running"


def test_the_initial_grouping_waits_for_a_slow_profile_only_initial_wait_s():
    w = World(4)
    w.submit("a", 8.0, 1.0)
    w.submit("b", 1.0, 1.8)
    w.submit("slow", 0.0, 0.0)          # its reports have no timings yet: its profile takes long
    for wait, grouped_after in ((None, None), (4.0, 4)):
        w2 = World(4)
        for a in w.apps.values():
            w2.submit(a.app_id, a.t_cpu1, a.t_net)
        p = HarmonyPolicy(HarmonyConfig(initial_wait_s=wait))
        w2.step(p)
        w2.step(p)                      # a and b profiled
        seen = []
        for _ in range(6):
            w2.step(p)
            seen.append(any(s == "running" for s, _ in states(p).values()))
        if grouped_after is None:
            assert not any(seen)        # waits for every profile
        else:
            assert seen.index(True) + 1 == grouped_after, seen
            st = states(p)
            assert st["slow"] == ("profiling", None) and p.describe()["slow"]["node"] is not None


def test_a_job_its_am_cannot_place_is_paused_to_migrate_once_not_again_and_again():
    w, p = four_jobs()
    p = HarmonyPolicy(HarmonyConfig(move_retry_s=0.0))
    w.step(p)
    w.step(p)
    job = next(a for a, (s, _) in sorted(states(p).items()) if s == "running")
    w.apps[job].stuck = (NodePlacement(node="elsewhere", workers=1, servers=1),)   # for good
    seen = []
    for _ in range(12):
        w.step(p)
        seen.append(states(p)[job][0])
    assert seen.count("paused") == 1, seen
    assert seen[-1] == "running"


def test_a_grouped_job_whose_next_am_waits_on_the_am_limit_keeps_its_group_and_profile():
    """A new AM attempt held by the queue's AM limit for a round is not a finished job: the job
    keeps its group and profile (it was dropped, its group regrouped, and it was profiled from
    scratch when its AM came back)."""
    import dataclasses
    w, p = World(3), HarmonyPolicy()
    for name, c, n in [("a", 8.0, 2.0), ("b", 2.0, 4.0), ("x", 0.3, 0.2)]:
        w.submit(name, c, n)
    for _ in range(3):
        w.step(p)
    before = p.describe()["a"]
    assert before["state"] == "running" and before["group"] is not None
    snap = w.snapshot()
    p.decide(dataclasses.replace(snap, apps=tuple(dataclasses.replace(a, am_limited=a.app_id == "a") for a in snap.apps)))
    held = p.describe()["a"]
    assert (held["state"], held["group"]) == ("running", before["group"])
    assert held["profileSamples"] >= before["profileSamples"]
    w.step(p)
    back = p.describe()["a"]
    assert (back["state"], back["group"]) == ("running", before["group"])
