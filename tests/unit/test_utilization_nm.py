"""NM utilization measurements on fake /proc and cgroup files (injected clock), and its exposition."""
from __future__ import annotations

from pathlib import Path

from aiohttp.test_utils import TestClient, TestServer

from protocol import codec
from protocol import internal_api as api
from protocol.prometheus_text import format_labels
from protocol.records import Resource

from nodemanager import host_stats, procfs
from nodemanager import prometheus as nm_prometheus
from nodemanager.cgroup_base import ContainerCgroup
from nodemanager.cgroup_v1 import CgroupV1
from nodemanager.cgroup_v2 import CgroupV2
from nodemanager.utilization_sampler import ContainerProbe, RateCounters, UtilizationSampler
from nodemanager.web_api import NodeWebApi
from prom_text import parse
from test_nm_units import _manager

MB = 1024 * 1024
CLK_TCK = 100

NET_DEV = """Inter-|   Receive                                                |  Transmit
 face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed
    lo: {lo} 10 0 0 0 0 0 0 {lo} 10 0 0 0 0 0 0
  eth0: {rx} 20 0 0 0 0 0 0 {tx} 30 0 0 0 0 0 0
  eth1: 100 1 0 0 0 0 0 0 50 1 0 0 0 0 0 0
"""


def proc_stat(busy: int, idle: int, cpus: int = 4) -> str:
    # user nice system idle iowait irq softirq steal guest guest_nice
    lines = [f"cpu  {busy - 10} 0 10 {idle - 5} 5 0 0 0 0 0"]
    lines += [f"cpu{i} 1 0 1 1 0 0 0 0 0 0" for i in range(cpus)]
    return "\n".join(lines + ["intr 1 2 3", "ctxt 99"]) + "\n"


def write_proc(root: Path, busy: int, idle: int, rx: int, tx: int) -> None:
    (root / "net").mkdir(parents=True, exist_ok=True)
    (root / "stat").write_text(proc_stat(busy, idle))
    (root / "meminfo").write_text("MemTotal:       8192000 kB\nMemFree:  1000 kB\nMemAvailable:   6144000 kB\n")
    (root / "net" / "dev").write_text(NET_DEV.format(lo=10 ** 9, rx=rx, tx=tx))


class Clock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


# ----- parsers ---------------------------------------------------------------------------------

def test_parsers_read_the_kernel_formats() -> None:
    t = host_stats.parse_cpu_ticks(proc_stat(busy=300, idle=700))
    assert t is not None and t.busy == 300 and t.total == 1000
    assert host_stats.count_cpus(proc_stat(1, 1, cpus=6)) == 6
    mi = host_stats.parse_meminfo("MemTotal: 2048 kB\nMemAvailable: 1024 kB\n")
    assert mi is not None and mi.used_bytes == 1024 * 1024
    old_kernel = host_stats.parse_meminfo("MemTotal: 4000 kB\nMemFree: 1000 kB\nBuffers: 500 kB\nCached: 500 kB\n")
    assert old_kernel is not None and old_kernel.available_bytes == 2000 * 1024
    # Loopback is left out; the other interfaces add up.
    assert host_stats.parse_net_dev(NET_DEV.format(lo=5, rx=1000, tx=2000)) == (1100, 2050)
    assert host_stats.working_set_bytes(1000, "cache 10\ntotal_inactive_file 300\n", "total_inactive_file") == 700
    assert host_stats.working_set_bytes(100, "inactive_file 300\n", "inactive_file") == 0


def test_dir_bytes_sums_nested_files_and_tolerates_a_missing_dir(tmp_path: Path) -> None:
    (tmp_path / "spill" / "a").mkdir(parents=True)
    (tmp_path / "spill" / "x.lz4").write_bytes(b"1" * 1000)
    (tmp_path / "spill" / "a" / "y.lz4").write_bytes(b"2" * 24)
    assert host_stats.dir_bytes(str(tmp_path / "spill")) == 1024
    assert host_stats.dir_bytes(str(tmp_path / "nope")) == 0


def test_rate_counters_need_two_samples_and_never_go_negative() -> None:
    r = RateCounters()
    assert r.rate("k", 10.0, 100) is None
    assert r.rate("k", 12.0, 300) == 100.0
    assert r.rate("k", 13.0, 50) == 0.0          # went backwards: a process of the tree exited
    assert r.rate("k", 13.0, 90) is None         # no time passed
    r.keep_only(set())
    assert r.rate("k", 20.0, 10) is None         # forgotten: starts again


# ----- cgroup readers ----------------------------------------------------------------------------

def test_cgroup_v1_and_v2_read_cpu_and_memory(tmp_path: Path) -> None:
    cpu, mem = tmp_path / "cpu" / "c1", tmp_path / "memory" / "c1"
    cpu.mkdir(parents=True)
    mem.mkdir(parents=True)
    v1 = CgroupV1(str(tmp_path / "cpu"), str(tmp_path / "memory"), "e", "n")
    cg1 = ContainerCgroup("c1", [str(cpu), str(mem)])
    assert v1.cpu_usage_ns(cg1) is None and v1.memory_usage_bytes(cg1) is None   # cpuacct mounted elsewhere
    (cpu / "cpuacct.usage").write_text("2500000000\n")
    (mem / "memory.usage_in_bytes").write_text(str(300 * MB))
    (mem / "memory.stat").write_text(f"cache 5\ntotal_inactive_file {100 * MB}\n")
    assert v1.cpu_usage_ns(cg1) == 2_500_000_000 and v1.memory_usage_bytes(cg1) == 200 * MB
    d = tmp_path / "unified" / "c2"
    d.mkdir(parents=True)
    (d / "cpu.stat").write_text("usage_usec 1500000\nuser_usec 1000000\nsystem_usec 500000\n")
    (d / "memory.current").write_text(str(64 * MB))
    (d / "memory.stat").write_text(f"anon 1\ninactive_file {16 * MB}\n")
    v2 = CgroupV2(str(tmp_path / "unified"), "e", "n")
    cg2 = ContainerCgroup("c2", [str(d)])
    assert v2.cpu_usage_ns(cg2) == 1_500_000_000 and v2.memory_usage_bytes(cg2) == 48 * MB


# ----- the sampler -------------------------------------------------------------------------------

class FakeCgroups(CgroupV2):
    """Counters set by the test, per container id."""

    def __init__(self) -> None:
        super().__init__("/nonexistent", "e", "n")
        self.cpu_ns: dict[str, int] = {}
        self.mem: dict[str, int] = {}

    def cpu_usage_ns(self, cg: ContainerCgroup) -> int | None:
        return self.cpu_ns.get(cg.container_id)

    def memory_usage_bytes(self, cg: ContainerCgroup) -> int | None:
        return self.mem.get(cg.container_id)


def test_sampler_turns_counters_into_rates_over_the_injected_clock(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    write_proc(proc, busy=1000, idle=1000, rx=5000, tx=7000)
    work = tmp_path / "work"
    (work / "spill").mkdir(parents=True)
    (work / "spill" / "b0.lz4").write_bytes(b"x" * 4096)
    cg = FakeCgroups()
    cg.cpu_ns["c1"], cg.mem["c1"] = 10 * 10 ** 9, 256 * MB
    clock = Clock()
    s = UtilizationSampler(cg, clock=clock, proc_root=str(proc), clk_tck=CLK_TCK)
    probe = ContainerProbe("c1", "app1", pid=1, work_dir=str(work), cgroup=ContainerCgroup("c1", ["x"]), role="worker")
    first = s.sample([probe])
    # No rate before a second sample; levels (memory, spill) are there at once.
    assert first.cpu_cores == 0 and first.net_rx_bytes_per_s == 0 and first.containers[0].cpu_cores == 0
    assert first.containers[0].memory_mb == 256 and first.containers[0].spill_bytes == 4096
    assert first.host_cores == 4 and first.memory_total_mb == 8000 and first.memory_mb == 2000
    assert first.sampled_ms == 1_000_000
    clock.t += 2.0
    write_proc(proc, busy=1000 + 300, idle=1000 + 500, rx=5000 + 4000, tx=7000 + 1000)
    cg.cpu_ns["c1"] += 3 * 10 ** 9                     # 3 CPU-seconds in 2 s
    second = s.sample([probe])
    assert second.cpu_cores == 1.5                     # 300 ticks at 100/s over 2 s
    assert second.net_rx_bytes_per_s == 2000 and second.net_tx_bytes_per_s == 500
    c = second.containers[0]
    assert (c.container_id, c.app_id, c.role, c.cpu_cores) == ("c1", "app1", "worker", 1.5)
    assert second.spill_bytes == 4096


def test_sampler_falls_back_to_the_process_tree_without_cgroups(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    write_proc(proc, busy=10, idle=10, rx=0, tx=0)
    ticks = {"root": 100, "child": 50}

    def stats() -> list[procfs.ProcStat]:
        return [procfs.ProcStat(pid=40, state="S", ppid=1, pgid=40, sid=40, utime=ticks["root"], stime=0,
                                start_time=1, rss_pages=256),
                procfs.ProcStat(pid=41, state="R", ppid=40, pgid=40, sid=40, utime=ticks["child"], stime=10,
                                start_time=2, rss_pages=256),
                procfs.ProcStat(pid=99, state="R", ppid=1, pgid=99, sid=99, utime=10 ** 6, stime=0,
                                start_time=3, rss_pages=10 ** 6)]   # not the container's
    clock = Clock()
    s = UtilizationSampler(None, clock=clock, proc_root=str(proc), clk_tck=CLK_TCK, process_stats=stats)
    probe = ContainerProbe("c1", "app1", pid=40, work_dir=str(tmp_path / "w"))
    first = s.sample([probe])
    assert first.containers[0].memory_mb == 512 * procfs.PAGE_SIZE / MB and first.containers[0].spill_bytes == 0
    clock.t += 0.5
    ticks["child"] += 50                               # 0.5 CPU-seconds in 0.5 s
    assert s.sample([probe]).containers[0].cpu_cores == 1.0
    # A container gone from the probes is forgotten: it would start again without a rate.
    assert s.sample([]).containers == ()
    clock.t += 1
    assert s.sample([probe]).containers[0].cpu_cores == 0


def proc_pid_stat(pid: int, utime: int, stime: int, rss_pages: int) -> str:
    fields = ["S", "1", str(pid), str(pid)] + ["0"] * 7 + [str(utime), str(stime)] + ["0"] * 6 + ["7", "0",
                                                                                                str(rss_pages)]
    return f"{pid} (python (x)) " + " ".join(fields) + "\n"


def test_sampler_reads_the_cgroups_processes_where_it_does_not_account_cpu(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    write_proc(proc, busy=10, idle=10, rx=0, tx=0)
    for pid, ut in ((51, 100), (52, 20)):
        (proc / str(pid)).mkdir()
        (proc / str(pid) / "stat").write_text(proc_pid_stat(pid, ut, 0, 10))

    class V1ApartCpuacct(FakeCgroups):
        def pids(self, cg: ContainerCgroup) -> list[int]:
            return [51, 52, 53]                        # 53 exited after the list was read

    cg = V1ApartCpuacct()
    cg.mem["c1"] = 5 * MB
    clock = Clock()

    def no_scan() -> list[procfs.ProcStat]:
        raise AssertionError("the cgroup lists the processes: no /proc scan")
    s = UtilizationSampler(cg, clock=clock, proc_root=str(proc), clk_tck=CLK_TCK, process_stats=no_scan)
    probe = ContainerProbe("c1", "a", pid=51, work_dir=str(tmp_path), cgroup=ContainerCgroup("c1", ["x", "y"]))
    assert s.sample([probe]).containers[0].memory_mb == 5
    clock.t += 1.0
    (proc / "52" / "stat").write_text(proc_pid_stat(52, 20 + 150, 0, 10))
    assert s.sample([probe]).containers[0].cpu_cores == 1.5


def test_heartbeats_decode_with_and_without_utilization() -> None:
    old = {"node_id": "n:1", "response_id": 3, "used": {"memory": 0, "vCores": 0}}
    assert codec.decode_as(old, api.NodeHeartbeatRequest).utilization is None
    new = dict(old, utilization={"cpu_cores": 1.5, "containers": [{"container_id": "c", "app_id": "a",
                                                                     "cpu_cores": 0.5}]})
    u = codec.decode_as(new, api.NodeHeartbeatRequest).utilization
    assert u is not None and u.containers[0].cpu_cores == 0.5 and u.containers[0].memory_mb == 0


# ----- exposition --------------------------------------------------------------------------------

def test_labels_are_escaped_and_empty_ones_left_out() -> None:
    assert format_labels({"a": 'x"y\\z\n', "role": ""}) == '{a="x\\"y\\\\z\\n"}'
    assert format_labels({"role": ""}) == ""


def sample_report() -> api.NodeUtilization:
    return api.NodeUtilization(
        sampled_ms=9_000, cpu_cores=2.5, host_cores=8, memory_mb=1024, memory_total_mb=4096,
        net_rx_bytes_per_s=100.0, net_tx_bytes_per_s=50.0, spill_bytes=7,
        containers=(api.ContainerUtilization("c2", "app1", 1.25, 100.0, 7, "server"),
                    api.ContainerUtilization("c1", "app1", 0.5, 50.0, 0, "")))


def test_nm_exposition_covers_host_and_containers_with_labels() -> None:
    text = nm_prometheus.render("h:1", Resource(2048, 4), Resource(1024, 2), 2, sample_report(), now=10.0)
    fams = parse(text)
    assert all(f.type == "gauge" for f in fams.values())
    assert fams["elastane_nm_host_cpu_cores"].value(node="h:1") == 2.5
    assert fams["elastane_nm_memory_bytes"].value(kind="allocated") == 1024 * MB
    assert fams["elastane_nm_sample_age_seconds"].value() == 1.0
    assert fams["elastane_nm_container_cpu_cores"].value(container="c2", app="app1", role="server") == 1.25
    # No role in the launch environment: no role label.
    assert fams["elastane_nm_container_cpu_cores"].samples[0][0] == {"node": "h:1", "app": "app1", "container": "c1"}
    assert fams["elastane_nm_container_memory_bytes"].value(container="c1") == 50 * MB
    # Before the first sample every family is still declared, without samples.
    empty = parse(nm_prometheus.render("h:1", Resource(2048, 4), Resource(0, 0), 0, None, now=10.0))
    assert set(empty) == set(fams) and empty["elastane_nm_host_cpu_cores"].samples == []


async def test_nm_serves_its_exposition(tmp_path: Path) -> None:
    m = _manager(tmp_path, lambda: 0.0)
    web = NodeWebApi(m, "s", "127.0.0.1:1", lambda: "http://127.0.0.1:1", lambda: {}, utilization=sample_report)
    async with TestClient(TestServer(web.app())) as cl:
        r = await cl.get("/metrics/prometheus")
        assert r.status == 200 and r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        fams = parse(await r.text())
    assert fams["elastane_nm_vcores"].value(kind="total") == 2
    assert fams["elastane_nm_network_receive_bytes_per_second"].value(node="127.0.0.1:1") == 100


def test_launchers_name_the_role_the_nm_labels_metrics_with() -> None:
    from appmaster.container_book import AmContainer
    from appmaster.ps.runtime.executor_pool import ExecutorPool, Role
    from protocol import container_env

    pool = ExecutorPool(num_blocks=4, am_address="h:1", job_secret="s")
    for role in (Role.WORKER, Role.SERVER):
        rec = pool.add(role, AmContainer(container_id=f"container_1_0001_01_00000{2 + (role is Role.SERVER)}",
                                         node_id="n:1", node_http_address="n:1", resource=Resource(512, 1), token="t"))
        assert pool.launch_context(rec).environment[container_env.CONTAINER_ROLE] == role.value


def test_heartbeats_carry_the_container_list_when_it_changes_and_every_few_seconds(tmp_path: Path) -> None:
    from nodemanager.utilization_monitor import CONTAINER_LIST_EVERY_S, UtilizationMonitor

    clock = Clock(0.0)
    mon = UtilizationMonitor(_manager(tmp_path, lambda: 0.0), UtilizationSampler(None), 1.0, clock=clock)
    assert mon.for_heartbeat() is None                 # nothing sampled yet
    mon.latest = sample_report()
    first = mon.for_heartbeat()
    assert first is not None and first.containers is not None and len(first.containers) == 2
    clock.t += 1.0
    second = mon.for_heartbeat()
    # Sums only: the RM keeps the list it has.
    assert second is not None and second.containers is None and second.cpu_cores == 2.5
    mon.latest = api.NodeUtilization(containers=sample_report().containers[:1])   # a container finished
    third = mon.for_heartbeat()
    assert third is not None and third.containers is not None and len(third.containers) == 1
    clock.t += CONTAINER_LIST_EVERY_S
    fourth = mon.for_heartbeat()
    assert fourth is not None and fourth.containers is not None
    mon.latest = api.NodeUtilization(containers=())  # the last one finished: an empty list, not None
    last = mon.for_heartbeat()
    assert last is not None and last.containers == ()
