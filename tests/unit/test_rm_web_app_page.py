"""The RM web UI's per-application page (/cluster/app/{id}) and the shape history behind it."""
from __future__ import annotations

import re

import pytest

from protocol import internal_api as api
from protocol import tokens
from protocol.job_report import JobReport
from rm.shape_history import ShapeHistory, ShapeSample
from rm_testing import SECRET, launch_and_register, ps_spec
from web_page_env import PageEnv, page_env_of


# ----- ShapeHistory on its own -------------------------------------------------------------------

def test_history_records_changes_and_skips_repeats():
    h = ShapeHistory()
    h.record(10.0, JobReport(workers=2, servers=1, speed=1.0))
    h.record(11.0, JobReport(workers=2, servers=1, speed=1.0))      # a repeated heartbeat
    h.record(12.0, JobReport(workers=4, servers=1, speed=1.5))
    h.record(13.0, JobReport(workers=4, servers=2, speed=2.0))
    assert [(c.t, c.before, c.after) for c in h.changes] == [
        (10.0, None, (2, 1)), (12.0, (2, 1), (4, 1)), (13.0, (4, 1), (4, 2))]
    assert [s.t for s in h.samples] == [10.0, 12.0, 13.0]


def test_history_is_bounded_and_spans_the_whole_life():
    h = ShapeHistory(max_samples=10, max_changes=5)
    for i in range(1000):
        h.record(float(i), JobReport(workers=1 + i % 3, servers=1, iterations=i))
    assert len(h.samples) <= 11 and len(h.changes) == 5
    assert h.samples[0].t == 0.0 and h.samples[-1].t == 999.0
    assert [s.t for s in h.samples] == sorted(s.t for s in h.samples)


def test_sample_keeps_the_scalar_fields_and_drops_non_finite_numbers():
    s = ShapeSample.from_report(1.0, JobReport(workers=2, servers=1, speed=float("inf"), epoch=3, objective=0.5,
                                               epoch_time_s=float("nan"), changing=True))
    assert (s.workers, s.servers, s.speed, s.epoch, s.objective, s.changing) == (2, 1, None, 3, 0.5, True)
    assert s.epoch_time_s is None
    before_any_epoch = ShapeSample.from_report(1.0, JobReport(workers=2, servers=1))
    assert (before_any_epoch.epoch, before_any_epoch.epoch_time_s, before_any_epoch.objective) == (None, None, None)


# ----- the page over HTTP --------------------------------------------------------------------------

@pytest.fixture
async def page_env(tmp_path):
    async for env in page_env_of(tmp_path):
        yield env


async def test_plain_app_page_and_link_from_cluster_page(page_env: PageEnv):
    app_id = page_env.submit(name="wordcount")
    apps = await page_env.get("/cluster/apps")
    assert f'href="/cluster/app/{app_id}"' in apps
    page = await page_env.get(f"/cluster/app/{app_id}")
    for text in (app_id, "wordcount", "alice", "default", "YARN", "ACCEPTED", "UNDEFINED"):
        assert text in page
    assert "Current shape" not in page and "<svg" not in page


async def test_unknown_app_is_404_html(page_env: PageEnv):
    page = await page_env.get("/cluster/app/application_1_9999", status=404)
    assert "not found" in page.lower() and "application_1_9999" in page
    page = await page_env.get("/cluster/app/%3Cscript%3Ex", status=404)
    assert "<script>" not in page and "&lt;script&gt;" in page


async def test_user_values_are_escaped(page_env: PageEnv):
    app_id = page_env.submit(name="<script>alert(1)</script>")
    core = page_env.rm.core
    claims = launch_and_register(core, app_id)
    core.am_finish(claims, api.AmFinishRequest(final_status="FAILED", diagnostics='<img src=x onerror="boom">'))
    for path in (f"/cluster/app/{app_id}", "/cluster/apps", "/cluster/apps/FINISHED"):
        page = await page_env.get(path)
        assert "<script>alert" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    page = await page_env.get(f"/cluster/app/{app_id}")
    assert "<img" not in page and "&lt;img src=x" in page


def field(html: str, label: str) -> str:
    """The value cell of a field table's row `label`, tags stripped."""
    m = re.search(r"<th>" + re.escape(label) + r"</th><td[^>]*>(.*?)</td>", html)
    assert m, f"no field {label!r}"
    return re.sub(r"<[^>]+>", "", m.group(1))


def _report(workers: int, servers: int, iterations: int, speed: float, epoch: int, epoch_time: float,
            objective: float, refused: str = "") -> JobReport:
    return JobReport.decode({"workers": workers, "servers": servers, "started": True, "changing": False,
            "iterations": iterations, "early_feedback": iterations >= 100, "early_feedback_iterations": 100,
            "speed": speed, "speed_iterations": 20, "executor_resource": {"memory": 512, "vCores": 1},
            "directive_version": 0, "epoch": epoch, "epoch_time_s": epoch_time, "objective": objective,
            "phase": "TRAINING", "worker_times": {"compute_s": 0.012, "comm_s": 0.003, "workers": workers},
            "memory_mb": 100.0 * (workers + servers), "directive_refused": refused})


async def test_ps_app_page_shows_shape_changes_and_charts(page_env: PageEnv):
    core = page_env.rm.core
    app_id = page_env.submit(name="mf", app_type="ELASTANE_PS")
    claims = launch_and_register(core, app_id)
    page = await page_env.get(f"/cluster/app/{app_id}")
    assert "has not reported its shape yet" in page
    reports = [_report(2, 1, 50, 1.0, 1, 50.0, 0.9), _report(2, 1, 120, 1.1, 2, 45.0, 0.7),
               _report(4, 1, 200, 2.0, 3, 25.0, 0.5),
               _report(4, 2, 300, 2.6, 4, 19.0, 0.4, refused="9 workers is more than the maximum of 8")]
    for i, rep in enumerate(reports):
        page_env.clock.advance(30)
        core.allocate(claims, api.AllocateRequest(response_id=i, progress=0.1 * i, shape=rep))
    page = await page_env.get(f"/cluster/app/{app_id}")
    shape = page.split("<h2>Current shape</h2>")[1].split("<h2>")[0]
    assert "has not reported" not in shape
    expected = {"Workers": "4", "Servers": "2", "Iterations": "300", "Speed": "2.6 it/s", "Phase": "TRAINING",
                "Epoch": "4", "Last epoch time": "19 s", "Objective": "0.4", "Memory in use": "600 MB",
                "Worker compute per mini-batch": "12 ms", "Worker communication per mini-batch": "3 ms",
                "Alpha (Harmony)": "N/A", "Executor memory": "512 MB",
                "Directive refused, why": "9 workers is more than the maximum of 8"}
    assert {k: field(shape, k) for k in expected} == expected
    changes = page.split("<h2>Shape changes</h2>")[1].split("<h2>")[0]
    rows = re.findall(r"<tr>(.*?)</tr>", changes)[1:]
    cells = [re.findall(r"<td>(.*?)</td>", r) for r in rows]
    assert [c[2:] for c in cells] == [["2", "1"], ["2 &rarr; 4", "1"], ["4", "1 &rarr; 2"]]
    assert [c[1] for c in cells] == ["30", "90", "120"]
    charts = page.split("<h2>Training over time</h2>")[1]
    for title in ("Speed (iterations/s)", "Epoch time (s)", "Objective"):
        assert f'aria-label="{title}"' in charts
    speed_svg = charts.split('aria-label="Speed (iterations/s)"')[1].split("</svg>")[0]
    assert len(re.search(r'<polyline[^>]* points="([^"]*)"', speed_svg).group(1).split()) == 4
    # The shape changes are marked on the time axis of every chart.
    assert speed_svg.count('class="marker shape"') == 3
    assert "shape: 2 \u2192 4 workers, 1 \u2192 1 servers" in speed_svg


async def test_ps_app_page_shows_the_job_spec_the_rm_keeps(page_env: PageEnv):
    spec = ps_spec({"app": "lasso", "workers": 2, "max_workers": 6, "servers": 1, "sync": "ssp", "max_epochs": 9,
                    "executor_memory_mb": 700, "weight": 2.5})
    app_id = page_env.submit(app_type="ELASTANE_PS", ps_job=spec)
    page = await page_env.get(f"/cluster/app/{app_id}")
    section = page.split("<h2>Job spec</h2>")[1].split("<h2>")[0]
    expected = {"App": "lasso", "Synchronisation": "SSP (staleness 2)", "Workers (min-max)": "2 (1-6)",
                "Servers (min-max)": "1 (1-1)", "Executor": "704 MB, 1 vcores", "Epoch limit": "9",
                "Weight": "2.5", "Elastic changes": "eps, optimizer off"}
    assert {k: field(section, k) for k in expected} == expected     # 700 MB as granted: in 32 MB steps
    plain = page_env.submit(app_type="ELASTANE_PS")                  # no spec: no section
    assert "<h2>Job spec</h2>" not in await page_env.get(f"/cluster/app/{plain}")


async def test_ps_app_bad_shape_report_changes_no_history(page_env: PageEnv):
    core = page_env.rm.core
    app_id = page_env.submit(app_type="ELASTANE_PS")
    claims = launch_and_register(core, app_id)
    token = tokens.sign(SECRET, tokens.AM, claims, 3600, now=page_env.clock())
    resp = await page_env.client.post(api.AM_ALLOCATE, json={"response_id": 0, "shape": {"workers": -1, "servers": 1}},
                                      headers={"Authorization": f"Bearer {token}"})
    assert resp.status == 400 and "$.shape.workers" in (await resp.json())["RemoteException"]["message"]
    assert len(core.apps[app_id].shape_history) == 0 and not core.apps[app_id].shape_history.changes
    page = await page_env.get(f"/cluster/app/{app_id}")
    assert "Speed (iterations/s): no data reported yet." in page
