"""The RM web UI in headless Chromium (and `elastane top`) against a local cluster (RM + 2 NMs as processes) training a
real PS job: every page loads with no console error (this RM may or may not serve utilization:
either way no failed request), the app page follows the job's iterations live, a shape change
made through the RM (PUT .../shape, as `elastane ps scale` does) appears on the app's charts
and fields without a reload, and the links between the pages work."""
from __future__ import annotations

from typing import Any, Iterator

import pytest

from appmaster.ps.submission import build_ps_submission
from browser import chromium_page, skip_reason
from conftest import FINAL_STATES, app_post_mortem, get_app, kill_unless_final, pids_with_env, rest, running_cluster, submit_app
from polling import wait_until
from protocol import container_env

pytestmark = [pytest.mark.cluster,
              pytest.mark.skipif(skip_reason() is not None, reason=skip_reason() or "")]

SPEC = {"app": "mlr", "workers": 1, "servers": 1, "max_workers": 2, "max_epochs": 10_000,
        "convergence_threshold": 1e-12, "executor_memory_mb": 320, "data": {"num_samples": 4000, "seed": 3}}


@pytest.fixture(scope="module")
def ui_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    with running_cluster(tmp_path_factory.mktemp("webui-cluster"), nodes=2, node_memory_mb=1024, node_vcores=3,
                         nm_expiry_s=10, am_expiry_s=30) as c:
        yield c


def _iterations(page: Any) -> int:
    text = page.locator("#shape td").nth(5).inner_text().replace(",", "")
    return int(text) if text.isdigit() else -1


def test_web_ui_follows_a_training_ps_job(ui_cluster: Any, capsys: pytest.CaptureFixture[str]) -> None:
    from elastane_cli.main import main as cli
    rm = ui_cluster.rm_url
    app_id = submit_app(rm, build_ps_submission(SPEC, name="webui-mlr", am_memory=384))
    try:
        wait_until(lambda: (rest(rm, "GET", f"/ws/v1/cluster/apps/{app_id}/shape")["shape"]["current"] or {})
                   .get("iterations", 0) > 0, 120, "the job trains and reports to the RM")
        # `elastane top --once` lists the job with its shape and speed.
        assert cli(["--rm", rm, "top", "--once"]) == 0
        line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith(app_id))
        assert " 1/1 " in line and " it/s " in line and line.endswith("webui-mlr"), line
        with chromium_page() as (page, log):
            page.goto(rm + "/cluster")
            assert page.locator("#running-apps a", has_text=app_id).count() == 1
            page.click(f"#running-apps a:has-text('{app_id}')")
            page.wait_for_url(f"**/cluster/app/{app_id}")
            assert page.locator("#app td").nth(5).inner_text() == "RUNNING"

            # Live: the iteration count moves while the job trains, with no reload.
            first = _iterations(page)
            page.wait_for_function(
                "n => Number(document.querySelectorAll('#shape td')[5].textContent.replace(/,/g, '')) > n",
                arg=first, timeout=60_000)

            # A shape change through the RM appears in the fields and as a marker on the charts.
            shapes = page.locator("#chart-speed line.marker.shape").count()
            rest(rm, "PUT", f"/ws/v1/cluster/apps/{app_id}/shape", {"workers": 2, "servers": 1, "reason": "ui test"},
                 user="alice")
            page.wait_for_function("() => document.querySelectorAll('#shape td')[0].textContent === '2'",
                                   timeout=120_000)
            page.wait_for_function(
                f"() => document.querySelectorAll('#chart-speed line.marker.shape').length > {shapes}",
                timeout=30_000)
            assert page.locator("#chart-speed line.marker.directive").count() >= 1
            assert page.locator("#directive").inner_text().count("ui test") == 1

            # The other pages, through their links.
            page.click("nav a:has-text('Scheduler')")
            page.wait_for_url("**/cluster/scheduler")
            assert "ui test" in page.locator("#decisions").inner_text()
            page.click(f"#decisions a:has-text('{app_id}')")
            page.wait_for_url(f"**/cluster/app/{app_id}")
            page.click("nav a:has-text('Nodes')")
            page.wait_for_url("**/cluster/nodes")
            assert page.locator("#nodes tbody tr").count() == 2
            node_link = page.locator("#nodes tbody a").first
            node_id = node_link.inner_text()
            node_link.click()
            page.wait_for_url("**/cluster/node/**")
            assert page.locator("h1").inner_text() == f"Node {node_id}"
            page.click("nav a:has-text('Applications')")
            page.wait_for_url("**/cluster/apps")
            page.click(".filters a:has-text('RUNNING')")
            page.wait_for_url("**/cluster/apps/RUNNING")
            assert page.locator("#apps a", has_text=app_id).count() == 1
            page.click("nav a:has-text('Cluster')")
            page.wait_for_url("**/cluster")
            page.wait_for_function("() => Number(document.body.dataset.polls || 0) >= 1")
        assert log.errors == []
    except BaseException as e:
        e.add_note(app_post_mortem(ui_cluster, app_id))
        raise
    finally:
        kill_unless_final(rm, app_id)
        wait_until(lambda: get_app(rm, app_id)["state"] in FINAL_STATES, 60, "the job ends")
        wait_until(lambda: not pids_with_env(container_env.APP_ID, app_id), 30, "every process of the job gone")
