"""The AM library against an in-test fake RM and NM (real HTTP, no cluster processes)."""
import asyncio

import pytest

from appmaster.am_client import AmError, ApplicationMaster, HeartbeatPolicy
from appmaster.am_events import ContainersAllocated, ContainersCompleted, NodesUpdated, ShapeChanged, Shutdown
from appmaster.container_book import AmContainerState
from appmaster.rm_client import AmEnvironmentError, AmIdentity
from protocol import container_env
from protocol.internal_api import ContainerStatus, LaunchContext, NodeReport, ShapeDirective
from polling import async_wait_until
from protocol.job_report import JobReport
from protocol.records import FinalStatus, Resource

R = Resource(256, 1)


async def make_am(fake, **kw) -> ApplicationMaster:
    am = ApplicationMaster(AmIdentity.from_env(fake.env), **kw)
    await am.register("amhost", 1234, "http://amhost:1234/", start_heartbeats=False)
    return am


async def drain(am: ApplicationMaster) -> list:
    out = []
    while (ev := await am.next_event(timeout_s=0)) is not None:
        out.append(ev)
    return out


async def test_register_ask_allocate_launch_complete_finish(fake_cluster):
    rm, nm = fake_cluster.rm, fake_cluster.nm
    am = await make_am(fake_cluster)
    try:
        assert rm.registered.host == "amhost" and rm.registered.rpc_port == 1234
        assert am.registration.app_id == "application_1_0001"
        ask = am.add_ask(2, R, tag="worker")
        am.set_progress(0.25)
        await am.heartbeat_once()
        sent = rm.requests[-1]
        assert [(a.ask_id, a.count, a.tag) for a in sent.asks] == [(ask, 2, "worker")]
        assert sent.progress == 0.25
        (ev,) = await drain(am)
        assert isinstance(ev, ContainersAllocated) and len(ev.containers) == 2
        assert all(c.tag == "worker" and c.resource == R for c in ev.containers)
        assert am.asks.outstanding() == 0

        c1, c2 = ev.containers
        ctx = LaunchContext(commands=["echo hi"], environment={"A": "1"})
        assert await am.launch(c1, ctx)
        assert nm.started[c1.container_id].launch_context == ctx
        assert c1.state is AmContainerState.RUNNING and c1.pid == 4242
        with pytest.raises(AmError, match="cannot launch"):
            await am.launch(c1, ctx)

        rm.completed = [ContainerStatus(container_id=c1.container_id, state="COMPLETE", exit_status=0),
                        ContainerStatus(container_id=c2.container_id, state="COMPLETE", exit_status=-100,
                                        diagnostics="node lost")]
        await am.heartbeat_once()
        (ev,) = await drain(am)
        assert isinstance(ev, ContainersCompleted)
        assert {c.container_id: c.exit_status for c in ev.containers} == {c1.container_id: 0, c2.container_id: -100}
        assert c2.diagnostics == "node lost"

        # A repeated report of the same completion is not delivered twice.
        rm.completed = [ContainerStatus(container_id=c1.container_id, state="COMPLETE", exit_status=0)]
        await am.heartbeat_once()
        assert await drain(am) == []
        # A fully granted row needs no zero update: the RM zeroed its copy when it granted.
        assert rm.requests[-1].asks == []

        assert await am.finish(FinalStatus.FAILED, "c2 lost")
        assert rm.finished.final_status == "FAILED" and rm.finished.diagnostics == "c2 lost"
    finally:
        await am.close()


async def test_response_id_follows_the_rm(fake_cluster):
    am = await make_am(fake_cluster)
    try:
        await am.heartbeat_once()
        await am.heartbeat_once()
        assert [r.response_id for r in fake_cluster.rm.requests] == [0, 1]
    finally:
        await am.close()


async def test_failed_launch_completes_with_invalid_and_releases(fake_cluster):
    fake_cluster.nm.refuse = True
    am = await make_am(fake_cluster)
    try:
        am.add_ask(1, R)
        await am.heartbeat_once()
        (ev,) = await drain(am)
        c = ev.containers[0]
        assert not await am.launch(c, LaunchContext(commands=["true"]))
        (done,) = await drain(am)
        assert isinstance(done, ContainersCompleted) and done.containers[0].exit_status == -1000
        assert "401" in c.diagnostics
        await am.heartbeat_once()
        assert fake_cluster.rm.releases == [c.container_id]
        await am.heartbeat_once()
        assert fake_cluster.rm.requests[-1].releases == [], "a release is sent once"
    finally:
        await am.close()


async def test_stop_running_and_release_unlaunched(fake_cluster):
    am = await make_am(fake_cluster)
    try:
        am.add_ask(2, R)
        await am.heartbeat_once()
        (ev,) = await drain(am)
        running, idle = ev.containers
        await am.launch(running, LaunchContext(commands=["sleep 100"]))
        await am.stop_all()
        events = await drain(am)
        done = {c.container_id: c.exit_status for e in events for c in e.containers}
        assert done == {running.container_id: -105, idle.container_id: -105}
        assert fake_cluster.nm.stopped == [running.container_id]
        await am.heartbeat_once()
        assert fake_cluster.rm.releases == [idle.container_id]
        assert am.book.live() == []
    finally:
        await am.close()


async def test_surplus_containers_are_released_not_delivered(fake_cluster):
    fake_cluster.rm.extra_grants = 2
    am = await make_am(fake_cluster)
    try:
        await am.heartbeat_once()
        assert await drain(am) == []
        await am.heartbeat_once()
        assert len(fake_cluster.rm.releases) == 2
    finally:
        await am.close()


async def test_nodes_shape_and_shutdown(fake_cluster):
    rm = fake_cluster.rm
    am = await make_am(fake_cluster)
    try:
        am.set_shape(JobReport(workers=2, servers=1, phase="TRAINING"))
        rm.updated_nodes = [NodeReport(node_id="n2:1", state="LOST")]
        rm.directive = ShapeDirective(workers=4, servers=2, version=1)
        await am.heartbeat_once()
        assert rm.requests[-1].shape == JobReport(workers=2, servers=1, phase="TRAINING")   # typed on the wire
        evs = await drain(am)
        assert [type(e) for e in evs] == [NodesUpdated, ShapeChanged]
        assert am.nodes["n2:1"].state == "LOST" and evs[1].directive.workers == 4
        await am.heartbeat_once()
        assert await drain(am) == [], "an unchanged directive is not delivered again"
        rm.actions = ["SHUTDOWN"]
        await am.heartbeat_once()
        (ev,) = await drain(am)
        assert isinstance(ev, Shutdown) and "shut down" in ev.reason
    finally:
        await am.close()


async def test_resync_registers_again_and_resends_asks(fake_cluster):
    rm = fake_cluster.rm
    rm.grant = False
    am = await make_am(fake_cluster)
    try:
        am.add_ask(3, R)
        rm.actions = ["RESYNC"]
        await am.heartbeat_once()
        assert rm.register_calls == 2
        await am.heartbeat_once()
        assert rm.requests[-1].response_id == 0 and rm.requests[-1].asks[0].count == 3
    finally:
        await am.close()


async def test_not_registered_registers_again_and_resends_asks_and_unconfirmed_releases(fake_cluster):
    rm = fake_cluster.rm
    am = await make_am(fake_cluster)
    try:
        am.add_ask(2, R, tag="worker")
        await am.heartbeat_once()
        (ev,) = await drain(am)
        kept, gone = ev.containers
        am.release(gone)
        await am.heartbeat_once()           # the release reaches the RM, not yet confirmed
        assert rm.releases == [gone.container_id]
        # The RM restarts (or another takes over): the allocate is refused as not registered, and
        # the first registration meets no active RM yet -- retried, not a shutdown.
        rm.grant, rm.not_registered, rm.unavailable_registers = False, 2, 1
        am.add_ask(1, R, tag="server")
        assert await am.heartbeat_once() is None
        assert am.resyncs == 0 and await drain(am) == []
        assert await am.heartbeat_once() is None
        assert am.resyncs == 1 and rm.register_calls == 3
        await am.heartbeat_once()
        sent = rm.requests[-1]
        assert sent.response_id == 0
        assert sorted((a.tag, a.count) for a in sent.asks) == [("server", 1), ("worker", 0)]
        assert sent.releases == [gone.container_id]     # resent until the RM reports it completed
        rm.completed = [ContainerStatus(container_id=gone.container_id, state="COMPLETE", exit_status=-100)]
        await am.heartbeat_once()
        rm.not_registered = 1
        await am.heartbeat_once()
        await am.heartbeat_once()
        assert am.resyncs == 2 and rm.requests[-1].releases == []     # confirmed: not resent
        assert kept.container_id in am.containers and not kept.done
    finally:
        await am.close()


async def test_rm_errors_retried_then_shutdown_after_timeout(fake_cluster):
    now = [0.0]
    am = await make_am(fake_cluster, clock=lambda: now[0],
                       policy=HeartbeatPolicy(rm_failure_timeout_s=10.0))
    try:
        fake_cluster.rm.fail_allocates = 1
        assert await am.heartbeat_once() is None
        assert await drain(am) == []
        assert await am.heartbeat_once() is not None, "recovered on the next heartbeat"
        fake_cluster.rm.fail_allocates = 3
        await am.heartbeat_once()
        now[0] = 5.0
        await am.heartbeat_once()
        assert await drain(am) == []
        now[0] = 10.5
        await am.heartbeat_once()
        (ev,) = await drain(am)
        assert isinstance(ev, Shutdown) and "unreachable" in ev.reason
    finally:
        await am.close()


async def test_bad_am_token_is_fatal(fake_cluster):
    am = await make_am(fake_cluster)
    try:
        am.rm.use_am_token("forged")      # what every call sends from now on
        await am.heartbeat_once()
        (ev,) = await drain(am)
        assert isinstance(ev, Shutdown) and "401" in ev.reason
    finally:
        await am.close()


async def test_background_loop_heartbeats_faster_while_asks_pend(fake_cluster):
    rm = fake_cluster.rm
    rm.grant = False
    am = ApplicationMaster(AmIdentity.from_env(fake_cluster.env),
                           policy=HeartbeatPolicy(interval_s=30.0, pending_interval_s=0.01))
    try:
        await am.register()
        am.add_ask(1, R)
        await async_wait_until(lambda: len(rm.requests) >= 5, what="five heartbeats while the ask pends")
        rm.grant = True
        ev = await am.next_event(timeout_s=10)
        assert isinstance(ev, ContainersAllocated)
        assert am.loop_running
        await am.finish(FinalStatus.SUCCEEDED)
        assert not am.loop_running, "finish stops the allocate loop: no heartbeats after it"
    finally:
        await am.close()


def test_heartbeat_policy():
    p = HeartbeatPolicy(interval_s=1.0, pending_interval_s=0.25)
    assert p.interval(True) == 0.25 and p.interval(False) == 1.0


def test_identity_from_env_names_missing_variables():
    with pytest.raises(AmEnvironmentError, match=container_env.AM_TOKEN):
        AmIdentity.from_env({container_env.RM_ADDRESS: "http://x", container_env.APP_ATTEMPT_ID: "a"})
    ident = AmIdentity.from_env({container_env.RM_ADDRESS: "http://x", container_env.AM_TOKEN: "t",
                                 container_env.APP_ATTEMPT_ID: "a", container_env.CONTAINER_ID: "c"})
    assert ident.container_id == "c" and ident.am_token == "t"


async def test_stop_on_an_unreachable_nm_releases_through_the_rm(fake_cluster):
    am = await make_am(fake_cluster)
    try:
        am.add_ask(1, R)
        await am.heartbeat_once()
        (ev,) = await drain(am)
        c = ev.containers[0]
        await am.launch(c, LaunchContext(commands=["sleep 100"]))
        c.node_http_address = "127.0.0.1:1"          # its NM is gone
        await am.stop(c)
        assert c.state is AmContainerState.STOPPING
        fake_cluster.rm.completed = [ContainerStatus(container_id=c.container_id, state="COMPLETE",
                                                     exit_status=-100, diagnostics="released")]
        await am.heartbeat_once()
        assert fake_cluster.rm.releases == [c.container_id]
        (done,) = await drain(am)
        assert done.containers[0].exit_status == -100 and c.done
    finally:
        await am.close()


async def test_events_iterator_ends_with_shutdown(fake_cluster):
    am = await make_am(fake_cluster)
    try:
        am.add_ask(1, R)
        fake_cluster.rm.actions = ["SHUTDOWN"]
        await am.heartbeat_once()
        kinds = [type(ev) async for ev in am.events()]
        assert kinds == [ContainersAllocated, Shutdown]
    finally:
        await am.close()


async def test_set_ask_count_replaces_the_outstanding_count(fake_cluster):
    fake_cluster.rm.grant = False
    am = await make_am(fake_cluster)
    try:
        ask = am.add_ask(5, R)
        await am.heartbeat_once()
        am.set_ask_count(ask, 2)
        await am.heartbeat_once()
        assert [a.count for a in fake_cluster.rm.requests[-1].asks] == [2]
        am.set_ask_count(ask, 0)
        await am.heartbeat_once()
        assert [a.count for a in fake_cluster.rm.requests[-1].asks] == [0]
        await am.heartbeat_once()
        assert fake_cluster.rm.requests[-1].asks == [], "a cancelled row is sent once"
    finally:
        await am.close()


async def test_finish_stops_the_loop_even_when_a_wake_up_lands_with_the_cancel(fake_cluster):
    """Python 3.11's wait_for swallows a cancellation that arrives in the same loop step as the
    event it waits for; finish() right after heartbeat_now() must still stop the allocate loop
    (it hung the AM forever before, with its job's phase already FAILED)."""
    am = ApplicationMaster(AmIdentity.from_env(fake_cluster.env))
    await am.register("amhost", 1234, "http://amhost:1234/")             # the loop runs
    await async_wait_until(lambda: len(fake_cluster.rm.requests) >= 1 and am.loop_idle, 5,
                           "the loop's first allocate answered, the loop waiting for a wake-up")
    am.heartbeat_now()
    finishing = asyncio.ensure_future(am.finish(FinalStatus.FAILED, "gave up"))
    done, _ = await asyncio.wait({finishing}, timeout=10)       # a bound on a hang, not a speed
    assert finishing in done, "finish() never returned: the allocate loop ignored its cancellation"
    assert finishing.result() is True
    assert fake_cluster.rm.finished is not None and fake_cluster.rm.finished.final_status == "FAILED"
    await am.close()


async def test_an_ask_added_while_an_allocate_is_in_flight_goes_out_at_once(fake_cluster):
    """The allocate loop is woken by a new ask; one added while an allocate call is on its way
    (after that call took the ask table) must not wait out the heartbeat interval -- an EPS add
    waited up to pending_interval_s for it. The interval here is far longer than the wait."""
    am = ApplicationMaster(AmIdentity.from_env(fake_cluster.env),
                           policy=HeartbeatPolicy(interval_s=600.0, pending_interval_s=600.0))
    call = am.rm.allocate
    added: list[int] = []

    async def allocate(req):
        resp = await call(req)
        if not added:                        # the ask arrives while this call is in flight
            added.append(am.add_ask(1, Resource(256, 1), tag="worker"))
        return resp
    am.rm.allocate = allocate
    try:
        await am.register("amhost", 1234, "http://amhost:1234/")          # the loop runs
        await async_wait_until(lambda: any(r.asks for r in fake_cluster.rm.requests), 10,
                               "the ask sent with the next allocate")      # a bound on a hang
        assert added and fake_cluster.rm.requests[-1].asks[0].ask_id == added[0]
    finally:
        await am.close()


async def test_containers_taken_over_from_the_previous_attempt_run_and_can_be_stopped(fake_cluster):
    rm, nm = fake_cluster.rm, fake_cluster.nm
    kept = [rm.new_container(R, tag="worker"), rm.new_container(R, tag="server")]
    rm.previous = kept
    nm.started.update({c.container_id: None for c in kept})      # the previous attempt launched them
    am = await make_am(fake_cluster)
    try:
        taken = am.previous_containers()
        assert [c.container_id for c in taken] == [c.container_id for c in kept]
        assert all(c.state is AmContainerState.RUNNING and c.tag in ("worker", "server") for c in taken)
        await am.register("amhost", 1234, "http://amhost:1234/", start_heartbeats=False)   # a resync: once only
        assert len(am.book.containers) == 2
        await am.stop(taken[0])              # as any running container: through its NM, with its token
        assert nm.stopped == [kept[0].container_id]
        assert [c.container_id for c in am.book.live()] == [kept[1].container_id]
    finally:
        await am.close()
