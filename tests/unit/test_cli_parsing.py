"""`elastane` argument parsing, exit codes and error messages (no daemons needed)."""
from __future__ import annotations

import socket
from pathlib import Path

import pytest

from cli_runner import run_cli as run
from elastane_cli import main as cli
from elastane_cli.context import resolve_rm_url


@pytest.mark.parametrize("argv, message", [
    ([], "required"),
    (["bogus"], "invalid choice"),
    (["app"], "required"),
    (["app", "list", "--state", "RUNNNG"], "invalid state 'RUNNNG'"),
    (["app", "list", "--limit", "0"], "--limit must be positive"),
    (["app", "status", "app_1"], "invalid application id 'app_1'"),
    (["app", "kill"], "APP_ID"),
    (["app", "logs", "application_1_0001", "--file", "syslog"], "invalid choice: 'syslog'"),
    (["app", "logs", "application_1_0001", "--container", "c1"], "invalid container id 'c1'"),
    (["app", "run", "-n", "-1", "--", "true"], "-n must be positive"),
    (["app", "run", "--memory", "lots", "--", "true"], "--memory must be an integer"),
    (["app", "run", "-n", "2"], "no command given"),
    (["app", "list", "--bogus"], "unrecognized arguments: --bogus"),
    (["--rm", "localhost:8088", "node", "list"], "--rm expects a URL"),
    (["cluster", "start", "--nodes", "0"], "--nodes must be positive, got 0"),
    (["data", "import-libsvm", "x", "--rows-per-block", "ten", "-o", "y"], "--rows-per-block must be an integer, got 'ten'"),
    (["node", "decommission", "n1:1", "--timeout", "-5"], "--timeout must be a finite number >= 0, got -5"),
    (["node", "decommission", "n1:1", "--timeout", "inf"], "--timeout must be a finite number >= 0, got inf"),
    (["node", "decommission", "n1:1", "--timeout", "soon"], "--timeout must be a number, got 'soon'"),
    (["sim", "generate", "--jobs", "0"], "--jobs must be positive, got 0"),
    (["app", "run", "--lifetime", "0", "--", "true"], "--lifetime must be positive, got 0"),
    (["app", "update-lifetime", "application_1_0001", "soon"], "SECONDS must be an integer, got 'soon'"),
    (["app", "update-lifetime", "app_1", "5"], "invalid application id 'app_1'"),
    (["app", "move-to-queue", "application_1_0001"], "QUEUE"),
    (["sim", "generate", "--window-s", "nan"], "--window-s must be a finite number >= 0, got nan"),
    (["cluster", "start", "--rm-port", "99999"], "port must be in 0..65535"),
    (["cluster", "start", "--cgroups", "v3"], "invalid choice: 'v3'"),
    # node ids that are not one URL path segment: cut short by '?', or another resource's path
    (["node", "decommission", "n1:1?x"], "node id 'n1:1?x' contains '?'"),
    (["node", "decommission", "../apps/application_1_0001"], "node id '../apps/application_1_0001' contains '/'"),
    (["node", "decommission", "n1:1#f"], "node id 'n1:1#f' contains '#'"),
    (["node", "recommission", "n1 1"], "node id 'n1 1' contains ' '"),
    (["node", "decommission", ".."], "node id '..' is not a node id"),
    # a count in digits str.isdigit takes and int() does not (a traceback once)
    (["ps", "submit", "--app", "mlr", "--place", "n1:1=\u00b2,1"], "--place expects NODE=WORKERS,SERVERS"),
    # numbers JSON has no form for: sent, they arrived as null
    (["ps", "submit", "--app", "mlr", "--set", "data.logit_scale=Infinity"],
     "--set data.logit_scale: 'Infinity' is not a finite number"),
    (["ps", "submit", "--app", "mlr", "--hparam", "learning_rate=[1, NaN]"],
     "--hparam learning_rate: '[1, NaN]' is not a finite number"),
    (["data", "generate", "--app", "mlr", "--set", "num_samples=1e400", "--out", "/nonexistent/d"],
     "--set num_samples: '1e400' is not a finite number"),
])
def test_bad_usage_exits_2_with_a_message(argv: list[str], message: str,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(argv, capsys)
    assert code == 2
    assert message in err
    assert "error" in err


def test_data_out_naming_a_file_exits_2_and_leaves_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--out naming a file: bad input (2), not a failed write (1)."""
    a_file = tmp_path / "a-file"
    a_file.write_text("kept\n")
    code, out, err = run(["data", "generate", "--app", "mlr", "--out", str(a_file)], capsys)
    assert code == 2 and f"--out {a_file}: is a file, not a directory" in err
    assert a_file.read_text() == "kept\n"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("argv", [["node", "list"], ["app", "list"], ["app", "status", "application_1_0001"],
                                  ["app", "kill", "application_1_0001"], ["app", "run", "--", "true"]])
def test_unreachable_rm_exits_1_naming_the_url(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    url = f"http://127.0.0.1:{_free_port()}"
    code, out, err = run(["--rm", url, *argv], capsys)
    assert code == 1
    assert f"elastane: error: cannot reach the ResourceManager at {url}" in err


def test_rm_option_after_the_command_and_env_fallbacks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    url = f"http://127.0.0.1:{_free_port()}"
    code, _, err = run(["node", "list", "--rm", url], capsys)
    assert code == 1 and url in err
    monkeypatch.delenv("ELASTANE_RM", raising=False)
    assert resolve_rm_url(None, tmp_path) == "http://127.0.0.1:8088"
    (tmp_path / "cluster.json").write_text('{"rm_url": "http://127.0.0.1:4567"}')
    assert resolve_rm_url(None, tmp_path) == "http://127.0.0.1:4567"
    monkeypatch.setenv("ELASTANE_RM", "http://rm.example:8088/")
    assert resolve_rm_url(None, tmp_path) == "http://rm.example:8088"
    assert resolve_rm_url("http://x:1", tmp_path) == "http://x:1"


def test_cluster_stop_without_a_cluster_fails(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(["cluster", "stop", "--dir", str(tmp_path)], capsys)
    assert code == 1
    assert "no cluster recorded in" in err


def test_secret_generates_once(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    conf = tmp_path / "conf" / "cluster.toml"
    code, out, _ = run(["secret", "--conf", str(conf)], capsys)
    assert code == 0 and "generated" in out and str(conf) in out
    first = conf.read_text()
    assert 'secret = "' in first and oct(conf.stat().st_mode & 0o777) == "0o600"
    code, out, _ = run(["secret", "--conf", str(conf)], capsys)
    assert code == 0 and "already set" in out
    assert conf.read_text() == first


def test_secret_rejects_a_broken_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    conf = tmp_path / "cluster.toml"
    conf.write_text("[cluster]\nsecrett = 3\n")
    code, _, err = run(["secret", "--conf", str(conf)], capsys)
    assert code == 2 and "secrett" in err
    assert conf.read_text() == "[cluster]\nsecrett = 3\n"


def test_daemon_start_passes_flags_through(monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    seen: list[list[str]] = []
    monkeypatch.setattr(cli.daemon_commands.os, "execv", lambda path, argv: seen.append(argv))
    code, _, _ = run(["rm", "start", "--port", "0", "--policy", "eps"], capsys)
    assert code == 0
    assert seen[0][1:] == ["-m", "rm", "--port", "0", "--policy", "eps"]
    run(["nm", "start", "--memory-mb", "512"], capsys)
    assert seen[1][1:] == ["-m", "nodemanager", "--memory-mb", "512"]
