"""`elastane ps submit | status` without a cluster: flag parsing and client-side spec validation
(exit 2 naming the field, nothing sent), the progress bar's rendering, and both commands against a
scripted fake RM whose PS app serves an AM /status endpoint on the same port."""
from __future__ import annotations

import io
import json
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import pytest

from cli_runner import run_cli as run
from elastane_cli import main as cli
from elastane_cli import ps_commands, ps_reports
from protocol.ps_status import HeldoutStatus, decode_status
from elastane_cli.progress_bar import EpochPoint, EpochProgress, ProgressBar, format_progress
from elastane_cli.tables import format_duration
from threaded_http import serve_routes

APP = "application_1700000000000_0001"
DIAG = ("final objective 0.5123 after 3 epochs (converged; initial 1.6; held-out accuracy 0.81, "
        "chance_accuracy 0.2)")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def kv(out: str) -> dict[str, str]:
    """The `key : value` lines of a report, whatever their alignment."""
    return {k.strip(): v.strip() for k, sep, v in (ln.partition(" : ") for ln in out.splitlines()) if sep}


# ----- parsing and validation ----------------------------------------------------------------------

@pytest.mark.parametrize("args, message", [
    (["--app", "mlr", "--workers", "0"], "workers: Expected `int` >= 1 (set by --workers)"),
    (["--app", "mlr", "--workers", "100"], "workers: 100 workers but the mlr data has only"),
    (["--app", "mlr", "--hparam", "learning_rate=0"], "hparams.learning_rate: Expected `float` > 0.0"),
    (["--app", "mlr", "--hparam", "momentum=0.9"], "hparams.momentum: unknown field"),
    (["--app", "mlr", "--set", "data.bogus=1"], "data.bogus: unknown field"),
    (["--app", "nmf", "--set", "data.observed_fraction=2"], "data.observed_fraction"),
    (["--app", "mlr", "--staleness", "3"], "staleness: 3 needs sync \"ssp\""),
    (["--app", "mlr", "--servers", "4", "--blocks", "2"], "blocks: 2 model blocks"),
    (["--app", "mlr", "--executor-memory", "10"], "executor_memory_mb: Expected `int` >= 64 "
                                                  "(set by --executor-memory)"),
    (["--app", "mlr", "--set", "nope=1"], "nope: unknown field"),
    (["--app", "mlr", "--early-stopping", "0"], "early_stopping: Expected `int` >= 1 (set by --early-stopping)"),
    (["--app", "mlr", "--early-stopping", "3", "--set", "heldout_every_epochs=0"],
     "early_stopping: needs the held-out metric while training"),
    (["--workers", "2"], "app: required field is missing"),
    (["--app", "svm"], "app: unknown app 'svm'"),
    (["--app", "mlr", "--sync", "asp"], "invalid choice: 'asp'"),
    (["--app", "mlr", "--workers", "two"], "invalid int value: 'two'"),
    (["--app", "mlr", "--set", "data.num_samples"], "--set expects FIELD=VALUE"),
    (["--app", "mlr", "--hparam", "=3"], "--hparam expects FIELD=VALUE"),
    (["--app", "mlr", "--set", "data=3", "--set", "data.seed=1"], "--set data.seed: data is not an object"),
    (["--app", "mlr", "--set", "preset.x=1"], "preset: Expected `str`, got `object`\n"),
    (["--app", "mlr", "--max-attempts", "0"], "--max-attempts must be positive, got 0"),
    (["--app", "mlr", "--max-attempts", "two"], "--max-attempts must be an integer, got 'two'"),
])
def test_bad_submit_exits_2_naming_the_field_and_sends_nothing(args: list[str], message: str,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    # No RM listens at this URL: reaching it would exit 1, so exit 2 proves nothing was sent.
    code, out, err = run(["--rm", f"http://127.0.0.1:{_free_port()}", "ps", "submit", *args], capsys)
    assert code == 2, err
    assert message in err
    assert "Submitted" not in out


def test_spec_file_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rm = ["--rm", f"http://127.0.0.1:{_free_port()}"]
    code, _, err = run([*rm, "ps", "submit", "--spec-file", str(tmp_path / "missing.json")], capsys)
    assert code == 2 and "--spec-file: cannot read" in err
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    code, _, err = run([*rm, "ps", "submit", "--spec-file", str(bad)], capsys)
    assert code == 2 and "is not valid JSON" in err
    bad.write_text("[1, 2]")
    code, _, err = run([*rm, "ps", "submit", "--spec-file", str(bad)], capsys)
    assert code == 2 and "must hold a JSON object, got list" in err
    bad.write_text(json.dumps({"app": "lda", "hparams": {"alpha": -1}}))
    code, _, err = run([*rm, "ps", "submit", "--spec-file", str(bad)], capsys)
    assert code == 2 and "hparams.alpha: Expected `float` > 0.0" in err


def test_flags_override_the_spec_file_with_typed_values(tmp_path: Path) -> None:
    f = tmp_path / "job.json"
    f.write_text(json.dumps({"app": "mlr", "workers": 4, "servers": 2, "data": {"num_samples": 4000},
                             "hparams": {"learning_rate": 0.1, "batch_size": 10}}))
    args = cli.build_parser().parse_args([
        "ps", "submit", "--spec-file", str(f), "--workers", "3", "--sync", "ssp", "--staleness", "1",
        "--set", "data.seed=7", "--set", "data.rows_per_block=500", "--hparam", "learning_rate=0.25",
        "--hparam", "l2=1e-4", "--max-epochs", "6", "--executor-memory", "300", "--executor-vcores", "2",
        "--set", "checkpoint_every_epochs=2"])
    spec = ps_commands.validate_spec(*ps_commands.spec_from_args(args))
    assert (spec.app, spec.workers, spec.servers, spec.sync, spec.staleness) == ("mlr", 3, 2, "ssp", 1)
    assert spec.data == {"num_samples": 4000, "seed": 7, "rows_per_block": 500}
    assert spec.hparams == {"learning_rate": 0.25, "batch_size": 10, "l2": 1e-4}
    assert (spec.max_epochs, spec.executor_memory_mb, spec.executor_vcores) == (6, 300, 2)
    assert spec.checkpoint_every_epochs == 2
    assert ps_commands.max_epochs_of(spec) == 6
    assert ps_commands.max_epochs_of({"app": "nmf"}) == 30          # the app's default
    assert ps_commands.max_epochs_of({"app": "nmf", "hparams": {"max_epochs": 7}}) == 7
    assert ps_commands.parse_value("abc") == "abc" and ps_commands.parse_value("true") is True


# ----- progress bar ---------------------------------------------------------------------------------

def _history(n: int, start: float = 100.0, wall: float = 2.0) -> list[EpochPoint]:
    return [EpochPoint(i, 1.0 / (i + 2), 1.5, start + wall * (i + 1)) for i in range(n)]


def test_progress_line_shows_epoch_bar_objective_epoch_time_and_eta() -> None:
    p = EpochProgress("TRAINING", 5, 20, _history(5), initial_objective=1.6)
    text = format_progress(p, width=20)
    assert text.startswith("epoch  5/20 [#####...............]")
    assert "objective 0.166667" in text and "epoch 1.50s" in text
    assert "ETA <=30.0s" in text        # 15 epochs left x 2.0 s of wall time between epoch ends
    assert p.wall_time_per_epoch_s() == pytest.approx(2.0)


def test_progress_before_training_and_when_converged() -> None:
    waiting = format_progress(EpochProgress("LAUNCHING_WORKERS", 0, 8), width=8)
    assert waiting == "epoch 0/8 [........]  objective -  (LAUNCHING_WORKERS)"
    first = EpochProgress("TRAINING", 1, 8, _history(1))
    assert first.eta_s() == pytest.approx(7 * 1.5)   # one epoch: its training time stands in
    done = format_progress(EpochProgress("FINISHING", 4, 8, _history(4), converged=True), width=8)
    assert "[####....]" in done and "converged" in done and "ETA" not in done and "(FINISHING)" in done
    full = format_progress(EpochProgress("TRAINING", 8, 8, _history(8)), width=8)
    assert "[########]" in full


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_bar_redraws_in_place_on_a_tty_and_prints_a_line_per_epoch_otherwise() -> None:
    frames = [EpochProgress("TRAINING", n, 4, _history(n)) for n in (1, 1, 2, 2, 3)]
    pipe = io.StringIO()
    bar = ProgressBar(pipe, width=4)
    for f in frames:
        bar.update(f)
    bar.finish()
    lines = pipe.getvalue().splitlines()
    assert [ln.split("[")[0].strip() for ln in lines] == ["epoch 1/4", "epoch 2/4", "epoch 3/4"]
    assert "\r" not in pipe.getvalue()

    tty = Tty()
    bar = ProgressBar(tty, width=4)
    for f in frames:
        bar.update(f)
    bar.finish()
    text = tty.getvalue()
    assert text.count("\r") == len(frames) and text.endswith("\n") and text.count("\n") == 1


# ----- against a fake RM + AM -------------------------------------------------------------------------

@dataclass
class FakePsCluster:
    """The RM's app endpoints and, at /am/status, the PS AM's status; the app advances one step per
    RM poll through `script` (RM state, AM status or None)."""

    address: str = ""
    script: list[tuple[str, dict[str, Any] | None]] = field(default_factory=list)
    final: dict[str, Any] = field(default_factory=dict)
    app_type: str = "ELASTANE_PS"
    submissions: list[tuple[dict[str, Any], dict[str, list[str]]]] = field(default_factory=list)
    step: int = -1
    am_up: bool = True

    def app(self) -> dict[str, Any]:
        base = {"id": APP, "name": "ps-mlr-tiny", "user": "alice", "applicationType": self.app_type,
                "elapsedTime": 4200, "trackingUrl": None, "diagnostics": ""}
        if self.step >= len(self.script):
            return {**base, "state": "FINISHED", "finalStatus": "SUCCEEDED", "diagnostics": DIAG,
                    "shape": {"workers": 2, "servers": 1, "epoch": 1, "objective": 0.6}, **self.final}
        state, _ = self.script[max(self.step, 0)]
        base.update(state=state, finalStatus="UNDEFINED")
        if state == "RUNNING":
            base["trackingUrl"] = f"http://{self.address}/am/"
        return base

    def route(self, method: str, path: str, query: dict[str, list[str]], body: Any) -> tuple[int, Any]:
        apps = "/ws/v1/cluster/apps"
        if method == "POST" and path == apps + "/new-application":
            return 200, {"application-id": APP}
        if method == "POST" and path == apps:
            self.submissions.append((body, query))
            return 202, None
        if method == "GET" and path == f"{apps}/{APP}":
            self.step += 1
            return 200, {"app": self.app()}
        if method == "GET" and path.startswith(apps + "/"):
            return 404, {"RemoteException": {"exception": "NotFoundException", "message": "app not found",
                                             "javaClassName": "x"}}
        if method == "GET" and path == "/am/status" and self.am_up:
            status = self.script[min(max(self.step, 0), len(self.script) - 1)][1]
            return (200, status) if status is not None else (503, None)
        return 404, None


def am_status(state: str, epochs: int, final_metrics: dict[str, float] | None = None) -> dict[str, Any]:
    mb = {"rss_mb": 101.5, "data_mb": 1.5, "model_mb": 0.0}
    return {
        "app": "mlr", "state": state, "epoch": epochs, "converged": False, "initial_objective": 1.6,
        "spec": {"app": "mlr", "workers": 2, "servers": 1, "max_epochs": 4, "preset": "tiny", "sync": "bsp"},
        "num_blocks": 4, "data_mb": 3.0, "model_mb": 0.004, "final_metrics": final_metrics,
        "objective_history": [{"epoch": i, "objective": 1.0 / (i + 2), "epoch_time_s": 0.25,
                               "time": 1000.0 + i} for i in range(epochs)],
        "shape": {"workers": 2, "servers": 1, "executors": [
            {"id": "server-0", "role": "server", "state": "READY", "node": "127.0.0.1:1", "container_id": "c_2",
             "rss_mb": 90.0, "data_mb": 0.0, "model_mb": 0.004, "blocks": [0, 1, 2, 3]},
            {"id": "worker-0", "role": "worker", "state": "READY", "node": "127.0.0.1:2", "container_id": "c_3",
             **mb, "blocks": [0, 1, 2, 4]},
            {"id": "worker-1", "role": "worker", "state": "READY", "node": "127.0.0.1:2", "container_id": "c_4",
             **mb, "blocks": [5]}]},
    }


@pytest.fixture
def fake() -> Iterator[FakePsCluster]:
    f = FakePsCluster()

    with serve_routes(lambda *request: f.route(*request), ("GET", "POST")) as address:   # late: tests patch route
        f.address = address
        yield f


@pytest.fixture(autouse=True)
def fast_polls(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ps_commands, "POLL_S", 0.01)


def test_status_of_a_running_job_shows_shape_executors_and_history(fake: FakePsCluster,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    fake.script = [("RUNNING", am_status("TRAINING", 3))]
    code, out, err = run(["--rm", f"http://{fake.address}", "ps", "status", APP, "--history", "2"], capsys)
    assert code == 0, err
    assert "RUNNING (job phase TRAINING)" in out
    assert "2 workers, 1 server, 4 blocks, sync bsp" in out
    assert kv(out)["Epoch"] == "3/4" and kv(out)["Objective"] == "0.25 (initial 1.6)"
    assert "0.250s training, 1.000s wall per epoch" in out
    rows = {ln.split()[0]: ln.split() for ln in out.splitlines() if ln.startswith(("server-", "worker-"))}
    assert rows["server-0"][1:] == ["server", "READY", "127.0.0.1:1", "c_2", "90.0", "0.000", "0.004", "0-3"]
    assert rows["worker-0"][5:] == ["101.5", "1.500", "0.000", "0-2,4"]
    epochs = [ln.split() for ln in out.split("Recent epochs:")[1].splitlines()[2:]]
    assert epochs == [["1", "0.333333", "0.250s"], ["2", "0.25", "0.250s"]]


def user_app_status(epochs: int, max_epochs: int | None) -> dict[str, Any]:
    """A user app's AM status: its spec names no epoch limit (the class's HParams default does)."""
    heldout = {"metric": "", "value": None, "epoch": epochs - 1,
               "history": [{"epoch": epochs - 1, "value": None, "objective": 0.3, "metrics": {"rmse": 0.125}}]}
    return {**am_status("TRAINING", epochs), "app": "mymodel:MyApp", "max_epochs": max_epochs, "heldout": heldout,
            "spec": {"app": "mymodel:MyApp", "workers": 2, "servers": 1, "preset": "tiny", "sync": "bsp"}}


def test_status_of_a_user_app_takes_its_epoch_limit_and_metrics_from_the_am(
        fake: FakePsCluster, capsys: pytest.CaptureFixture[str]) -> None:
    fake.script = [("RUNNING", user_app_status(49, 300))]
    code, out, err = run(["--rm", f"http://{fake.address}", "ps", "status", APP], capsys)
    assert code == 0, err
    report = kv(out)
    assert report["Epoch"] == "49/300"
    # 251 epochs left at 1.000s of wall time each
    assert report["ETA"] == f"<= {format_duration(251.0)}"
    assert report["Held-Out"] == "rmse 0.125 after epoch 49"
    line = format_progress(ps_reports.progress_from_status(decode_status(user_app_status(49, 300))))
    assert "epoch  49/300" in line and "held-out rmse 0.125" in line and "ETA <=4m11s" in line
    # An older AM that does not say: the limit the client knew (its copy of the app class), else the spec's
    assert ps_reports.progress_from_status(decode_status(user_app_status(49, None)), 300).max_epochs == 300
    spec = {"app": "mymodel:MyApp", "max_epochs": 120}
    assert ps_reports.max_epochs_of(spec) == 120
    assert ps_reports.max_epochs_of({"app": "mymodel:MyApp", "hparams": {"max_epochs": 80}}) == 80
    assert ps_reports.max_epochs_of({"app": "mymodel:MyApp"}) == 0    # unknown here without the class

    class HParams:
        max_epochs = 300

    class App:
        hparams = HParams()

    assert ps_reports.max_epochs_of({"app": "mymodel:MyApp"}, App()) == 300


def test_status_of_an_ended_job_shows_what_the_rm_knows(fake: FakePsCluster,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(["--rm", f"http://{fake.address}", "ps", "status", APP], capsys)
    assert code == 0, err
    assert "FINISHED" in out and "SUCCEEDED" in out
    report = kv(out)
    assert report["Final-Objective"] == "0.5123 after 3 epochs"
    assert report["Held-Out-Metrics"] == "accuracy 0.81, chance_accuracy 0.2"
    assert report["Last-Shape"] == "2 workers, 1 server" and report["Diagnostics"] == DIAG


def test_status_when_the_am_does_not_answer_or_the_app_is_not_ps(fake: FakePsCluster,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    fake.script = [("RUNNING", None)]
    fake.am_up = False
    code, out, err = run(["--rm", f"http://{fake.address}", "ps", "status", APP], capsys)
    assert code == 0 and kv(out)["State"] == "RUNNING"
    assert "status is not available" in err and "/am/status" in err
    fake.app_type, fake.step = "MAPREDUCE", -1
    code, out, err = run(["--rm", f"http://{fake.address}", "ps", "status", APP], capsys)
    assert code == 2 and "is not a PS job (application type MAPREDUCE)" in err
    code, out, err = run(["--rm", f"http://{fake.address}", "ps", "status", "application_1_0009"], capsys)
    assert code == 2 and "app not found" in err


def test_submit_wait_shows_each_epoch_and_the_final_result(fake: FakePsCluster,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    fake.script = [("ACCEPTED", None), ("RUNNING", am_status("LAUNCHING_SERVERS", 0)),
                   ("RUNNING", am_status("TRAINING", 1)), ("RUNNING", am_status("TRAINING", 1)),
                   ("RUNNING", am_status("TRAINING", 2)), ("RUNNING", am_status("TRAINING", 3)),
                   ("RUNNING", am_status("SUCCEEDED", 3, {"accuracy": 0.8123, "chance_accuracy": 0.2}))]
    code, out, err = run(["--rm", f"http://{fake.address}", "--user", "alice", "ps", "submit", "--app", "mlr",
                          "--workers", "2", "--max-epochs", "4", "--hparam", "learning_rate=0.3",
                          "--queue", "default", "--wait"], capsys)
    assert code == 0, err
    (body, query), = fake.submissions
    assert query["user.name"] == ["alice"]
    assert body["application-id"] == APP and body["application-type"] == "ELASTANE_PS"
    assert body["application-name"] == "ps-mlr-tiny"
    assert body["max-app-attempts"] == ps_commands.DEFAULT_MAX_ATTEMPTS == 2   # a retry resumes the job
    job = body["elastane"]["ps-job"]
    assert (job["app"], job["workers"], job["max_epochs"], job["hparams"]) == ("mlr", 2, 4, {"learning_rate": 0.3})
    lines = out.splitlines()
    assert lines[0] == f"Submitted application {APP}"
    bars = [ln for ln in lines if ln.startswith("epoch ")]
    assert [b.split("[")[0].strip() for b in bars] == ["epoch 0/4", "epoch 1/4", "epoch 2/4", "epoch 3/4",
                                                       "epoch 3/4"]
    assert "(LAUNCHING_SERVERS)" in bars[0] and "(SUCCEEDED)" in bars[-1]
    assert kv(out)["Final-Objective"] == "0.25 after 3 epochs (initial 1.6)"
    assert kv(out)["Held-Out-Metrics"] == "accuracy 0.8123, chance_accuracy 0.2"


def test_submit_sends_the_max_attempts_asked_for(fake: FakePsCluster, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(["--rm", f"http://{fake.address}", "ps", "submit", "--app", "mlr", "--max-attempts", "3"],
                         capsys)
    assert code == 0, err
    (body, _), = fake.submissions
    assert body["max-app-attempts"] == 3 and out == f"Submitted application {APP}\n"


def test_submit_wait_draws_the_end_of_a_job_that_trained_through_between_two_polls(
        fake: FakePsCluster, capsys: pytest.CaptureFixture[str]) -> None:
    # Found on a fast CI host: a tiny job went ACCEPTED -> FINISHED between polls, no bar at all.
    fake.script = [("ACCEPTED", None)]
    code, out, err = run(["--rm", f"http://{fake.address}", "ps", "submit", "--app", "mlr", "--max-epochs", "4",
                          "--wait"], capsys)
    assert code == 0, err
    bars = [ln for ln in out.splitlines() if ln.startswith("epoch ")]
    assert len(bars) == 1 and bars[0].startswith("epoch 3/4 [") and "0.5123" in bars[0], out
    assert kv(out)["Final-Objective"] == "0.5123 after 3 epochs"


def test_submit_wait_exits_1_when_the_job_fails_and_reports_from_diagnostics(
        fake: FakePsCluster, capsys: pytest.CaptureFixture[str]) -> None:
    fake.script = [("RUNNING", am_status("TRAINING", 1))]
    fake.final = {"state": "FINISHED", "finalStatus": "FAILED",
                  "diagnostics": "worker-1 (worker, c_4 on 127.0.0.1:2) exited with 137"}
    code, out, err = run(["--rm", f"http://{fake.address}", "ps", "submit", "--app", "mlr", "--wait"], capsys)
    assert code == 1
    assert "FINISHED/FAILED" in out and "exited with 137" in out
    assert kv(out)["Last-Objective"] == "0.5 after 1 epoch (initial 1.6)" and "Final-Objective" not in out


def test_final_objective_comes_from_the_am_diagnostics_when_its_last_status_was_missed() -> None:
    result = ps_commands.WatchResult(
        app={"id": APP, "state": "FINISHED", "finalStatus": "SUCCEEDED", "diagnostics": DIAG},
        status=decode_status(am_status("TRAINING", 1)))
    pairs = dict(ps_commands.final_report(result))
    assert pairs["Final-Objective"] == "0.5123 after 3 epochs (initial 1.6)"
    assert pairs["Held-Out-Metrics"] == "accuracy 0.81, chance_accuracy 0.2"


def test_submit_with_a_spec_the_rm_refuses_exits_2(fake: FakePsCluster, capsys: pytest.CaptureFixture[str],
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(method: str, path: str, query: Any, body: Any) -> tuple[int, Any]:
        if method == "POST" and path.endswith("/apps"):
            return 400, {"RemoteException": {"exception": "BadRequestException",
                                             "message": "queue 'nope' does not exist", "javaClassName": "x"}}
        return FakePsCluster.route(fake, method, path, query, body)
    monkeypatch.setattr(fake, "route", refuse)
    code, out, err = run(["--rm", f"http://{fake.address}", "ps", "submit", "--app", "mlr", "--queue", "nope"],
                         capsys)
    assert code == 2 and "queue 'nope' does not exist" in err


HELDOUT = {"metric": "cross_entropy", "maximize": False, "true_model_metric": "true_model_cross_entropy",
           "value": 0.72, "true_model_value": 0.49, "epoch": 3,
           "best": {"epoch": 1, "value": 0.65, "objective": 0.5, "metrics": {}},
           "early_stopping": 4, "warning": ("the training objective improved since epoch 2 (0.5 -> 0.2) while held-out "
                                            "cross_entropy worsened (0.65 -> 0.72): the model overfits"),
           "history": []}


def test_status_and_progress_show_heldout_next_to_the_objective_and_warn_on_divergence(
        fake: FakePsCluster, capsys: pytest.CaptureFixture[str]) -> None:
    fake.script = [("RUNNING", {**am_status("TRAINING", 4), "heldout": HELDOUT})]
    code, out, err = run(["--rm", f"http://{fake.address}", "ps", "status", APP], capsys)
    assert code == 0, err
    report = kv(out)
    assert report["Held-Out"] == ("cross_entropy 0.72 (true 0.49) after epoch 4, best 0.65 after epoch 2, "
                                  "early stopping after 4 epochs without improvement")
    assert report["Warning"].endswith("worsened (0.65 -> 0.72): the model overfits")
    line = format_progress(ps_reports.progress_from_status(decode_status({**am_status("TRAINING", 4), "heldout": HELDOUT})))
    assert "objective 0.2  held-out cross_entropy 0.72 (true 0.49)  OVERFITTING" in line
    # not scored yet: no held-out on the bar, and the status says so
    assert "held-out" not in format_progress(ps_reports.progress_from_status(decode_status(am_status("TRAINING", 1))))
    assert ps_reports.heldout_text(HeldoutStatus(metric="cross_entropy", value=None)) == "not scored yet (cross_entropy)"


def test_final_report_names_the_stop_criterion_and_the_true_model() -> None:
    metrics = {"accuracy": 0.77, "cross_entropy": 0.65, "chance_accuracy": 0.2, "true_model_accuracy": 0.81,
               "true_model_cross_entropy": 0.49}
    diag = ("final objective 0.59 after 9 epochs (early stopping: held-out cross_entropy did not improve for 4 "
            "epochs (best 0.64 after epoch 5); initial 1.61; accuracy 0.77 vs true model 0.81 (meets within 0.05 "
            "of the true model); held-out accuracy 0.77, cross_entropy 0.65)")
    status = {**am_status("SUCCEEDED", 9, metrics), "heldout": {**HELDOUT, "warning": None},
              "stop_criterion": "early stopping: held-out cross_entropy did not improve for 4 epochs"}
    pairs = dict(ps_commands.final_report(ps_commands.WatchResult(
        app={"id": APP, "state": "FINISHED", "finalStatus": "SUCCEEDED", "diagnostics": diag}, status=decode_status(status))))
    assert pairs["Stopped-By"] == "early stopping: held-out cross_entropy did not improve for 4 epochs"
    assert pairs["Vs-True-Model"] == "accuracy 0.77 vs true model 0.81 (meets within 0.05 of the true model)"
    assert "Warning" not in pairs
    # the metrics are the last "held-out" of the diagnostics, whatever comes before
    assert ps_reports.final_from_diagnostics(diag) == ("0.59", "9", "accuracy 0.77, cross_entropy 0.65")
    # a last status seen before the end: the same from the diagnostics
    older = dict(ps_commands.final_report(ps_commands.WatchResult(
        app={"id": APP, "state": "FINISHED", "finalStatus": "SUCCEEDED", "diagnostics": diag},
        status=decode_status(am_status("TRAINING", 8)))))
    assert older["Stopped-By"] == ("early stopping: held-out cross_entropy did not improve for 4 epochs "
                                   "(best 0.64 after epoch 5)")
    assert older["Vs-True-Model"] == pairs["Vs-True-Model"]
    assert older["Held-Out-Metrics"] == "accuracy 0.77, cross_entropy 0.65"


def test_submit_checks_a_user_app_among_its_shipped_files_and_takes_its_epoch_limit(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`ps submit --py-files sub/fileapp.py --files data/linreg.npz`: the app is checked where its
    data file is linked by name, as in its containers (relative flags, another working dir), and
    its class's max_epochs is what the progress bar shows."""
    from elastane_cli.context import CliContext
    from elastane_cli.errors import UsageError
    from elastane_cli.staging import ShippedFiles
    from user_app_source import file_linreg_source, write_linreg_data

    monkeypatch.chdir(tmp_path)
    (tmp_path / "sub").mkdir()
    (tmp_path / "data").mkdir()
    (tmp_path / "sub" / "fileappcheck.py").write_text(file_linreg_source(max_epochs=300))
    write_linreg_data(tmp_path / "data" / "linreg.npz", rows=150)        # 2 blocks of 100 rows
    shipped = ShippedFiles.from_flags(["sub/fileappcheck.py"], ["data/linreg.npz"], None)
    ctx = CliContext("http://127.0.0.1:1", "alice", tmp_path, out=io.StringIO(), err=io.StringIO())
    spec = ps_commands.validate_spec({"app": "fileappcheck:FileLinRegApp", "workers": 3}, {})
    with pytest.raises(UsageError, match="3 workers but the fileappcheck:FileLinRegApp data has only 2 input blocks"):
        ps_commands.check_user_app(spec, shipped, ctx)
    spec = ps_commands.validate_spec({"app": "fileappcheck:FileLinRegApp", "workers": 2}, {})
    app = ps_commands.check_user_app(spec, shipped, ctx)
    assert ps_commands.max_epochs_of(spec, app) == 300 and ctx.err.getvalue() == ""
    assert Path.cwd() == tmp_path
