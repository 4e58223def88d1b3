"""The RM web UI in a real browser (headless Chromium through Playwright), against an RM served
in-process whose state the test drives: every page loads with no console error, the live parts
follow the RM while the page stays open (no reload), a shape change appears on the app's charts,
the links between pages lead where they say, and the first view needs no JavaScript.
The same checks against a local cluster training a real PS job are in test_web_ui_cluster.py."""
from __future__ import annotations

import asyncio
import threading
import time
from typing import Any, Callable, Iterator

import pytest
from aiohttp import web

from browser import chromium_page, skip_reason
from protocol import internal_api as api
from protocol.config import ClusterConfig, RMConfig
from protocol.job_report import JobReport
from protocol.records import Resource
from rm.model import AmSpec
from rm.server import ResourceManagerServer
from rm_testing import SECRET, launch_and_register, ps_spec, register

pytestmark = pytest.mark.skipif(skip_reason() is not None, reason=skip_reason() or "")


class ServedRm:
    """An RM (no timers, the real clock) served on a loop in its own thread. The test changes its
    state only through `call`, on that loop, so requests never see it half-changed."""

    def __init__(self, tmp: str):
        self.loop = asyncio.new_event_loop()
        self.rm = ResourceManagerServer(RMConfig(state_dir=tmp), ClusterConfig(secret=SECRET, admins=["root"]),
                                        run_timers=False)
        self.t = time.time() - 60.0                   # when the next utilization report is (1.1 s apart)
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.url = self.call_async(self._start())

    async def _start(self) -> str:
        app = self.rm.build_app()
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        return f"http://127.0.0.1:{self.runner.addresses[0][1]}"

    def call_async(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(30)

    def call(self, fn: Callable[[], Any]) -> Any:
        async def run() -> Any:
            out = fn()
            self.rm.flush()
            return out
        return self.call_async(run())

    def add_point(self, cpu: float, mem: float) -> None:
        """Node n1:1 reports this use (as its heartbeats carry it) into the RM's utilization series."""
        def add() -> None:
            self.t += 1.1
            u = api.NodeUtilization(sampled_ms=int(self.t * 1000), cpu_cores=cpu, host_cores=8, memory_mb=mem,
                                    memory_total_mb=8192, net_rx_bytes_per_s=1e6, net_tx_bytes_per_s=2e6,
                                    containers_cpu_cores=cpu, containers_memory_mb=mem)
            self.rm.core.utilization.report("n1:1", "host-1", self.t, u, Resource(8192, 8))
        self.call(add)

    def close(self) -> None:
        async def stop() -> None:
            await self.runner.cleanup()
            self.rm.store.close()
        self.call_async(stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


@pytest.fixture
def served(tmp_path) -> Iterator[ServedRm]:
    s = ServedRm(str(tmp_path / "state"))
    try:
        yield s
    finally:
        s.close()


def _report(workers: int, servers: int, iterations: int, epoch: int) -> JobReport:
    return JobReport(workers=workers, servers=servers, started=True, iterations=iterations, speed=1.0 + workers / 4,
                     speed_iterations=10, phase="TRAINING", epoch=epoch, epoch_time_s=10.0 / workers,
                     objective=1.0 / (epoch + 1), memory_mb=100.0 * (workers + servers))


def test_pages_live_updates_shape_change_and_links(served: ServedRm) -> None:
    core = served.rm.core
    state: dict[str, Any] = {}

    def setup() -> None:
        register(core, "n1:1")
        app_id = core.new_application()
        core.submit(app_id, "alice", "<b>mf</b>", "default", "ELASTANE_PS",
                    AmSpec(["true"], {}, {}, Resource(512, 1)), 2, ps_job=ps_spec({"app": "mlr", "workers": 2}))
        core.app_saved(app_id)
        state["app"] = app_id
        state["claims"] = launch_and_register(core, app_id)
        state["rid"] = 0

    def report(rep: JobReport) -> None:
        core.allocate(state["claims"], api.AllocateRequest(response_id=state["rid"], shape=rep))
        state["rid"] += 1

    served.call(setup)
    app_id = state["app"]
    served.call(lambda: report(_report(2, 1, 10, 0)))
    served.add_point(1.0, 1024)
    served.add_point(1.5, 1536)

    with chromium_page() as (page, log):
        # Overview: metrics, utilization charts from the endpoint, the running app.
        page.goto(served.url + "/")
        assert page.url.endswith("/cluster")
        assert page.locator("#util-cpu svg").count() == 1 and page.locator("#util-network svg").count() == 1
        assert page.locator("#running-apps a", has_text=app_id).count() == 1
        cpu_before = page.locator("#util-cpu polyline").first.get_attribute("points")
        served.add_point(3.0, 2048)
        page.wait_for_function("b => document.querySelector('#util-cpu polyline').getAttribute('points') !== b",
                               arg=cpu_before)

        # The app page: fields follow the AM's reports, and a shape change shows on the charts.
        page.click(f"#running-apps a:has-text('{app_id}')")
        page.wait_for_url(f"**/cluster/app/{app_id}")
        assert page.locator("h1").inner_text() == f"Application {app_id}"
        assert page.locator("#app td").nth(2).inner_text() == "<b>mf</b>"     # the name, escaped
        markers = page.locator("#chart-speed line.marker.shape").count()
        served.call(lambda: report(_report(2, 1, 40, 1)))
        page.wait_for_function("() => /40/.test(document.querySelector('#shape tr:nth-child(6) td').textContent)")
        # After a live update, the user's name is still text, not markup.
        assert page.locator("#app td").nth(2).inner_text() == "<b>mf</b>" and page.locator("main b").count() == 0
        served.call(lambda: report(_report(4, 1, 80, 2)))
        page.wait_for_function(f"() => document.querySelectorAll('#chart-speed line.marker.shape').length > {markers}")
        assert "2 \u2192 4 workers" in (page.locator("#chart-speed line.marker.shape").last.text_content() or "")
        assert page.locator("#shape td").first.inner_text() == "4"

        # An operator's directive: on the app page, and in the scheduler's decisions.
        no_directive = page.locator("p.note", has_text="has sent no directive")
        assert no_directive.is_visible()
        status = served.call_async(_put_shape(served.url, app_id))
        assert status == 200
        no_directive.wait_for(state="hidden")
        page.wait_for_function("() => document.querySelectorAll('#chart-speed line.marker.directive').length > 0")
        page.click("nav a:has-text('Scheduler')")
        page.wait_for_url("**/cluster/scheduler")
        assert page.locator("#decisions a", has_text=app_id).count() == 1
        assert "set by alice" in page.locator("#decisions").inner_text()
        assert page.locator("#queues td").first.inner_text() == "default"

        # Nodes, and one node's page.
        page.click("nav a:has-text('Nodes')")
        page.wait_for_url("**/cluster/nodes")
        heartbeat_cell = page.locator("#nodes tbody tr td").nth(9)
        first = heartbeat_cell.inner_text()
        assert first.endswith(" ago")
        page.wait_for_function("t => document.querySelectorAll('#nodes tbody tr td')[9].textContent !== t", arg=first)
        page.click("#nodes a:has-text('n1:1')")
        page.wait_for_url("**/cluster/node/n1%3A1")
        assert page.locator("h1").inner_text() == "Node n1:1"
        assert page.locator("#util-memory svg").count() == 1
        page.click("nav a:has-text('Applications')")
        page.wait_for_url("**/cluster/apps")
        page.click(".filters a:has-text('RUNNING')")
        page.wait_for_url("**/cluster/apps/RUNNING")
        assert page.locator("#apps a", has_text=app_id).count() == 1
        # The script has polled every page it was on without a failed request.
        page.wait_for_function("() => Number(document.body.dataset.polls || 0) >= 1")
        assert page.locator("#updated").inner_text().startswith("updated")
    assert log.errors == []


async def _put_shape(url: str, app_id: str) -> int:
    import aiohttp  # noqa: PLC0415 - only this helper needs a client
    async with aiohttp.ClientSession() as s:
        async with s.put(f"{url}/ws/v1/cluster/apps/{app_id}/shape?user.name=alice",
                         json={"workers": 3, "servers": 1}) as r:
            return r.status


def test_first_view_without_javascript(served: ServedRm) -> None:
    served.call(lambda: register(served.rm.core, "n1:1"))
    with chromium_page() as (page, log):
        page.route("**/static/elastane-ui.js", lambda route: route.abort())
        page.goto(served.url + "/cluster/nodes")
        assert page.locator("#nodes a", has_text="n1:1").count() == 1
        assert page.locator("#nodes td").nth(5).inner_text() == "0 B"


def test_script_formats_as_the_server(served: ServedRm) -> None:
    # The live updates must read as the first view: the script's formatters against web_format's.
    from rm.web.format import FORMATTERS, fmt
    values: list[Any] = [None, 0, 1, 0.85, 8.144906441000103, 2.2392394644510802, 123.456, 999.6, 1536, 12345.6,
                         0.000123, 1e-6, -3.25, 185, 7400, 90000, 3 * 1024 ** 3, 2.5e6, 1_700_000_000_000, "x", True,
                         [{"node": "n1", "workers": 2, "servers": 1}, {"node": "n2", "workers": 1, "servers": 0}]]
    # age is relative to each side's clock; text is for strings (Python and JS spell floats differently).
    cases = {n: values for n in FORMATTERS if n not in ("age", "text")}
    cases["text"] = [None, "x", "<b>", True, False, 0, 185, ["a", "b"]]
    expected = {n: [fmt(n, v) for v in vs] for n, vs in cases.items()}
    with chromium_page() as (page, log):
        page.goto(served.url + "/cluster/scheduler")
        got = page.evaluate("cases => Object.fromEntries(Object.entries(cases).map("
                            "([n, vs]) => [n, vs.map(v => window.elastaneFormat(n, v))]))", cases)
    for n in expected:
        assert got[n] == expected[n], n
    assert got == expected
    assert log.errors == []
