"""`elastane app logs` when the aggregated logs cannot be read (elastane_cli/container_logs.py):
a cluster.toml this user may not read (mode 0600, docs/operating.md) or a store that is down or
refuses the credentials -- errors that are not OSError, as s3fs lets botocore's through -- costs a
one-line warning, and the running app's logs on its live NMs are still shown."""
from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, Iterator

import fsspec  # type: ignore[import-untyped]  # no stubs
import pytest
from fsspec.spec import AbstractFileSystem  # type: ignore[import-untyped]

from elastane_cli import main as cli
from elastane_cli.container_logs import Aggregated, read_aggregated
from elastane_cli.errors import CliError
from protocol import aggregated_logs, config
from protocol.aggregated_logs import RemoteLogDir
from threaded_http import serve_routes

APP = "application_1700000000000_0001"
AM = "container_1700000000000_0001_01_000001"
DOWN = "elastanestoredown"


class EndpointConnectionError(Exception):
    """What botocore raises for an S3 endpoint it cannot reach (not an OSError)."""


class StoreDown(AbstractFileSystem):  # type: ignore[misc]
    protocol = DOWN
    cachable = False

    def ls(self, path: str, detail: bool = True, **kwargs: Any) -> list[Any]:
        raise EndpointConnectionError('Could not connect to the endpoint URL: "http://s3.invalid/bucket"')


@pytest.fixture
def live_nm() -> Iterator[str]:
    """An RM whose app has one attempt, its AM on a running NM (the same server) that has its logs."""
    nm: list[str] = []             # the server's address, once it listens

    def route(method: str, path: str, query: dict[str, list[str]], body: Any) -> tuple[int, Any]:
        if path == f"/ws/v1/cluster/apps/{APP}/appattempts":
            return 200, {"appAttempts": {"appAttempt": [{"id": 1, "containerId": AM, "nodeHttpAddress": nm[0]}]}}
        if path == "/ws/v1/cluster/nodes":
            return 200, {"nodes": {"node": [{"id": "127.0.0.1:1", "state": "RUNNING", "nodeHTTPAddress": nm[0]}]}}
        if path == "/ws/v1/node/containers":
            return 200, {"containers": {"container": [{"id": AM}]}}
        if path.startswith(f"/ws/v1/node/containerlogs/{AM}/"):
            return 200, f"live {path.rsplit('/', 1)[1]} of the AM\n"
        return 404, {"RemoteException": {"exception": "NotFoundException", "message": path, "javaClassName": "x"}}

    with serve_routes(route) as address:
        nm.append(address)
        yield address


def _conf(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, remote: str) -> None:
    conf = tmp_path / "cluster" / "conf" / "cluster.toml"
    conf.parent.mkdir(parents=True)
    conf.write_text(f'[cluster]\nremote_app_log_dir = "{remote}"\n')
    monkeypatch.setenv("ELASTANE_CLUSTER_DIR", str(tmp_path / "cluster"))


def _logs(address: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = cli.main(["--rm", f"http://{address}", "--user", "alice", "app", "logs", APP])
    out, err = capsys.readouterr()
    return code, out, err


def test_a_cluster_toml_this_user_may_not_read_still_shows_the_live_logs(
        tmp_path: Path, live_nm: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    _conf(tmp_path, monkeypatch, str(tmp_path / "remote"))
    real_load = config.load

    def load(path: Any, *args: Any, **kwargs: Any) -> Any:
        if str(path).endswith("cluster.toml"):    # as open() does on a 0600 file of another user
            raise PermissionError(13, "Permission denied", str(path))
        return real_load(path, *args, **kwargs)
    monkeypatch.setattr(config, "load", load)
    code, out, err = _logs(live_nm, capsys)
    assert code == 0, err
    assert out == (f"=== {AM} on {live_nm}: stdout ===\nlive stdout of the AM\n"
                   f"=== {AM} on {live_nm}: stderr ===\nlive stderr of the AM\n")
    [warning] = err.splitlines()
    assert warning.startswith("elastane: warning: ") and "Permission denied" in warning


def test_a_store_that_cannot_be_listed_still_shows_the_live_logs(
        tmp_path: Path, live_nm: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    fsspec.register_implementation(DOWN, StoreDown, clobber=True)
    _conf(tmp_path, monkeypatch, f"{DOWN}://bucket/app-logs")
    code, out, err = _logs(live_nm, capsys)
    assert code == 0, err
    assert out == (f"=== {AM} on {live_nm}: stdout ===\nlive stdout of the AM\n"
                   f"=== {AM} on {live_nm}: stderr ===\nlive stderr of the AM\n")
    [warning] = err.splitlines()
    assert warning.startswith("elastane: warning: cannot read the aggregated logs at ")
    assert "EndpointConnectionError: Could not connect to the endpoint URL" in warning


def test_a_store_error_while_reading_a_log_is_a_clear_cli_error_not_a_traceback(tmp_path: Path) -> None:
    """The listing worked, then the read of one log fails with the store's own type (botocore's
    are not OSError): `read_aggregated` answers a CliError naming the container, the file and why,
    which the CLI prints with its exit code, where the error escaped as a traceback before."""
    store = RemoteLogDir(str(tmp_path / "remote"))
    node: Any = object()

    def read_log(*args: Any) -> bytes:
        raise EndpointConnectionError('Could not connect to the endpoint URL: "http://s3.invalid/bucket"')
    mp = pytest.MonkeyPatch()
    mp.setattr(aggregated_logs, "read_log", read_log)
    try:
        with pytest.raises(CliError) as e:
            asyncio.run(read_aggregated(store, APP, Aggregated(node, {"stdout": 5}), AM, "stdout"))
    finally:
        mp.undo()
    assert AM in str(e.value) and "stdout" in str(e.value) and "EndpointConnectionError" in str(e.value)
