"""A peer that vanishes without a word (host powered off, link cut: no RST, no FIN) ends every wait
on it: marked lost by whoever learns it is gone (the PS AM, from the RM's loss report), a request in
flight to it and an open under way fail at once with PeerLost, and so does every later request
until its address is announced again; without that mark, the socket itself gives up (connect
timeout, keepalive, TCP_USER_TIMEOUT).

The silent peers here accept connections and never answer; the connect that never completes is
one to a listener whose accept queue is full (the kernel drops its SYNs, as a vanished host
does). The netns test cuts a real link and lets the kernel find out (root + iproute2)."""
from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import AsyncIterator

import numpy as np
import pytest

from appmaster.container_book import AmContainer
from appmaster.ps.runtime.executor_pool import ExecutorPool, ExecutorState, Role
from appmaster.ps.runtime.executor_rpc import ExecutorCallError, ExecutorLost, ExecutorRpc
from elastane_cli import node_network as nn
from polling import async_wait_until
from protocol import executor_ops as ops
from protocol.records import Resource
from psruntime.wire.dataplane import (ConnectTimeout, DataPlaneClient, DataPlaneServer, LinkLiveness, PeerLost,
                                 apply_liveness)
from psruntime.wire.frame_codec import Frame
from psruntime.store.ownership_table import OwnershipTable
from psruntime.store.store_client import StoreClient, StoreClientError


class SilentPeer:
    """Accepts connections, reads everything, answers nothing: a host that vanished mid-request,
    from the requester's side (its connection looks open, its replies never come)."""

    def __init__(self) -> None:
        self.address = ""
        self.accepted = 0
        self.received = 0
        self.got_bytes = asyncio.Event()
        self._server: asyncio.Server | None = None
        self._writers: list[asyncio.StreamWriter] = []

    async def start(self) -> str:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        host, port = self._server.sockets[0].getsockname()[:2]
        self.address = f"{host}:{port}"
        return self.address

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        self._writers.append(writer)
        while chunk := await reader.read(1 << 16):
            self.received += len(chunk)
            self.got_bytes.set()

    async def stop(self) -> None:
        assert self._server is not None
        self._server.close()
        for w in self._writers:
            w.close()
        await self._server.wait_closed()


@pytest.fixture
async def silent() -> AsyncIterator[SilentPeer]:
    peer = SilentPeer()
    await peer.start()
    yield peer
    await peer.stop()


def syn_sent_to(port: int) -> int:
    """Sockets of this host in SYN_SENT towards `port` on 127.0.0.1 (connects nobody answered)."""
    n = 0
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if int(fields[2].split(":")[1], 16) == port and fields[3] == "02":
            n += 1
    return n


class FullBacklog:
    """A listener that never accepts, its queue filled: SYNs to it are dropped, not refused, so a
    connect waits as one to a vanished host does."""

    def __init__(self) -> None:
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(0)
        self.port = self.listener.getsockname()[1]
        self.fillers: list[socket.socket] = []

    async def fill(self) -> None:
        while syn_sent_to(self.port) == 0:      # until one connect is left waiting: the queue is full
            s = socket.socket()
            s.setblocking(False)
            try:
                s.connect(("127.0.0.1", self.port))
            except BlockingIOError:
                pass
            self.fillers.append(s)
            await async_wait_until(lambda: syn_sent_to(self.port) > 0 or len(self.fillers) < 3,
                                   what="the connect settled")

    def close(self) -> None:
        for s in [*self.fillers, self.listener]:
            s.close()


async def test_a_request_to_a_silent_peer_ends_when_the_peer_is_marked_lost(silent: SilentPeer) -> None:
    address = silent.address
    client = DataPlaneClient()
    try:
        pending = asyncio.ensure_future(client.request(address, {"op": "ping"}, [np.ones(4, np.float32)]))
        await asyncio.wait_for(silent.got_bytes.wait(), 10)
        await asyncio.sleep(0)
        assert not pending.done()                   # the peer has the request; no reply ever comes
        client.mark_lost(address, "its container completed with -100")
        with pytest.raises(PeerLost, match="-100"):
            await pending
        # Later requests fail at once, without connecting again, until the address is announced anew.
        accepted = silent.accepted
        with pytest.raises(PeerLost):
            await client.request(address, {"op": "ping"})
        assert silent.accepted == accepted and client.lost(address)
        client.clear_lost(address)
        again = asyncio.ensure_future(client.request(address, {"op": "ping"}))
        await async_wait_until(lambda: silent.accepted == accepted + 1, what="a new connection")
        again.cancel()
    finally:
        await client.close()


async def test_an_open_that_waits_on_dropped_syns_ends_when_the_address_is_marked_lost() -> None:
    backlog = FullBacklog()
    client = DataPlaneClient()
    try:
        await backlog.fill()
        before = syn_sent_to(backlog.port)
        address = f"127.0.0.1:{backlog.port}"
        opening = asyncio.ensure_future(client.connection(address))
        await async_wait_until(lambda: syn_sent_to(backlog.port) > before, what="our SYN unanswered")
        assert not opening.done()
        client.mark_lost(address, "its node was lost")
        with pytest.raises(PeerLost, match="its node was lost"):
            await opening
        await async_wait_until(lambda: syn_sent_to(backlog.port) == before, what="the connect abandoned")
    finally:
        await client.close()
        backlog.close()


async def test_an_open_that_waits_on_dropped_syns_gives_up_after_the_connect_timeout() -> None:
    backlog = FullBacklog()
    client = DataPlaneClient(liveness=LinkLiveness(connect_timeout_s=0.2))
    try:
        await backlog.fill()
        with pytest.raises(ConnectTimeout, match="within 0.2s"):
            await client.connection(f"127.0.0.1:{backlog.port}")
    finally:
        await client.close()
        backlog.close()


async def test_a_caller_cancelling_its_open_is_not_taken_for_a_loss() -> None:
    backlog = FullBacklog()
    client = DataPlaneClient()
    try:
        await backlog.fill()
        opening = asyncio.ensure_future(client.connection(f"127.0.0.1:{backlog.port}"))
        await async_wait_until(lambda: syn_sent_to(backlog.port) > 1, what="our SYN unanswered")
        opening.cancel()
        with pytest.raises(asyncio.CancelledError):
            await opening
        assert client.lost(f"127.0.0.1:{backlog.port}") is None
    finally:
        await client.close()
        backlog.close()


async def test_data_plane_sockets_carry_keepalive_and_a_user_timeout() -> None:
    liveness = LinkLiveness(keepalive_idle_s=7, keepalive_interval_s=2, keepalive_probes=4, user_timeout_s=9)
    server = DataPlaneServer(lambda f: ({"op": "ok"}, ()), liveness=liveness)
    await server.start()
    client = DataPlaneClient(liveness=liveness)
    try:
        conn = await client.connection(server.address)
        sock = conn.protocol.transport.get_extra_info("socket")   # type: ignore[union-attr]
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == 7
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL) == 2
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT) == 4
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == 9000
        assert (await conn.request({"op": "x"})).header["op"] == "ok"
        apply_liveness(None, liveness)              # no transport (closed): nothing to set, no error
    finally:
        await client.close()
        await server.stop()


def container(cid: str, exit_status: int | None = None, node: str = "n1:1") -> AmContainer:
    return AmContainer(container_id=cid, node_id=node, node_http_address=node, resource=Resource(256, 1),
                       token="t", tag="worker", exit_status=exit_status)


def announce(pool: ExecutorPool, executor_id: str, address: str) -> None:
    pool.handle_frame(Frame({"op": "executor_ready", "executor_id": executor_id, "address": address, "pid": 1}))


async def test_the_rms_loss_report_ends_a_control_request_to_a_vanished_executor(silent: SilentPeer) -> None:
    """The master's path: the pool learns the container completed (-100, node lost) and every
    request to its executor, waiting or new, fails as ExecutorLost."""
    client = DataPlaneClient()
    pool = ExecutorPool(4, am_address="127.0.0.1:1", links=client)
    rpc = ExecutorRpc(client)
    worker = pool.add(Role.WORKER, container("c1"))
    server = pool.add(Role.SERVER, container("c2"))
    address = silent.address
    announce(pool, worker.executor_id, address)
    announce(pool, server.executor_id, "127.0.0.1:9")
    try:
        watch = pool.watch_losses([server, worker])
        call = asyncio.ensure_future(rpc.exchange(worker, ops.RunClock(epoch=0, batches=4, num_workers=1), ops.RunClockReply))
        await asyncio.wait_for(silent.got_bytes.wait(), 10)
        await asyncio.sleep(0)
        assert not call.done() and not watch.done()          # no reply, no report: it would wait for ever
        pool.mark_exited(container("c1", exit_status=-100))
        with pytest.raises(ExecutorLost, match="run_clock on worker-0 .* -100") as lost:
            await call
        assert not lost.value.answered and isinstance(lost.value, ExecutorCallError)
        assert watch.done() and watch.result() is worker
        assert "-100" in pool.lost["worker-0"]
        accepted = silent.accepted
        with pytest.raises(ExecutorLost, match="its container has ended"):
            await rpc.call(worker, ops.Positions(), ops.PositionsReply)
        await rpc.shutdown([worker])                        # nothing sent to a gone executor
        assert silent.accepted == accepted
        # A lost worker watched later is reported at once; a live one is not.
        assert pool.watch_losses([worker]).done()
        other = pool.watch_losses([server])
        await asyncio.sleep(0)
        assert not other.done()
        other.cancel()
    finally:
        await client.close()


async def test_a_retired_executor_exiting_is_no_loss_but_its_address_is_dropped(silent: SilentPeer) -> None:
    client = DataPlaneClient()
    pool = ExecutorPool(4, am_address="127.0.0.1:1", links=client)
    rec = pool.add(Role.SERVER, container("c1"))
    address = silent.address
    announce(pool, rec.executor_id, address)
    try:
        watch = pool.watch_losses([rec])
        pool.retire(rec)
        pool.mark_exited(container("c1", exit_status=-105))
        await asyncio.sleep(0)
        assert not watch.done() and pool.lost == {}
        assert client.lost(address) is not None and rec.state is ExecutorState.EXITED
        # A new executor announcing the same address (same host, port reused) is served again.
        again = pool.add(Role.SERVER, container("c3"))
        announce(pool, again.executor_id, address)
        assert client.lost(address) is None
        watch.cancel()
    finally:
        await client.close()


async def test_an_executor_declared_lost_fails_its_requests_before_its_container_ends(silent: SilentPeer) -> None:
    client = DataPlaneClient()
    pool = ExecutorPool(4, am_address="127.0.0.1:1", links=client)
    rpc = ExecutorRpc(client)
    rec = pool.add(Role.WORKER, container("c1"))
    address = silent.address
    announce(pool, rec.executor_id, address)
    try:
        call = asyncio.ensure_future(rpc.call(rec, ops.Positions(), ops.PositionsReply))
        await asyncio.wait_for(silent.got_bytes.wait(), 10)
        pool.declare_lost(rec, "no run_clock reply within 300s")
        with pytest.raises(ExecutorLost, match="no run_clock reply within 300s"):
            await call
        assert rec.state is ExecutorState.READY and "300s" in pool.lost[rec.executor_id]
    finally:
        await client.close()


async def test_a_store_request_to_a_lost_owner_is_a_store_client_error() -> None:
    client = DataPlaneClient()
    table = OwnershipTable.round_robin(4, ["s0"], {"s0": "127.0.0.1:9"})
    client.mark_lost("127.0.0.1:9", "its node was lost")
    store = StoreClient(table, client)
    try:
        with pytest.raises(StoreClientError, match="its node was lost"):
            await store.pull([1])
        with pytest.raises(StoreClientError, match="its node was lost"):
            await store.pull_array(np.array([1, 2], np.int64))
    finally:
        await client.close()


# -- a real link cut (root + iproute2) ------------------------------------------------------------

NETNS_REASON = nn.netns_unavailable_reason()
needs_netns = pytest.mark.skipif(NETNS_REASON is not None, reason=f"netns unavailable: {NETNS_REASON}")

# In the node's namespace: accept, read, never answer; one connect back to `host:port` that then
# stays idle (the other direction: the root namespace's data-plane server must drop it).
SILENT_NODE = textwrap.dedent("""
    import asyncio, sys

    async def main():
        async def serve(reader, writer):
            while await reader.read(1 << 16):
                pass
        server = await asyncio.start_server(serve, sys.argv[1], 0)
        print(server.sockets[0].getsockname()[1], flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)   # connect when told
        reader, writer = await asyncio.open_connection(sys.argv[2], int(sys.argv[3]))
        print("connected", flush=True)
        await asyncio.Event().wait()

    asyncio.run(main())
""")
FAST = LinkLiveness(connect_timeout_s=2, keepalive_idle_s=1, keepalive_interval_s=1, keepalive_probes=2,
                    user_timeout_s=2)


def established_on(port: int) -> int:
    """Established TCP sockets of this namespace whose local port is `port`."""
    n = 0
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if int(fields[1].split(":")[1], 16) == port and fields[3] == "01":
            n += 1
    return n


@pytest.mark.cluster
@needs_netns
async def test_a_cut_link_is_found_by_the_sockets_alone(tmp_path: Path) -> None:
    """No RM report here: a request in flight, an idle connection, a new connect and the server side
    of a connection all end on their own once the node's link is cut."""
    net = nn.create(tmp_path, 1, None)
    script = tmp_path / "silent_node.py"
    script.write_text(SILENT_NODE)
    server = DataPlaneServer(lambda f: ({"op": "ok"}, ()), host=net.bridge_ip, liveness=FAST)
    node: subprocess.Popen[str] | None = None
    busy, idle, fresh = DataPlaneClient(liveness=FAST), DataPlaneClient(liveness=FAST), DataPlaneClient(liveness=FAST)
    try:        # from the namespace on: whatever fails, everything made here goes
        server_port = int((await server.start()).rsplit(":", 1)[1])
        node = subprocess.Popen([*net.exec_prefix(0), sys.executable, str(script), net.node_ip(0), net.bridge_ip,
                                 str(server_port)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert node.stdin is not None and node.stdout is not None
        port = await asyncio.to_thread(node.stdout.readline)
        address = f"{net.node_ip(0)}:{port.strip()}"
        busy_conn = await busy.connection(address)
        idle_conn = await idle.connection(address)
        node.stdin.write("go\n")
        node.stdin.flush()
        assert (await asyncio.to_thread(node.stdout.readline)).strip() == "connected"
        await async_wait_until(lambda: established_on(server_port) == 1, what="the node's connection served")

        # The cut: packets to the node vanish and nothing answers. Its MAC stays known (as a host's
        # that was just talked to), so a new connect sends SYNs into the void rather than failing ARP.
        mac = nn.run(["ip", "-n", net.namespace(0), "-o", "link", "show", "eth0"]).split("link/ether")[1].split()[0]
        nn.run(["ip", "neigh", "replace", net.node_ip(0), "lladdr", mac, "dev", net.bridge, "nud", "permanent"])
        nn.run(["ip", "link", "set", net.host_veth(0), "down"])

        in_flight = busy_conn.submit({"op": "ping"}, [np.ones(1024, np.float32)])
        with pytest.raises(ConnectionError):
            await asyncio.wait_for(in_flight, 60)       # TCP_USER_TIMEOUT: the request was never acknowledged
        await async_wait_until(lambda: idle_conn.closed, 60, what="the idle connection dropped by keepalive")
        with pytest.raises(ConnectTimeout):
            await fresh.connection(address)
        await async_wait_until(lambda: established_on(server_port) == 0, 60,
                               what="the server dropped the vanished client")
    finally:
        for c in (busy, idle, fresh):
            await c.close()
        await server.stop()
        if node is not None:
            node.kill()
            node.wait()
        nn.remove(net)
