"""Tasks that call services, through the client against the open ``flint dev`` (its
``--egress-allow`` lists one loopback origin, which this module serves): ``network`` and
``resources.egress`` reach the driver, the guest's requests reach the service and are
counted in ``usage``, what lies outside a list is ``InvalidSpec`` at submit and an
``EgressDeniedEvent`` (not a failure) when a guest asks for it."""

from __future__ import annotations

import http.server
import threading
from typing import Any, Dict, Iterator, List, Tuple
from urllib.parse import urlsplit

import pytest

import flint_client
from flint_client import AsyncClient, Client, EgressLimits, InvalidSpec, Resources, Task

from .conftest import Driver, Guests

#: An origin no list of the driver's names (the guest is refused before any lookup).
ELSEWHERE = "https://example.com"


class Service:
    """The loopback service the driver allows: answers GET with ``hello, <path>`` and
    POST with the size of its body, and keeps each request it got."""

    def __init__(self, origin: str) -> None:
        self.origin = origin
        self.requests: List[Tuple[str, str, bytes]] = []
        self._lock = threading.Lock()
        service = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def _answer(self, body: bytes) -> None:
                length = int(self.headers.get("content-length") or 0)
                with service._lock:
                    service.requests.append((self.command, self.path, self.rfile.read(length)))
                    got = service.requests[-1][2]
                answer = body if self.command == "GET" else str(len(got)).encode()
                self.send_response(200)
                self.send_header("content-length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def do_GET(self) -> None:
                self._answer(b"hello, " + self.path.encode())

            def do_POST(self) -> None:
                self._answer(b"")

            def log_message(self, format: str, *args: object) -> None:
                pass

        port = urlsplit(origin).port
        assert port is not None
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def taken(self) -> List[Tuple[str, str, bytes]]:
        """The requests received so far, and none kept after."""
        with self._lock:
            out, self.requests = self.requests, []
        return out

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture()
def service(driver: Driver) -> Iterator[Service]:
    """The driver's allowed origin, served for one test (the README serves it too)."""
    assert driver.service is not None
    s = Service(driver.service)
    try:
        yield s
    finally:
        s.stop()


def test_a_task_calls_the_service_and_its_usage_counts_it(client: Client, guests: Guests, service: Service) -> None:
    job = client.submit(
        guests.testkit,
        tasks=[
            Task(args=["http-get", f"{service.origin}/get"]),
            Task(b"payload", args=["http-post", f"{service.origin}/post"]),
        ],
        network=[service.origin],
        resources=Resources(egress=EgressLimits(max_requests=2, max_bytes=1 << 20, max_concurrent=1)),
    )
    job.wait(60, raise_on_failure=True)
    assert sorted(service.taken()) == [("GET", "/get", b""), ("POST", "/post", b"payload")]
    got, posted = job.results(decode="text")
    assert got.startswith("status=200 bytes=11 ") and got.endswith("hello, /get")
    assert posted.startswith("status=200 bytes=1 ") and posted.endswith("7")
    usage = job.usage()
    assert usage is not None and usage.egress_requests == 2
    assert usage.egress_bytes_sent > len(b"payload") and usage.egress_bytes_received > len(b"hello, /get")
    for task in job.tasks():
        (attempt,) = task.history
        assert attempt.usage is not None and attempt.usage.egress_requests == 1, task.index


def test_a_refused_request_is_an_event_not_a_failure(client: Client, guests: Guests, service: Service) -> None:
    # The guest waits half a second first: an attempt's refusals are published as it
    # ends, to the streams open then.
    url = f"{ELSEWHERE}/data"
    job = client.submit(guests.testkit, [""], args=["after", "500", "http-get", url], network=[service.origin])
    events = list(job.events())
    denials = [e for e in events if isinstance(e, flint_client.EgressDeniedEvent)]
    assert len(denials) == 1, events
    (denial,) = denials
    (task,) = job.tasks()
    assert (denial.index, denial.attempt, denial.executor) == (0, 1, task.executor)
    (message,) = denial.denied
    assert message.startswith(f"GET {url}: ") and "network.allow" in message
    end = events[-1]
    assert isinstance(end, flint_client.EndEvent) and end.job.succeeded
    assert job.text(0).startswith(f"error: Denied: GET {url}")
    assert service.taken() == []
    usage = job.usage()
    assert usage is not None and usage.egress_requests == 0


def test_what_the_driver_cannot_grant_is_invalid_spec(client: Client, guests: Guests, service: Service) -> None:
    refusals: List[Tuple[Dict[str, Any], str]] = [
        (dict(network=[ELSEWHERE]), "--egress-allow"),
        (dict(network=[]), "network.allow has 0 entries"),
        (dict(resources=Resources(egress=EgressLimits(max_requests=1))), '"network"'),
        (dict(network=[service.origin], deterministic=True, memoize=True), "memoize"),
        (dict(network=[service.origin], resources={"egress": {"max_bytes": 0}}), "max_bytes must be at least 1"),
    ]
    for options, named in refusals:
        with pytest.raises(InvalidSpec) as caught:
            client.submit(guests.testkit, [""], args=["noop"], **options)
        assert (caught.value.status, caught.value.kind) == (422, "invalid_spec"), options
        assert named in caught.value.message, (options, caught.value.message)
    assert service.taken() == []


@pytest.mark.anyio
async def test_the_async_client_calls_the_service(driver: Driver, guests: Guests, service: Service) -> None:
    async with AsyncClient(driver.url) as client:
        job = await client.submit(
            guests.testkit, [""], args=["http-get", f"{service.origin}/async"], network=[service.origin]
        )
        await job.wait(60, raise_on_failure=True)
        assert (await job.text(0)).endswith("hello, /async")
        usage = await job.usage()
        assert usage is not None and usage.egress_requests == 1
        with pytest.raises(InvalidSpec, match="--egress-allow"):
            await client.submit(guests.testkit, [""], args=["noop"], network=[ELSEWHERE])
    assert service.taken() == [("GET", "/async", b"")]
