"""Fixtures: real ``flint dev`` drivers (an open one and one with a token) and the
example guests.

``FLINT_BIN`` names the flint binary (default ``target/debug/flint`` from the repository
root) and ``FLINT_GUESTS`` the directory of the wasm32-wasip1 release guests
(``testkit.wasm``, ``wordcount.wasm``, ``wordcount-reduce.wasm``).

The open driver's ``--egress-allow`` lists one loopback origin, its ``service``, where
nothing listens until a test (or the README's walkthrough, told it as
``FLINT_SERVICE``) serves it.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterator, Optional, Sequence

import httpx
import pytest

REPO = Path(__file__).resolve().parents[3]
TARGET = Path(os.environ.get("CARGO_TARGET_DIR", REPO / "target"))


def _flint_bin() -> Path:
    return Path(os.environ.get("FLINT_BIN", TARGET / "debug" / "flint"))


def _guest_dir() -> Path:
    return Path(os.environ.get("FLINT_GUESTS", TARGET / "tmp" / "guests" / "wasm32-wasip1" / "release"))


@dataclass
class Driver:
    """A running ``flint dev``: its HTTP address, its token (if any), its data dir."""

    url: str
    token: Optional[str]
    data_dir: Path
    process: "subprocess.Popen[bytes]"
    log: Path
    #: The origin its ``--egress-allow`` lists (``http://127.0.0.1:PORT``), if any.
    service: Optional[str] = None

    def env(self) -> Dict[str, str]:
        """An environment that points a client at this driver (and the README at its
        service)."""
        env = dict(os.environ)
        env["FLINT_URL"] = self.url
        env.pop("FLINT_TOKEN", None)
        if self.token:
            env["FLINT_TOKEN"] = self.token
        if self.service:
            env["FLINT_SERVICE"] = self.service
        return env

    def stop(self) -> None:
        """SIGTERM, then wait (SIGKILL after 30 s)."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def free_service() -> str:
    """A loopback origin with a port free now (``http://127.0.0.1:PORT``), for a
    driver's ``--egress-allow`` before anything serves it (the port must be known
    first)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def start_driver(
    executors: int = 2, token: Optional[str] = None, extra_args: Sequence[str] = (), service: Optional[str] = None
) -> Driver:
    """Starts ``flint dev`` on free loopback ports and waits until its executors are
    alive. ``extra_args`` go on its command line after the ones every driver gets
    (``["--tenants", path]``, say); with ``service``, ``--egress-allow`` lists it."""
    if service is not None:
        extra_args = [*extra_args, "--egress-allow", service]
    flint = _flint_bin()
    if not flint.is_file():
        pytest.fail(f"no flint binary at {flint}: build it (cargo build --bin flint --bin flint-engine) or set FLINT_BIN", pytrace=False)
    data = Path(tempfile.mkdtemp(prefix="flint-py-"))
    out, log = data / "dev.out", data / "dev.err"
    env = dict(os.environ)
    env.pop("FLINT_TOKEN", None)
    env.pop("FLINT_CLUSTER_SECRET", None)
    if token:
        env["FLINT_TOKEN"] = token
        env["FLINT_CLUSTER_SECRET"] = secrets.token_hex(16)
    with open(out, "wb") as stdout, open(log, "wb") as stderr:
        process = subprocess.Popen(
            [
                str(flint),
                "dev",
                "--listen",
                "127.0.0.1:0",
                "--executor-listen",
                "127.0.0.1:0",
                "--data-dir",
                str(data / "data"),
                "--executors",
                str(executors),
                "--cores",
                "1",
                *extra_args,
            ],
            stdout=stdout,
            stderr=stderr,
            env=env,
        )
    url = None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and url is None:
        if process.poll() is not None:
            pytest.fail(f"flint dev exited with {process.returncode}:\n{log.read_text()[-4000:]}", pytrace=False)
        for line in out.read_text().splitlines():
            if line.startswith("http: "):
                url = line[len("http: ") :].strip()
        time.sleep(0.05)
    if url is None:
        process.kill()
        pytest.fail(f"flint dev did not print its address:\n{log.read_text()[-4000:]}", pytrace=False)
    driver = Driver(url, token, data, process, log, service)
    headers = {"authorization": f"Bearer {token}"} if token else {}
    while time.monotonic() < deadline:
        try:
            items = httpx.get(f"{url}/v1/executors", headers=headers, timeout=5).json()["items"]
            if sum(1 for e in items if e["state"] == "alive") >= executors:
                return driver
        except (httpx.HTTPError, KeyError, ValueError):
            pass
        time.sleep(0.1)
    driver.stop()
    pytest.fail(f"the executors of flint dev did not come up:\n{log.read_text()[-4000:]}", pytrace=False)
    raise AssertionError("unreachable")


@pytest.fixture(scope="session")
def driver() -> Iterator[Driver]:
    """An open ``flint dev`` with 2 executors of 1 core, its tasks allowed to call its
    ``service``."""
    d = start_driver(executors=2, service=free_service())
    try:
        yield d
    finally:
        d.stop()
        shutil.rmtree(d.data_dir, ignore_errors=True)


@pytest.fixture(scope="session")
def secured_driver() -> Iterator[Driver]:
    """A ``flint dev`` with an API token (and a cluster secret), 1 executor."""
    d = start_driver(executors=1, token=secrets.token_hex(16))
    try:
        yield d
    finally:
        d.stop()
        shutil.rmtree(d.data_dir, ignore_errors=True)


class Guests:
    """Paths of the example guests."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.testkit = self._need("testkit.wasm")
        self.wordcount = self._need("wordcount.wasm")
        self.reduce = self._need("wordcount-reduce.wasm")

    def _need(self, name: str) -> Path:
        path = self.root / name
        if not path.is_file():
            pytest.fail(f"no guest {path}: build guest-examples for wasm32-wasip1 or set FLINT_GUESTS", pytrace=False)
        return path


@pytest.fixture(scope="session")
def guests() -> Guests:
    """The example guests (``FLINT_GUESTS``)."""
    return Guests(_guest_dir())


@pytest.fixture()
def client(driver: Driver) -> Iterator["flint_client.Client"]:  # noqa: F821
    """A :class:`flint_client.Client` of the open driver."""
    import flint_client

    with flint_client.Client(driver.url) as c:
        yield c


@pytest.fixture()
def anyio_backend() -> str:
    """The async tests run on asyncio."""
    return "asyncio"
