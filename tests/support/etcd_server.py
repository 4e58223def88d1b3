"""A real etcd server for the tests: Debian's `etcd` (package etcd-server) with its own temp dir, on
loopback, on free ports, one member.

    server = start_etcd_server(tmp_dir)         # waits until etcd answers a KV range request
    try:
        endpoint = server.endpoint              # "http://127.0.0.1:<port>"
        server.stop()                           # SIGTERM to its pid, waited for (SIGKILL if it hangs)
        server.restart()                        # same ports and data dir; waits until it answers
    finally:
        server.stop()

The pytest fixture `etcd` (tests/conftest.py) gives each test a fresh server and stops it after;
tests skip, naming why, where the etcd binary or the aetcd client is missing.
"""
from __future__ import annotations

import shutil
import signal
import subprocess
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from polling import wait_until
from s3_server import free_ports

READY_TIMEOUT_S = 60.0      # bounds a broken start; a healthy one answers well within a second


def etcd_binary() -> str | None:
    return shutil.which("etcd")


def unavailable_reason() -> str | None:
    """Why no etcd can be started here (None when one can)."""
    if etcd_binary() is None:
        return "no etcd binary (Debian's etcd-server; `make test` installs it as root)"
    try:
        import aetcd  # noqa: F401, PLC0415  # the RM's etcd client
    except ImportError:
        return "aetcd is not installed (pip install '.[ha]')"
    return None


@dataclass
class EtcdServer:
    """A running single-member etcd and how to reach it."""

    base_dir: Path
    client_port: int
    peer_port: int
    name: str = "etcd-test"
    process: subprocess.Popen[bytes] | None = None
    log_path: Path = field(init=False)

    def __post_init__(self) -> None:
        self.log_path = self.base_dir / "etcd.log"

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.client_port}"

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self) -> None:
        """Start the member (first start or after `stop`) and return once it serves requests."""
        binary = etcd_binary()
        if binary is None:
            raise RuntimeError(unavailable_reason() or "no etcd binary")
        peer = f"http://127.0.0.1:{self.peer_port}"
        argv = [binary, "--name", self.name, "--data-dir", str(self.base_dir / "data"),
                "--listen-client-urls", self.endpoint, "--advertise-client-urls", self.endpoint,
                "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                "--initial-cluster", f"{self.name}={peer}", "--initial-cluster-state", "new",
                "--log-outputs", "stderr"]
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                            start_new_session=True)
        try:
            wait_until(self._answers, READY_TIMEOUT_S, f"etcd on {self.endpoint}", 0.05)
        except BaseException as e:
            self.stop()
            if isinstance(e, AssertionError):
                e.add_note(self.log_tail())
            raise

    def _answers(self) -> bool:
        """True once the member has a leader and serves a linearizable read (the JSON gateway's
        range call, which fails until raft has elected)."""
        if self.process is not None and self.process.poll() is not None:
            raise RuntimeError(f"etcd exited with {self.process.returncode} during start:\n{self.log_tail()}")
        req = urllib.request.Request(f"{self.endpoint}/v3/kv/range", data=b'{"key": "AA=="}', method="POST")
        try:
            with urllib.request.urlopen(req, timeout=2) as resp:
                return bool(resp.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def stop(self, timeout_s: float = 30.0) -> None:
        """SIGTERM the member by its pid and wait for it; SIGKILL if it outlives `timeout_s`."""
        proc = self.process
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)

    def restart(self) -> None:
        self.stop()
        self.start()

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


def start_etcd_server(base_dir: Path) -> EtcdServer:
    """A fresh one-member etcd under `base_dir` on free loopback ports, serving when this returns."""
    base_dir = Path(base_dir)
    base_dir.mkdir(parents=True, exist_ok=True)
    client_port, peer_port = free_ports(2)
    server = EtcdServer(base_dir, client_port, peer_port)
    server.start()
    return server
