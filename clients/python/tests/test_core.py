"""The sans-I/O core without a driver: frame and event decoding, error mapping, spec
building (``network`` and egress limits too), model parsing (usage, attempt history,
pins and seeds, memoized tasks, replay bundles, graphs and waiting tasks, egress counts
and denials too), and, over mock transports, the request count of ``map``, what
``submit`` and ``graph`` send and what ``replay`` asks for."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import random
import struct
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

import httpx
import pytest

import flint_client
from flint_client import _core as core
from flint_client.models import from_json


def frames(results: List[Optional[bytes]]) -> bytes:
    out = bytearray()
    for i, data in enumerate(results):
        if data is None:
            out += struct.pack(">IBQ", i, 0, 0)
        else:
            out += struct.pack(">IBQ", i, 1, len(data)) + data
    return bytes(out)


def test_frames_decode_whatever_the_chunking() -> None:
    rng = random.Random(7)
    results: List[Optional[bytes]] = [b"", None, b"x" * 70_000, b"abc", None, bytes(range(256)) * 3]
    body = frames(results)
    for _ in range(200):
        parser = core.FrameParser()
        got: List[Tuple[int, Optional[bytes]]] = []
        pos = 0
        while pos < len(body):
            step = rng.choice([1, 2, 5, 13, 14, 100, 4096, 100_000])
            got += parser.feed(body[pos : pos + step])
            pos += step
        parser.finish()
        assert got == list(enumerate(results))


def test_a_truncated_results_stream_is_an_error() -> None:
    body = frames([b"hello"])
    parser = core.FrameParser()
    parser.feed(body[:-1])
    with pytest.raises(flint_client.ProtocolError, match="truncated"):
        parser.finish()
    with pytest.raises(flint_client.ProtocolError, match="bad frame header"):
        core.FrameParser().feed(struct.pack(">IBQ", 0, 7, 0))


def test_sse_events_and_keep_alives() -> None:
    text = (
        b": keep-alive\n\n"
        b'event: job\ndata: {"id":"job-1","state":"running","tasks":2}\n\n'
        b'event: task\r\ndata: {"index":0,"state":"succeeded","attempt":1,"executor":"exec-1","error":null,"new":1}\r\n\r\n'
        b'event: lagged\ndata: {"missed":3}\n\n'
        b"event: future\ndata: a\ndata: b\n\n"
        b'event: end\ndata: {"id":"job-1","state":"succeeded","tasks":2,"counts":{"succeeded":2}}\n\n'
    )
    for step in (1, 3, 7, len(text)):
        parser = core.SSEParser()
        pairs = []
        for pos in range(0, len(text), step):
            pairs += parser.feed(text[pos : pos + step])
        events = [core.parse_event(n, d) for n, d in pairs]
        assert [e.event for e in events] == ["job", "task", "lagged", "future", "end"]
        assert isinstance(events[1], flint_client.TaskEvent) and events[1].executor == "exec-1"
        assert events[2] == flint_client.LaggedEvent(missed=3)
        assert events[3] == flint_client.UnknownEvent("future", "a\nb")
        end = events[4]
        assert isinstance(end, flint_client.EndEvent) and end.job.counts.succeeded == 2 and end.job.ended


def response(status: int, body: object, headers: Optional[dict] = None) -> httpx.Response:
    return httpx.Response(
        status,
        content=json.dumps(body).encode(),
        headers=headers,
        request=httpx.Request("GET", "http://x/v1/jobs/j"),
    )


@pytest.mark.parametrize(
    "status,kind,cls",
    [
        (404, "job_not_found", flint_client.NotFound),
        (404, "task_not_found", flint_client.NotFound),
        (404, "some_new_kind", flint_client.NotFound),
        (401, "unauthorized", flint_client.Unauthorized),
        (422, "invalid_module", flint_client.InvalidModule),
        (422, "invalid_spec", flint_client.InvalidSpec),
        (422, "idempotency_conflict", flint_client.Conflict),
        (409, "no_result", flint_client.Conflict),
        (409, "job_running", flint_client.Conflict),
        (409, "not_run", flint_client.Conflict),
        (404, "attempt_not_found", flint_client.NotFound),
        (410, "replay_unavailable", flint_client.ReplayUnavailable),
        (503, "overloaded", flint_client.Overloaded),
        (507, "storage_full", flint_client.StorageFull),
        (500, "storage", flint_client.ServerError),
        (413, "body_too_large", flint_client.TooLarge),
        (400, "bad_query", flint_client.BadRequest),
        (429, "quota_exceeded", flint_client.QuotaExceeded),
        (429, "some_new_kind", flint_client.QuotaExceeded),
        (403, "admin_only", flint_client.Forbidden),
        (403, "some_new_kind", flint_client.Forbidden),
        (404, "tenant_not_found", flint_client.NotFound),
        (404, "graph_not_found", flint_client.NotFound),
    ],
)
def test_errors_map_by_kind_then_status(status: int, kind: str, cls: type) -> None:
    error = core.error_from_response(
        response(status, {"error": {"kind": kind, "message": "why"}}, {"retry-after": "2"})
    )
    assert type(error) is cls
    assert (error.kind, error.status) == (kind, status)
    assert "why" in str(error)
    if isinstance(error, flint_client.Overloaded):
        assert error.retry_after == 2.0


def test_an_error_without_a_json_body_is_named_by_its_status() -> None:
    r = httpx.Response(502, content=b"bad gateway", request=httpx.Request("GET", "http://x/"))
    error = core.error_from_response(r)
    assert isinstance(error, flint_client.ServerError) and error.kind == "http_502" and "bad gateway" in error.message


def test_inputs_encode_to_the_documented_shapes(tmp_path: Path) -> None:
    (tmp_path / "in.txt").write_bytes(b"xy")
    inputs = [
        b"x y",
        "a b",
        tmp_path / "in.txt",
        flint_client.Url("https://h/x", sha256="ab"),
        flint_client.ResultRef("job-1", 3),
        flint_client.ResultsRef("job-1"),
        flint_client.ResultsRef("job-2", [2, 0, 2]),
        {"text": "raw"},
    ]
    spec = core.build_spec(
        {"module": "sha256:00"}, inputs=inputs, args=["--top", "3"], resources=flint_client.Resources(cores=2)
    )
    assert spec["inputs"] == [
        {"base64": "eCB5"},
        {"text": "a b"},
        {"base64": "eHk="},
        {"url": "https://h/x", "sha256": "ab"},
        {"result": {"job": "job-1", "task": 3}},
        {"results": {"job": "job-1"}},
        {"results": {"job": "job-2", "tasks": [2, 0, 2]}},
        {"text": "raw"},
    ]
    assert spec["args"] == ["--top", "3"] and spec["resources"] == {"cores": 2}
    tasks = core.build_spec(
        {"module": "m"}, tasks=[flint_client.Task("a", args=["echo"]), {"input": b"", "env": {"K": "V"}}]
    )
    assert tasks["tasks"] == [{"input": {"text": "a"}, "args": ["echo"]}, {"input": {"base64": ""}, "env": {"K": "V"}}]
    with pytest.raises(ValueError, match="exactly one"):
        core.build_spec({"module": "m"})
    with pytest.raises(TypeError, match="not one string"):
        core.build_spec({"module": "m"}, inputs=[""], args="noop")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="not a single"):
        core.build_spec({"module": "m"}, inputs="abc")


def test_models_ignore_unknown_fields_and_default_missing_ones() -> None:
    view = from_json(
        flint_client.JobView,
        {
            "id": "job-1",
            "state": "failed",
            "tasks": 3,
            "counts": {"failed": 1, "zzz": 2},
            "error": {"kind": "task_failed", "message": "m"},
            "later": [1],
        },
    )
    assert view.counts == flint_client.TaskCounts(failed=1)
    assert view.error == flint_client.ErrorBody("task_failed", "m")
    assert view.finished_at is None and not view.succeeded and view.ended


USAGE = {
    "fuel": None,
    "cpu_us": 260049,
    "wall_us": 309515,
    "peak_memory_bytes": 315686912,
    "input_bytes": 0,
    "output_bytes": 9,
    "fetched_bytes": 105051,
}


def attempt_view(n: int, memory_mb: int, outcome: Optional[str], usage: Optional[dict]) -> dict:
    return {
        "attempt": n,
        "executor": "exec-1",
        "memory_mb": memory_mb,
        "timeout_ms": 60000,
        "outcome": outcome,
        "speculative": False,
        "usage": usage,
    }


#: A task of a retry that escalated its memory twice (as the driver answers it).
ESCALATED_TASK = {
    "index": 0,
    "state": "succeeded",
    "attempts": 3,
    "executor": "exec-1",
    "exit_code": 0,
    "error": None,
    "result": {"size": 9, "sha256": "c9"},
    "started_at": "2026-12-05T09:13:51.821620Z",
    "finished_at": "2026-12-05T09:13:52.130065Z",
    "usage": USAGE,
    "history": [
        attempt_view(1, 128, "memory_limit", dict(USAGE, cpu_us=1144, peak_memory_bytes=1114112)),
        attempt_view(2, 256, "memory_limit", dict(USAGE, cpu_us=268, fuel=7)),
        attempt_view(3, 512, None, None),
    ],
}


def test_views_parse_usage_and_history() -> None:
    task = from_json(flint_client.TaskView, ESCALATED_TASK)
    assert task.usage == flint_client.Usage(
        fuel=None,
        cpu_us=260049,
        wall_us=309515,
        peak_memory_bytes=315686912,
        input_bytes=0,
        output_bytes=9,
        fetched_bytes=105051,
    )
    assert [a.memory_mb for a in task.history] == [128, 256, 512]
    assert all(isinstance(a, flint_client.TaskAttempt) for a in task.history)
    first, second, running = task.history
    assert first == flint_client.TaskAttempt(
        attempt=1,
        executor="exec-1",
        memory_mb=128,
        timeout_ms=60000,
        outcome="memory_limit",
        speculative=False,
        usage=flint_client.Usage(None, 1144, 309515, 1114112, 0, 9, 105051),
    )
    assert second.usage is not None and second.usage.fuel == 7
    assert running.outcome is None and running.usage is None and running.attempt == 3
    job = from_json(flint_client.JobView, {"id": "job-1", "state": "succeeded", "tasks": 1, "usage": USAGE})
    assert job.usage is not None and job.usage.peak_memory_bytes == 315686912 and job.usage.fuel is None
    # A usage with fields missing (or more than this client knows) still parses.
    assert from_json(flint_client.Usage, {"cpu_us": 5, "gpu_us": 1}) == flint_client.Usage(cpu_us=5)


def test_views_of_a_driver_without_usage_still_parse() -> None:
    older = {k: v for k, v in ESCALATED_TASK.items() if k not in ("usage", "history")}
    task = from_json(flint_client.TaskView, older)
    assert task.usage is None and task.history == [] and task.attempts == 3
    assert from_json(flint_client.TaskView, {"index": 4}).history == []
    job = from_json(flint_client.JobView, {"id": "job-1", "state": "running", "tasks": 1})
    assert job.usage is None


def test_accounting_and_retry_go_into_the_spec_only_when_given() -> None:
    module = {"module": "sha256:00"}
    plain = core.build_spec(module, inputs=[""])
    assert "accounting" not in plain and "retry" not in plain
    spec = core.build_spec(
        module,
        inputs=[""],
        accounting="exact",
        retry=flint_client.Escalate(memory=2.0, max_memory_mb=1024),
    )
    assert spec["accounting"] == "exact"
    assert spec["retry"] == {"escalate": {"memory": 2.0, "max_memory_mb": 1024}}
    every = flint_client.Escalate(memory=2.0, timeout=1.5, max_memory_mb=2048, max_timeout_ms=600_000)
    assert core.build_spec(module, inputs=[""], retry=every)["retry"] == {
        "escalate": {"memory": 2.0, "timeout": 1.5, "max_memory_mb": 2048, "max_timeout_ms": 600_000}
    }
    # The RetrySpec's JSON form passes through as it is (the driver judges it), with an
    # Escalate in it if wished.
    raw = {"escalate": {"timeout": 3.0}}
    assert core.build_spec(module, inputs=[""], retry=raw)["retry"] == raw
    nested = {"escalate": flint_client.Escalate(timeout=3.0)}
    assert core.build_spec(module, inputs=[""], retry=nested)["retry"] == raw
    with pytest.raises(TypeError, match="retry is an Escalate or a dict"):
        core.build_spec(module, inputs=[""], retry=2.0)  # type: ignore[arg-type]


def test_priority_goes_into_the_spec_only_when_given() -> None:
    module = {"module": "sha256:00"}
    assert "priority" not in core.build_spec(module, inputs=[""])
    # 0 and negative priorities are the caller's to send: given is given.
    assert core.build_spec(module, inputs=[""], priority=0)["priority"] == 0
    assert core.build_spec(module, inputs=[""], priority=-2)["priority"] == -2


def test_job_views_default_to_the_admins_and_priority_zero() -> None:
    # The driver leaves tenant out for the admin's jobs and priority out when 0.
    plain = from_json(flint_client.JobView, {"id": "job-1", "state": "queued"})
    assert plain.tenant is None and plain.priority == 0
    owned = from_json(flint_client.JobView, {"id": "job-2", "tenant": "a", "priority": 3})
    assert owned.tenant == "a" and owned.priority == 3


def job_driver(
    bodies: List[dict],
    view: Dict[str, Any],
    task: Dict[str, Any],
    result: bytes,
    answer: Callable[[Dict[str, Any]], httpx.Response],
) -> httpx.MockTransport:
    """A mock driver of job 1 (``view``, its one ``task`` and ``result``) that keeps each
    submitted spec in ``bodies`` and answers it with ``answer(spec)``."""

    def handler(request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path == "/v1/jobs" and request.method == "POST":
            body = json.loads(request.content)
            bodies.append(body)
            return answer(body)
        if path == "/v1/jobs/job-1":
            return httpx.Response(200, json=view)
        if path == "/v1/jobs/job-1/tasks":
            return httpx.Response(200, json={"items": [task], "next": None})
        if path == "/v1/jobs/job-1/results":
            return httpx.Response(200, content=frames([result]))
        return httpx.Response(404, json={"error": {"kind": "not_found", "message": path}})

    return httpx.MockTransport(handler)


def usage_driver(bodies: List[dict]) -> httpx.MockTransport:
    """A mock driver of job 1 (with usage; its task escalated)."""
    view = {"id": "job-1", "state": "succeeded", "tasks": 1, "counts": {"succeeded": 1}, "usage": USAGE}
    queued = dict(view, state="queued", counts={"pending": 1}, usage=None)
    return job_driver(bodies, view, ESCALATED_TASK, b"314572800", lambda _: httpx.Response(202, json=queued))


def test_submit_sends_accounting_and_retry_and_job_usage_reads_the_job() -> None:
    bodies: List[dict] = []
    with flint_client.Client("http://flint.test", transport=usage_driver(bodies)) as client:
        job = client.submit(
            "sha256:00",
            [""],
            args=["alloc", "300"],
            resources={"memory_mb": 128},
            accounting="standard",
            retry=flint_client.Escalate(memory=2.0),
        )
        assert job.view is not None and job.view.usage is None
        usage = job.usage()
        assert usage == flint_client.Usage(**USAGE)
        assert job.view.usage == usage  # read now: the handle's view is the job's latest
        (task,) = job.tasks()
        assert task.usage == usage and [a.memory_mb for a in task.history] == [128, 256, 512]
        client.submit("sha256:00", [""])
        assert client.map("sha256:00", [""], retry={"escalate": {"timeout": 2}}, accounting="exact") == [b"314572800"]
    assert bodies[0] == {
        "module": "sha256:00",
        "inputs": [{"text": ""}],
        "args": ["alloc", "300"],
        "resources": {"memory_mb": 128},
        "accounting": "standard",
        "retry": {"escalate": {"memory": 2.0}},
    }
    assert bodies[1] == {"module": "sha256:00", "inputs": [{"text": ""}]}
    assert bodies[2]["accounting"] == "exact" and bodies[2]["retry"] == {"escalate": {"timeout": 2}}


@pytest.mark.anyio
async def test_the_async_client_sends_accounting_and_retry_and_reads_usage() -> None:
    bodies: List[dict] = []
    async with flint_client.AsyncClient("http://flint.test", transport=usage_driver(bodies)) as client:
        job = await client.submit("sha256:00", [""], accounting="exact", retry=flint_client.Escalate(timeout=4.0))
        assert await job.usage() == flint_client.Usage(**USAGE)
        tasks = [t async for t in job.tasks()]
        assert tasks[0].history[0].outcome == "memory_limit"
        await client.submit("sha256:00", [""])
    assert bodies[0]["accounting"] == "exact" and bodies[0]["retry"] == {"escalate": {"timeout": 4.0}}
    assert "accounting" not in bodies[1] and "retry" not in bodies[1]


PINS = {
    "module": "sha256:" + "a1" * 32,
    "files": {"words.txt": "sha256:" + "f0" * 32},
    "input": "sha256:2d711642b726b04401627ca9fbac32f5c8530fb1903cc4db02258717921a4881",
}

#: A task of a deterministic job (as the driver answers it): its attempt is pinned.
PINNED_TASK = dict(
    ESCALATED_TASK,
    attempts=1,
    history=[dict(attempt_view(1, 128, "succeeded", USAGE), pins=PINS)],
)


def test_views_parse_pins_and_seed() -> None:
    task = from_json(flint_client.TaskView, PINNED_TASK)
    (attempt,) = task.history
    assert isinstance(attempt.pins, flint_client.Pins)
    assert attempt.pins == flint_client.Pins(
        module="sha256:" + "a1" * 32,
        files={"words.txt": "sha256:" + "f0" * 32},
        input="sha256:2d711642b726b04401627ca9fbac32f5c8530fb1903cc4db02258717921a4881",
    )
    assert attempt.usage is not None and attempt.outcome == "succeeded"
    job = from_json(flint_client.JobView, {"id": "job-1", "state": "succeeded", "tasks": 1, "seed": 7})
    assert job.seed == 7
    # The driver draws 53-bit seeds; any u64 a caller gave comes back as it is.
    big = from_json(flint_client.JobView, {"id": "job-1", "seed": 2**64 - 1})
    assert big.seed == 2**64 - 1
    # Pins without files (or with fields this client does not know) still parse.
    assert from_json(flint_client.Pins, {"module": "sha256:00", "input": "sha256:11", "more": 1}) == (
        flint_client.Pins(module="sha256:00", input="sha256:11")
    )
    assert flint_client.Pins().files == {}


def test_a_job_that_is_not_deterministic_has_no_seed_nor_pins() -> None:
    # Non-deterministic jobs (and drivers older than deterministic mode) leave both out.
    task = from_json(flint_client.TaskView, ESCALATED_TASK)
    assert [a.pins for a in task.history] == [None, None, None]
    job = from_json(flint_client.JobView, {"id": "job-1", "state": "running", "tasks": 1})
    assert job.seed is None
    # An explicit null is None too.
    attempt = from_json(flint_client.TaskAttempt, dict(attempt_view(1, 128, None, None), pins=None))
    assert attempt.pins is None


def test_deterministic_and_seed_go_into_the_spec_only_when_given() -> None:
    module = {"module": "sha256:00"}
    plain = core.build_spec(module, inputs=[""])
    assert "deterministic" not in plain and "seed" not in plain
    assert core.build_spec(module, inputs=[""], deterministic=False) == plain
    drawn = core.build_spec(module, inputs=[""], deterministic=True)
    assert drawn["deterministic"] is True and "seed" not in drawn
    seeded = core.build_spec(module, inputs=[""], deterministic=True, seed=7)
    assert seeded == {"module": "sha256:00", "inputs": [{"text": ""}], "deterministic": True, "seed": 7}
    # 0 is a seed, not a missing one.
    assert core.build_spec(module, inputs=[""], deterministic=True, seed=0)["seed"] == 0
    # A seed without the flag is sent as it is: the driver refuses it (422 invalid_spec).
    alone = core.build_spec(module, inputs=[""], seed=7)
    assert alone["seed"] == 7 and "deterministic" not in alone
    assert json.loads(json.dumps(seeded)) == seeded


def deterministic_driver(bodies: List[dict]) -> httpx.MockTransport:
    """A mock driver of job 1, deterministic with seed 7, that refuses a seed without
    ``deterministic`` as the driver does."""
    view = {"id": "job-1", "state": "succeeded", "tasks": 1, "counts": {"succeeded": 1}, "seed": 7}

    def answer(body: Dict[str, Any]) -> httpx.Response:
        if "seed" in body and not body.get("deterministic"):
            message = 'seed is for a deterministic job: give "deterministic": true too'
            return httpx.Response(422, json={"error": {"kind": "invalid_spec", "message": message}})
        queued = dict(view, state="queued", counts={"pending": 1})
        if not body.get("deterministic"):
            del queued["seed"]
        return httpx.Response(202, json=queued)

    return job_driver(bodies, view, PINNED_TASK, b"FLINT_TASK_INDEX=0", answer)


def test_submit_and_map_send_deterministic_and_seed_and_read_seed_and_pins() -> None:
    bodies: List[dict] = []
    with flint_client.Client("http://flint.test", transport=deterministic_driver(bodies)) as client:
        job = client.submit("sha256:00", ["x"], args=["env"], deterministic=True, seed=7)
        assert job.view is not None and job.view.seed == 7
        assert job.info().seed == 7
        (task,) = job.tasks()
        assert task.history[0].pins == from_json(flint_client.Pins, PINS)
        plain = client.submit("sha256:00", ["x"])
        assert plain.view is not None and plain.view.seed is None
        assert client.map("sha256:00", ["x"], deterministic=True) == [b"FLINT_TASK_INDEX=0"]
        with pytest.raises(flint_client.InvalidSpec) as refused:
            client.submit("sha256:00", ["x"], seed=7)
        assert refused.value.kind == "invalid_spec" and refused.value.status == 422
    assert bodies[0] == {
        "module": "sha256:00",
        "inputs": [{"text": "x"}],
        "args": ["env"],
        "deterministic": True,
        "seed": 7,
    }
    assert bodies[1] == {"module": "sha256:00", "inputs": [{"text": "x"}]}
    assert bodies[2]["deterministic"] is True and "seed" not in bodies[2]
    assert bodies[3]["seed"] == 7 and "deterministic" not in bodies[3]


@pytest.mark.anyio
async def test_the_async_client_sends_deterministic_and_seed() -> None:
    bodies: List[dict] = []
    async with flint_client.AsyncClient("http://flint.test", transport=deterministic_driver(bodies)) as client:
        job = await client.submit("sha256:00", ["x"], deterministic=True, seed=2**53 - 1)
        assert (await job.info()).seed == 7  # the mock's; the driver echoes the given one
        tasks = [t async for t in job.tasks()]
        pins = tasks[0].history[0].pins
        assert pins is not None and pins.files == {"words.txt": "sha256:" + "f0" * 32}
        assert await client.map("sha256:00", ["x"], deterministic=True, seed=3) == [b"FLINT_TASK_INDEX=0"]
        await client.submit("sha256:00", [""])
        with pytest.raises(flint_client.InvalidSpec):
            await client.submit("sha256:00", ["x"], seed=1)
    assert bodies[0]["deterministic"] is True and bodies[0]["seed"] == 2**53 - 1
    assert bodies[1]["deterministic"] is True and bodies[1]["seed"] == 3
    assert "deterministic" not in bodies[2] and "seed" not in bodies[2]
    assert bodies[3]["seed"] == 1 and "deterministic" not in bodies[3]


#: A task of a memoized job that did not run (as the driver answers it): succeeded, with
#: no attempt, the result of task 1 of job-0.
MEMOIZED_TASK = {
    "index": 1,
    "state": "succeeded",
    "attempts": 0,
    "executor": None,
    "exit_code": 0,
    "error": None,
    "result": {"size": 1, "sha256": "3e"},
    "started_at": None,
    "finished_at": None,
    "memoized_from": {"job": "job-0", "task": 1},
}


def test_a_task_view_parses_memoized_from() -> None:
    task = from_json(flint_client.TaskView, MEMOIZED_TASK)
    assert task.memoized_from == flint_client.MemoSource(job="job-0", task=1)
    assert isinstance(task.memoized_from, flint_client.MemoSource)
    assert task.state == "succeeded" and task.attempts == 0 and task.history == [] and task.usage is None
    assert task.result == flint_client.ResultInfo(1, "3e")
    # A task that ran has none: the driver leaves it out, or (another server) sends null.
    assert from_json(flint_client.TaskView, ESCALATED_TASK).memoized_from is None
    assert from_json(flint_client.TaskView, dict(MEMOIZED_TASK, memoized_from=None)).memoized_from is None
    # Fields this client does not know are ignored in it too; what it lacks is defaulted.
    newer = from_json(flint_client.TaskView, dict(MEMOIZED_TASK, memoized_from={"job": "job-0", "task": 1, "more": 2}))
    assert newer.memoized_from == flint_client.MemoSource("job-0", 1)
    assert flint_client.MemoSource() == flint_client.MemoSource("", 0)


def test_memoize_goes_into_the_spec_only_when_true() -> None:
    module = {"module": "sha256:00"}
    plain = core.build_spec(module, inputs=[""], deterministic=True, seed=3)
    assert "memoize" not in plain
    assert core.build_spec(module, inputs=[""], deterministic=True, seed=3, memoize=False) == plain
    memoized = core.build_spec(module, inputs=["a", "b"], args=["echo"], deterministic=True, seed=3, memoize=True)
    assert memoized == {
        "module": "sha256:00",
        "inputs": [{"text": "a"}, {"text": "b"}],
        "args": ["echo"],
        "deterministic": True,
        "seed": 3,
        "memoize": True,
    }
    assert json.loads(json.dumps(memoized)) == memoized
    # Without deterministic it is sent as it is: the driver refuses it (422 invalid_spec).
    alone = core.build_spec(module, inputs=[""], memoize=True)
    assert alone["memoize"] is True and "deterministic" not in alone


def memo_driver(bodies: List[dict]) -> httpx.MockTransport:
    """A mock driver whose job-1 has task 0 run and task 1 memoized; it keeps each
    submitted spec in ``bodies`` and refuses ``memoize`` without ``deterministic`` as
    the driver does."""
    view = {"id": "job-1", "state": "succeeded", "tasks": 2, "counts": {"succeeded": 2}, "seed": 3}
    ran = dict(PINNED_TASK, index=0)

    def handler(request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path == "/v1/jobs" and request.method == "POST":
            body = json.loads(request.content)
            bodies.append(body)
            if body.get("memoize") and not body.get("deterministic"):
                message = 'memoize is for deterministic jobs: give "deterministic": true too'
                return httpx.Response(422, json={"error": {"kind": "invalid_spec", "message": message}})
            return httpx.Response(202, json=view)
        if path == "/v1/jobs/job-1/tasks":
            return httpx.Response(200, json={"items": [ran, MEMOIZED_TASK], "next": None})
        if path == "/v1/jobs/job-1/results":
            return httpx.Response(200, content=frames([b"a", b"b"]))
        return httpx.Response(404, json={"error": {"kind": "not_found", "message": path}})

    return httpx.MockTransport(handler)


def test_submit_and_map_send_memoize_and_tasks_say_where_their_results_came_from() -> None:
    bodies: List[dict] = []
    with flint_client.Client("http://flint.test", transport=memo_driver(bodies)) as client:
        job = client.submit("sha256:00", ["a", "b"], args=["echo"], deterministic=True, seed=3, memoize=True)
        ran, memoized = job.tasks()
        assert ran.memoized_from is None and ran.attempts == 1
        assert memoized.memoized_from == flint_client.MemoSource("job-0", 1) and memoized.attempts == 0
        assert client.map("sha256:00", ["a", "b"], deterministic=True, memoize=True) == [b"a", b"b"]
        client.submit("sha256:00", ["a"], deterministic=True)
        with pytest.raises(flint_client.InvalidSpec, match="deterministic") as refused:
            client.submit("sha256:00", ["a"], memoize=True)
        assert refused.value.kind == "invalid_spec" and refused.value.status == 422
    assert bodies[0] == {
        "module": "sha256:00",
        "inputs": [{"text": "a"}, {"text": "b"}],
        "args": ["echo"],
        "deterministic": True,
        "seed": 3,
        "memoize": True,
    }
    assert bodies[1]["memoize"] is True and bodies[1]["deterministic"] is True
    assert "memoize" not in bodies[2]
    assert bodies[3]["memoize"] is True and "deterministic" not in bodies[3]


@pytest.mark.anyio
async def test_the_async_client_sends_memoize() -> None:
    bodies: List[dict] = []
    async with flint_client.AsyncClient("http://flint.test", transport=memo_driver(bodies)) as client:
        job = await client.submit("sha256:00", ["a", "b"], deterministic=True, memoize=True)
        sources = [t.memoized_from async for t in job.tasks()]
        assert sources == [None, flint_client.MemoSource("job-0", 1)]
        assert await client.map("sha256:00", ["a", "b"], deterministic=True, seed=3, memoize=True) == [b"a", b"b"]
        await client.submit("sha256:00", [""], deterministic=True)
        with pytest.raises(flint_client.InvalidSpec):
            await client.submit("sha256:00", ["x"], memoize=True)
    assert [b.get("memoize") for b in bodies] == [True, True, None, True]
    assert bodies[1]["seed"] == 3 and "deterministic" not in bodies[3]


ORIGINS = ["https://api.example.com", "https://*.example.org:8443"]


def test_network_and_egress_limits_go_into_the_spec_only_when_given() -> None:
    module = {"module": "sha256:00"}
    plain = core.build_spec(module, inputs=[""], resources=flint_client.Resources(memory_mb=64))
    assert "network" not in plain and plain["resources"] == {"memory_mb": 64}
    spec = core.build_spec(
        module,
        inputs=[""],
        network=tuple(ORIGINS),
        resources=flint_client.Resources(egress=flint_client.EgressLimits(max_requests=10, max_concurrent=2)),
    )
    assert spec["network"] == {"allow": ORIGINS}
    assert spec["resources"] == {"egress": {"max_requests": 10, "max_concurrent": 2}}
    assert json.loads(json.dumps(spec)) == spec
    # Limits left to their defaults are left out, whole if none is given.
    empty = flint_client.Resources(memory_mb=64, egress=flint_client.EgressLimits())
    assert core.build_spec(module, inputs=[""], resources=empty)["resources"] == {"memory_mb": 64}
    # The dict form takes EgressLimits or the EgressSpec's JSON form.
    limits = flint_client.EgressLimits(max_bytes=1 << 20)
    assert core.build_spec(module, inputs=[""], resources={"egress": limits, "cores": None})["resources"] == {
        "egress": {"max_bytes": 1 << 20}
    }
    raw = {"egress": {"max_requests": 3}}
    assert core.build_spec(module, inputs=[""], resources=raw)["resources"] == raw
    # What the driver alone can judge is sent as it is: an empty list, limits without
    # network, memoize with network (each a 422 invalid_spec).
    assert core.build_spec(module, inputs=[""], network=[])["network"] == {"allow": []}
    alone = core.build_spec(module, inputs=[""], resources={"egress": limits})
    assert "network" not in alone and alone["resources"] == {"egress": {"max_bytes": 1 << 20}}
    memoized = core.build_spec(module, inputs=[""], deterministic=True, memoize=True, network=ORIGINS[:1])
    assert memoized["memoize"] is True and memoized["network"] == {"allow": ORIGINS[:1]}
    with pytest.raises(TypeError, match="not one string"):
        core.build_spec(module, inputs=[""], network="https://api.example.com")
    with pytest.raises(TypeError, match="not a dict"):
        core.build_spec(module, inputs=[""], network={"allow": ORIGINS})  # type: ignore[arg-type]


def test_egress_denied_events_parse() -> None:
    # As the executor words them: the request, then the rule that refused it.
    denied = [
        "GET https://evil.example.net/: evil.example.net is not in the job's network.allow",
        "GET http://169.254.169.254/latest/meta-data: 169.254.169.254 is a link-local address "
        "(169.254.0.0/16) and the operator did not list it (--egress-allow)",
    ]
    text = (
        b'event: job\ndata: {"id":"job-1","state":"running","tasks":1}\n\n'
        + b"event: egress_denied\ndata: "
        + json.dumps({"index": 0, "attempt": 2, "executor": "exec-1", "denied": denied}).encode()
        + b'\n\nevent: task\ndata: {"index":0,"state":"succeeded","attempt":2,"executor":"exec-1"}\n\n'
    )
    events = [core.parse_event(n, d) for n, d in core.SSEParser().feed(text)]
    assert [e.event for e in events] == ["job", "egress_denied", "task"]
    assert events[1] == flint_client.EgressDeniedEvent(index=0, attempt=2, executor="exec-1", denied=denied)
    # Fields this client does not know are ignored, and a denial without any reads empty.
    assert core.parse_event("egress_denied", '{"index":3,"new":1}') == flint_client.EgressDeniedEvent(index=3)
    with pytest.raises(flint_client.ProtocolError, match="event egress_denied"):
        core.parse_event("egress_denied", "[1]")


EGRESS = {"egress_requests": 3, "egress_bytes_sent": 412, "egress_bytes_received": 90210}


def test_usage_and_tenant_usage_count_egress() -> None:
    usage = from_json(flint_client.Usage, dict(USAGE, **EGRESS))
    assert usage == flint_client.Usage(**USAGE, **EGRESS)
    assert (usage.egress_requests, usage.egress_bytes_sent, usage.egress_bytes_received) == (3, 412, 90210)
    # From a driver older than egress (or a job without network): 0 each.
    assert from_json(flint_client.Usage, USAGE).egress_requests == 0
    tenant = from_json(flint_client.TenantUsage, {"tenant": "a", "attempts": 4, **EGRESS})
    assert tenant.egress_requests == 3 and tenant.egress_bytes_received == 90210
    assert from_json(flint_client.TenantUsage, {"tenant": "a"}).egress_bytes_sent == 0


def egress_driver(bodies: List[dict]) -> httpx.MockTransport:
    """A mock driver that keeps each submitted spec in ``bodies`` and judges ``network``
    as a driver started with ``--egress-allow https://api.example.com`` whose tenant may
    make 10 requests an attempt at most."""
    view = {"id": "job-1", "state": "queued", "tasks": 1, "counts": {"pending": 1}}

    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        bodies.append(body)
        beyond = [o for o in body.get("network", {}).get("allow", []) if o != ORIGINS[0]]
        if beyond:
            message = f'network.allow: "{beyond[0]}" is outside what the operator allows (--egress-allow)'
            return httpx.Response(422, json={"error": {"kind": "invalid_spec", "message": message}})
        asked = body.get("resources", {}).get("egress", {}).get("max_requests", 0)
        if asked > 10:
            message = f'tenant "a": max_egress_requests is 10; resources.egress.max_requests asks for {asked}'
            return httpx.Response(429, json={"error": {"kind": "quota_exceeded", "message": message}})
        return httpx.Response(202, json=view)

    return httpx.MockTransport(handler)


def test_submit_sends_network_and_maps_its_refusals() -> None:
    bodies: List[dict] = []
    with flint_client.Client("http://flint.test", transport=egress_driver(bodies)) as client:
        limits = flint_client.Resources(egress=flint_client.EgressLimits(max_requests=5))
        client.submit("sha256:00", [""], args=["http-get", "https://api.example.com/v1"], network=ORIGINS[:1])
        client.submit("sha256:00", [""], network=ORIGINS[:1], resources=limits)
        with pytest.raises(flint_client.InvalidSpec, match="outside what the operator allows") as refused:
            client.submit("sha256:00", [""], network=ORIGINS)
        assert (refused.value.kind, refused.value.status) == ("invalid_spec", 422)
        with pytest.raises(flint_client.QuotaExceeded, match="max_egress_requests") as over:
            client.submit("sha256:00", [""], network=ORIGINS[:1], resources={"egress": {"max_requests": 11}})
        assert over.value.status == 429
    assert bodies[0] == {
        "module": "sha256:00",
        "inputs": [{"text": ""}],
        "args": ["http-get", "https://api.example.com/v1"],
        "network": {"allow": ["https://api.example.com"]},
    }
    assert bodies[1]["resources"] == {"egress": {"max_requests": 5}}
    assert bodies[2]["network"] == {"allow": ORIGINS}


@pytest.mark.anyio
async def test_the_async_client_sends_network() -> None:
    bodies: List[dict] = []
    async with flint_client.AsyncClient("http://flint.test", transport=egress_driver(bodies)) as client:
        await client.submit("sha256:00", [""], network=ORIGINS[:1])
        with pytest.raises(flint_client.InvalidSpec):
            await client.submit("sha256:00", [""], network=ORIGINS)
    assert [b["network"] for b in bodies] == [{"allow": ORIGINS[:1]}, {"allow": ORIGINS}]


def test_map_takes_a_constant_number_of_requests() -> None:
    """20,000 tasks: upload, submit (answered when the job ended), one bulk read."""
    n = 20_000
    seen: List[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(f"{request.method} {request.url.path}")
        view = {"id": "job-1", "name": "", "state": "succeeded", "tasks": n, "counts": {"succeeded": n}}
        if request.url.path == "/v1/modules":
            return httpx.Response(201, json={"id": "sha256:00", "size": 3})
        if request.url.path == "/v1/jobs":
            assert request.url.params["wait"] == "300"
            assert len(json.loads(request.content)["inputs"]) == n
            return httpx.Response(202, json=view)
        if request.url.path == "/v1/jobs/job-1/results":
            return httpx.Response(200, content=frames([str(i).encode() for i in range(n)]))
        return httpx.Response(404, json={"error": {"kind": "not_found", "message": request.url.path}})

    with flint_client.Client("http://flint.test", transport=httpx.MockTransport(handler)) as client:
        results = client.map(b"\0asm", [b""] * n, args=["noop"], decode="text")
    assert results == [str(i) for i in range(n)]
    assert seen == ["PUT /v1/modules", "POST /v1/jobs", "GET /v1/jobs/job-1/results"]


def test_overloaded_is_retried_after_retry_after() -> None:
    calls = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request.url.path)
        if len(calls) == 1:
            return httpx.Response(
                503, json={"error": {"kind": "overloaded", "message": "busy"}}, headers={"retry-after": "0"}
            )
        return httpx.Response(200, json={"items": [], "next": None})

    with flint_client.Client("http://flint.test", transport=httpx.MockTransport(handler)) as client:
        assert list(client.executors()) == []
    assert len(calls) == 2


def test_an_unreachable_driver_is_a_connection_error() -> None:
    with flint_client.Client("http://127.0.0.1:9", timeout=2) as client:
        with pytest.raises(flint_client.FlintConnectionError, match="cannot reach the driver at http://127.0.0.1:9"):
            client.health()


def test_the_environment_gives_url_and_token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLINT_URL", "http://example.test:1234/")
    monkeypatch.setenv("FLINT_TOKEN", "s3cret")
    seen = {}

    def handler(request: httpx.Request) -> httpx.Response:
        seen["url"] = str(request.url)
        seen["auth"] = request.headers.get("authorization")
        return httpx.Response(200, text="ok\n")

    with flint_client.Client(transport=httpx.MockTransport(handler)) as client:
        assert client.url == "http://example.test:1234"
        assert client.health()
    assert seen == {"url": "http://example.test:1234/healthz", "auth": "Bearer s3cret"}


def test_timeline_reads_every_page() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        after = request.url.params.get("after")
        attempt = {"task": 0 if after is None else 1, "attempt": 1, "executor": "exec-1", "start_us": 1, "end_us": 5}
        return httpx.Response(
            200,
            json={
                "job": "job-1",
                "now_us": 9 if after else 7,
                "created_us": 0,
                "finished_us": 6,
                "attempts": [dict(attempt, outcome="succeeded", speculative=False)],
                "next": None if after else "1",
            },
        )

    with flint_client.Client("http://flint.test", transport=httpx.MockTransport(handler)) as client:
        timeline = client.job("job-1").timeline()
    assert [a.task for a in timeline.attempts] == [0, 1]
    assert timeline.next is None and timeline.now_us == 9
    assert timeline.attempts[0].duration_us == 4


def failing_driver(request: httpx.Request) -> httpx.Response:
    """A mock driver whose job 1 failed: task 0 succeeded, 1 exited 3, 2 was killed."""
    view = {
        "id": "job-1",
        "state": "failed",
        "tasks": 3,
        "counts": {"succeeded": 1, "failed": 1, "killed": 1},
        "error": {"kind": "task_failed", "message": "task 1 failed: exit: exited with code 3"},
    }
    path = request.url.path
    if path == "/v1/modules":
        return httpx.Response(201, json={"id": "sha256:00", "size": 3})
    if path == "/v1/jobs":
        return httpx.Response(202, json=view)
    if path == "/v1/jobs/job-1":
        return httpx.Response(200, json=view)
    if path == "/v1/jobs/job-1/tasks":
        items = [
            {"index": 0, "state": "succeeded", "attempts": 1},
            {"index": 1, "state": "failed", "attempts": 1, "exit_code": 3, "error": {"kind": "exit", "message": "exited with code 3"}},
            {"index": 2, "state": "killed", "attempts": 0, "error": {"kind": "killed", "message": "its job failed"}},
        ]
        return httpx.Response(200, json={"items": items, "next": None})
    if path == "/v1/jobs/job-1/results":
        return httpx.Response(200, content=frames([b"ok", None, None]))
    return httpx.Response(404, json={"error": {"kind": "not_found", "message": path}})


def test_job_failed_names_the_failed_tasks() -> None:
    with flint_client.Client("http://flint.test", transport=httpx.MockTransport(failing_driver)) as client:
        with pytest.raises(flint_client.JobFailed) as caught:
            client.map(b"\0asm", ["a", "b", "c"])
        assert caught.value.failures == [flint_client.TaskFailure(1, "exit", "exited with code 3", 3)]
        assert caught.value.kind == "task_failed" and "task 1: exit: exited with code 3" in str(caught.value)
        assert client.map(b"\0asm", ["a", "b", "c"], raise_on_failure=False) == [b"ok", None, None]


@pytest.mark.anyio
async def test_the_async_client_shares_the_flows() -> None:
    async with flint_client.AsyncClient("http://flint.test", transport=httpx.MockTransport(failing_driver)) as client:
        with pytest.raises(flint_client.JobFailed) as caught:
            await client.map(b"\0asm", ["a", "b", "c"])
        assert [f.index for f in caught.value.failures] == [1]
        job = client.job("job-1")
        assert [t.state async for t in job.tasks()] == ["succeeded", "failed", "killed"]
        # A fresh handle learns the job failed from the driver, and raises as map did.
        with pytest.raises(flint_client.JobFailed) as caught:
            await job.results(decode="text")
        assert [f.index for f in caught.value.failures] == [1]
        assert await job.results(decode="text", allow_failed=True) == ["ok", None, None]
        with pytest.raises(flint_client.NotFound):
            await client.cluster_history()


class CutStream(httpx.SyncByteStream, httpx.AsyncByteStream):
    """A body that fails part way, as hyper's does when the driver cuts it (or with
    ``error``, such as a read timeout)."""

    def __init__(self, head: bytes, error: Optional[Exception] = None) -> None:
        self.head = head
        self.error = error or httpx.RemoteProtocolError("peer closed connection without sending complete message body")

    def __iter__(self):  # type: ignore[no-untyped-def]
        yield self.head
        raise self.error

    async def __aiter__(self):  # type: ignore[no-untyped-def]
        yield self.head
        raise self.error


def cut_driver(request: httpx.Request) -> httpx.Response:
    """Job 1's results: 2 frames of 3 announced, then a clean end; job 2's: 1 frame,
    then a failed connection; job 3's: 1 frame, then a read timeout."""
    if request.url.path == "/v1/jobs/job-1/results":
        return httpx.Response(200, content=frames([b"a", b"b"]), headers={"flint-tasks": "3"})
    if request.url.path == "/v1/jobs/job-2/results":
        return httpx.Response(200, stream=CutStream(frames([b"a"])), headers={"flint-tasks": "3"})
    if request.url.path == "/v1/jobs/job-3/results":
        stalled = CutStream(frames([b"a"]), httpx.ReadTimeout("timed out"))
        return httpx.Response(200, stream=stalled, headers={"flint-tasks": "3"})
    return httpx.Response(404, json={"error": {"kind": "not_found", "message": request.url.path}})


def test_a_results_stream_short_of_its_frames_is_an_error() -> None:
    with flint_client.Client("http://flint.test", transport=httpx.MockTransport(cut_driver)) as client:
        with pytest.raises(flint_client.ProtocolError, match="ended after 2 of 3 tasks"):
            client.job("job-1").results()
        with pytest.raises(flint_client.ProtocolError, match="cut after 1 of 3 tasks.*RemoteProtocolError"):
            client.job("job-2").results()
        # A driver that stops sending is a timeout, as on any other request.
        with pytest.raises(flint_client.FlintTimeoutError, match="did not answer in time"):
            client.job("job-3").results()
    # Frames out of order (or a task twice) are refused as they come.
    parser = core.FrameParser()
    with pytest.raises(flint_client.ProtocolError, match="task 2 where task 1 was next"):
        parser.feed(frames([b"a"]) + struct.pack(">IBQ", 2, 0, 0))


@pytest.mark.anyio
async def test_the_async_client_sees_a_cut_results_stream() -> None:
    async with flint_client.AsyncClient("http://flint.test", transport=httpx.MockTransport(cut_driver)) as client:
        with pytest.raises(flint_client.ProtocolError, match="ended after 2 of 3 tasks"):
            await client.job("job-1").results()
        with pytest.raises(flint_client.ProtocolError, match="cut after 1 of 3 tasks"):
            await client.job("job-2").results()
        with pytest.raises(flint_client.FlintTimeoutError, match="did not answer in time"):
            await client.job("job-3").results()


MODULE = b"\0asm\1\0\0\0"
MODULE_ID = "sha256:" + hashlib.sha256(MODULE).hexdigest()

#: A deterministic task's bundle (as the driver answers it): it exited 3, and its stdin
#: is an inline part and a block the driver serves.
BUNDLE = {
    "job": "job-1",
    "task": 0,
    "attempt": 1,
    "task_count": 2,
    "name": "job",
    "module": {"url": f"/v1/modules/{MODULE_ID}", "sha256": MODULE_ID},
    "files": {"words.txt": {"url": "https://h/words.txt", "sha256": "sha256:" + "f0" * 32}},
    "input": [
        {"base64": "aGk="},
        {"url": "/v1/blocks/job-0/0-1-7", "sha256": "sha256:" + hashlib.sha256(b" there").hexdigest()},
    ],
    "input_sha256": "sha256:" + hashlib.sha256(b"hi there").hexdigest(),
    "args": ["exit", "3"],
    "env": {"COLOUR": "red"},
    "deterministic": True,
    "seed": 5,
    "memory_mb": 256,
    "timeout_ms": 60000,
    "max_output_bytes": 1073741824,
    "fuel": None,
    "outcome": "exit",
    "error": {"kind": "exit", "message": "exited with code 3"},
    "log_sha256": "sha256:68b4282e36940b17cb09353849cbcfab59d2f6800d306056db90d46793861e02",
    "result_sha256": None,
}

#: An earlier attempt of a plain job: everything the driver may leave null, null.
BARE_BUNDLE = dict(
    BUNDLE,
    attempt=1,
    module={"url": "https://h/m.wasm", "sha256": None},
    files={},
    input=[{"url": "https://h/in.txt", "sha256": None}],
    input_sha256=None,
    env={},
    deterministic=False,
    seed=None,
    outcome="memory_limit",
    error=None,
    log_sha256=None,
    result_sha256=None,
)


def test_a_replay_bundle_parses_with_its_sources_and_input_parts() -> None:
    bundle = from_json(flint_client.ReplayBundle, BUNDLE)
    assert bundle.job == "job-1" and (bundle.task, bundle.attempt, bundle.task_count) == (0, 1, 2)
    assert bundle.module == flint_client.ReplaySource(f"/v1/modules/{MODULE_ID}", MODULE_ID)
    assert bundle.module.on_driver
    assert bundle.files == {"words.txt": flint_client.ReplaySource("https://h/words.txt", "sha256:" + "f0" * 32)}
    assert isinstance(bundle.files["words.txt"], flint_client.ReplaySource)
    assert not bundle.files["words.txt"].on_driver
    inline, block = bundle.input
    assert inline == flint_client.InlinePart("aGk=") and inline.bytes == b"hi"
    assert isinstance(block, flint_client.ReplaySource) and block.url == "/v1/blocks/job-0/0-1-7"
    assert bundle.args == ["exit", "3"] and bundle.env == {"COLOUR": "red"}
    assert bundle.deterministic is True and bundle.seed == 5
    assert (bundle.memory_mb, bundle.timeout_ms, bundle.max_output_bytes, bundle.fuel) == (256, 60000, 1 << 30, None)
    assert bundle.outcome == "exit" and bundle.error == flint_client.ErrorBody("exit", "exited with code 3")
    assert bundle.log_sha256 == BUNDLE["log_sha256"] and bundle.result_sha256 is None
    assert bundle.input_sha256 == BUNDLE["input_sha256"]


def test_a_replay_bundle_with_nulls_parses() -> None:
    bundle = from_json(flint_client.ReplayBundle, BARE_BUNDLE)
    assert bundle.module == flint_client.ReplaySource("https://h/m.wasm") and bundle.module.sha256 is None
    assert bundle.input == [flint_client.ReplaySource("https://h/in.txt", None)]
    assert bundle.files == {} and bundle.env == {}
    assert bundle.input_sha256 is None and bundle.seed is None and not bundle.deterministic
    assert bundle.error is None and bundle.log_sha256 is None and bundle.result_sha256 is None
    assert bundle.outcome == "memory_limit"
    # An attempt still running has no outcome; an empty stdin is one empty inline part.
    running = from_json(flint_client.ReplayBundle, dict(BARE_BUNDLE, outcome=None, input=[{"base64": ""}]))
    assert running.outcome is None and running.input == [flint_client.InlinePart("")]
    (empty,) = running.input
    assert isinstance(empty, flint_client.InlinePart) and empty.bytes == b""
    # Fields this client does not know are ignored, in the parts too.
    newer = from_json(flint_client.ReplayBundle, dict(BUNDLE, input=[{"base64": "eA==", "more": 1}], later=2))
    assert newer.input == [flint_client.InlinePart("eA==")]
    # A part that is neither kind is not the driver's answer.
    with pytest.raises(ValueError, match="expected InlinePart or ReplaySource"):
        from_json(flint_client.ReplayBundle, dict(BUNDLE, input=[{"text": "x"}]))


def replay_driver(seen: List[str], block: bytes = b" there") -> httpx.MockTransport:
    """A mock driver of job 1's bundle (``BUNDLE``; attempt 9 does not exist), of job 2's
    (an upload it ran was deleted), of job 3's (its task not run yet); the module and
    block it names; each request's path and query in ``seen``."""

    def handler(request: httpx.Request) -> httpx.Response:
        query = request.url.query.decode()
        seen.append(request.url.path + (f"?{query}" if query else ""))
        path = request.url.path

        def error(status: int, kind: str, message: str) -> httpx.Response:
            return httpx.Response(status, json={"error": {"kind": kind, "message": message}})

        if path == "/v1/jobs/job-1/tasks/0/replay":
            if request.url.params.get("attempt", "1") != "1":
                return error(404, "attempt_not_found", "task 0 of job job-1 has no attempt 9")
            return httpx.Response(200, json=BUNDLE)
        if path == "/v1/jobs/job-2/tasks/0/replay":
            return error(410, "replay_unavailable", f"module {MODULE_ID} was deleted since the attempt ran")
        if path == "/v1/jobs/job-3/tasks/0/replay":
            return error(409, "not_run", "task 0 of job job-3 has not run yet: nothing to replay")
        if path == f"/v1/modules/{MODULE_ID}":
            return httpx.Response(200, content=MODULE)
        if path == "/v1/blocks/job-0/0-1-7":
            return httpx.Response(200, content=block)
        return error(404, "not_found", path)

    return httpx.MockTransport(handler)


def test_replay_asks_for_the_latest_attempt_or_the_one_given_and_maps_its_errors() -> None:
    seen: List[str] = []
    with flint_client.Client("http://flint.test", transport=replay_driver(seen)) as client:
        bundle = client.replay("job-1", 0)
        assert bundle == from_json(flint_client.ReplayBundle, BUNDLE)
        assert client.replay("job-1", 0, attempt=1) == bundle
        assert client.job("job-1").replay(0) == bundle
        assert client.job("job-1").replay(0, attempt=1) == bundle
        with pytest.raises(flint_client.NotFound) as missing:
            client.replay("job-1", 0, attempt=9)
        assert (missing.value.kind, missing.value.status) == ("attempt_not_found", 404)
        with pytest.raises(flint_client.ReplayUnavailable) as gone:
            client.replay("job-2", 0)
        assert (gone.value.kind, gone.value.status) == ("replay_unavailable", 410)
        assert "deleted" in str(gone.value)
        with pytest.raises(flint_client.Conflict) as not_run:
            client.job("job-3").replay(0)
        assert (not_run.value.kind, not_run.value.status) == ("not_run", 409)
    assert seen == [
        "/v1/jobs/job-1/tasks/0/replay",
        "/v1/jobs/job-1/tasks/0/replay?attempt=1",
        "/v1/jobs/job-1/tasks/0/replay",
        "/v1/jobs/job-1/tasks/0/replay?attempt=1",
        "/v1/jobs/job-1/tasks/0/replay?attempt=9",
        "/v1/jobs/job-2/tasks/0/replay",
        "/v1/jobs/job-3/tasks/0/replay",
    ]


def test_replay_paths_escape_the_job_id() -> None:
    request = next(core.get_replay("job/../x", 3, attempt=2))
    assert request.method == "GET" and request.path == "/v1/jobs/job%2F..%2Fx/tasks/3/replay"
    assert request.params == {"attempt": 2}
    assert next(core.get_replay("job-1", 0)).params is None


def test_replay_bytes_come_from_the_bundle_or_the_driver_and_are_checked() -> None:
    seen: List[str] = []
    with flint_client.Client("http://flint.test", transport=replay_driver(seen)) as client:
        bundle = client.replay("job-1", 0)
        assert client.replay_bytes(bundle.input[0]) == b"hi"
        assert client.replay_bytes(bundle.module) == MODULE
        assert client.replay_input(bundle) == b"hi there"
        # A job's own URL is not the driver's: the client does not fetch it (nor send its
        # token there).
        with pytest.raises(ValueError, match=r"https://h/words.txt is not on the driver: fetch it yourself"):
            client.replay_bytes(bundle.files["words.txt"])
        bare = from_json(flint_client.ReplayBundle, BARE_BUNDLE)
        with pytest.raises(ValueError, match="input part 0 is at https://h/in.txt"):
            client.replay_input(bare)
    assert seen == ["/v1/jobs/job-1/tasks/0/replay", f"/v1/modules/{MODULE_ID}", "/v1/blocks/job-0/0-1-7"]
    # Bytes the driver serves now that are not those the attempt ran are refused.
    with flint_client.Client("http://flint.test", transport=replay_driver([], block=b" where")) as client:
        bundle = client.replay("job-1", 0)
        with pytest.raises(flint_client.ReplayUnavailable, match="input part 1 has changed since the attempt ran"):
            client.replay_input(bundle)
    # And a whole stdin that is not the one recorded, though each part has no digest.
    unpinned = dataclasses.replace(bundle, input=[flint_client.InlinePart("aGk=")])
    with pytest.raises(flint_client.ReplayUnavailable) as changed:
        run(core.replay_input(unpinned))
    assert changed.value.kind == "source_changed" and changed.value.status is None
    assert "the input has changed" in changed.value.message


def run(flow: "core.Flow[bytes]") -> bytes:
    """A flow that sends no request, run to its answer."""
    try:
        next(flow)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]
    raise AssertionError("the flow sent a request")


@pytest.mark.anyio
async def test_the_async_client_replays() -> None:
    seen: List[str] = []
    async with flint_client.AsyncClient("http://flint.test", transport=replay_driver(seen)) as client:
        bundle = await client.replay("job-1", 0)
        assert bundle.seed == 5 and bundle.error is not None and bundle.error.kind == "exit"
        assert await client.job("job-1").replay(0, attempt=1) == bundle
        assert await client.replay_input(bundle) == b"hi there"
        assert await client.replay_bytes(bundle.module) == MODULE
        with pytest.raises(flint_client.NotFound) as missing:
            await client.job("job-1").replay(0, attempt=9)
        assert missing.value.kind == "attempt_not_found"
        with pytest.raises(flint_client.ReplayUnavailable):
            await client.replay("job-2", 0)
    assert seen[:2] == ["/v1/jobs/job-1/tasks/0/replay", "/v1/jobs/job-1/tasks/0/replay?attempt=1"]


# --- graphs and waiting tasks --------------------------------------------------------


def test_waiting_tasks_are_counted_and_not_done() -> None:
    view = from_json(
        flint_client.JobView,
        {"id": "job-2", "state": "queued", "tasks": 3, "counts": {"waiting": 2, "pending": 1}},
    )
    assert view.counts.waiting == 2 and view.counts.done == 0 and not view.ended
    # A driver before pipelines has no `waiting`: 0.
    assert from_json(flint_client.TaskCounts, {"pending": 1}).waiting == 0
    total = flint_client.TaskCounts(waiting=1, succeeded=2) + flint_client.TaskCounts(waiting=2, failed=1)
    assert total == flint_client.TaskCounts(waiting=3, succeeded=2, failed=1) and total.done == 3


def test_the_progress_bar_moves_waiting_tasks() -> None:
    from flint_client._progress import Progress

    view = from_json(
        flint_client.JobView, {"id": "job-2", "state": "queued", "tasks": 2, "counts": {"waiting": 2}}
    )
    bar = Progress("job-2", enabled=False)
    bar.event(flint_client.JobEvent(view))
    bar.event(flint_client.TaskEvent(0, "pending"))  # its inputs came
    assert (bar.counts["waiting"], bar.counts["pending"]) == (1, 1)
    bar.event(flint_client.TaskEvent(0, "running", 1, "exec-1"))
    bar.event(flint_client.TaskEvent(0, "succeeded", 1, "exec-1"))
    bar.event(flint_client.TaskEvent(1, "failed"))  # upstream_failed: it never ran
    assert bar.counts == {"waiting": 0, "pending": 0, "running": 0, "succeeded": 1, "failed": 1, "killed": 0}


def test_graph_helpers_name_jobs_of_the_graph() -> None:
    assert flint_client.graph_results("map") == flint_client.ResultsRef("map")
    spec = core.build_spec(
        {"module": "m"},
        inputs=[flint_client.graph_results("map"), flint_client.graph_results("map", [1, 0]),
                flint_client.graph_result("split", 3)],
    )
    assert spec["inputs"] == [
        {"results": {"job": "map"}},
        {"results": {"job": "map", "tasks": [1, 0]}},
        {"result": {"job": "split", "task": 3}},
    ]


GRAPH_VIEW = {
    "id": "graph-1",
    "state": "failed",
    "created_at_ms": 1765000000000,
    "jobs": {
        "map": {
            "id": "job-m",
            "state": "failed",
            "tasks": 2,
            "counts": {"succeeded": 1, "failed": 1},
            "error": {"kind": "task_failed", "message": "task 1 failed: exit: exited with code 3"},
        },
        "reduce": {
            "id": "job-r",
            "state": "failed",
            "tasks": 1,
            "counts": {"failed": 1},
            "error": {"kind": "upstream_failed", "message": "task 0 upstream_failed: not run: job-m task 1 failed"},
        },
        "side": {"id": "job-s", "state": "succeeded", "tasks": 1, "counts": {"succeeded": 1}},
    },
    "edges": [{"from": "map", "to": "reduce"}],
}


def test_a_graph_view_parses() -> None:
    view = from_json(flint_client.GraphView, GRAPH_VIEW)
    assert view.ended and not view.succeeded and view.created_at_ms == 1765000000000
    assert view.edges == [flint_client.GraphEdge(from_="map", to="reduce")]
    reduce = view.jobs["reduce"]
    assert isinstance(reduce, flint_client.GraphJobView) and reduce.id == "job-r" and reduce.ended
    assert reduce.error == flint_client.ErrorBody("upstream_failed", reduce.error.message if reduce.error else "")
    assert view.tasks == 4 and view.counts == flint_client.TaskCounts(succeeded=2, failed=2)
    assert core.blamed_job(view) == "map"
    # Only jobs that failed for an upstream outside the graph: the first of them.
    upstream_only = dict(GRAPH_VIEW, jobs={k: v for k, v in GRAPH_VIEW["jobs"].items() if k != "map"})
    assert core.blamed_job(from_json(flint_client.GraphView, upstream_only)) == "reduce"
    created = from_json(flint_client.GraphCreated, {"id": "graph-1", "jobs": {"a": "job-1"}, "state": "queued"})
    assert created.jobs == {"a": "job-1"} and created.state == "queued"


def graph_driver(seen: List[str], bodies: List[dict], running: bool = False) -> httpx.MockTransport:
    """A mock driver of graph 1 (map, reduce and side; map failed), or of a graph that
    keeps running."""

    def handler(request: httpx.Request) -> httpx.Response:
        path = request.url.path
        seen.append(f"{request.method} {path}" + (f"?{request.url.query.decode()}" if request.url.query else ""))
        if request.method == "PUT" and path in ("/v1/modules", "/v1/files"):
            digest = hashlib.sha256(request.content).hexdigest()
            return httpx.Response(201, json={"id": f"sha256:{digest}", "size": len(request.content)})
        if request.method == "POST" and path == "/v1/graphs":
            body = json.loads(request.content)
            bodies.append(body)
            ids = {name: f"job-{name[0]}" for name in sorted(body["jobs"])}
            return httpx.Response(202, json={"id": "graph-1", "jobs": ids, "state": "queued"})
        if path == "/v1/graphs/graph-1":
            if request.method == "DELETE":
                return httpx.Response(204)
            if running:
                jobs = {n: dict(j, state="running", error=None) for n, j in GRAPH_VIEW["jobs"].items()}
                return httpx.Response(200, json=dict(GRAPH_VIEW, state="running", jobs=jobs))
            return httpx.Response(200, json=GRAPH_VIEW)
        if path == "/v1/graphs/graph-1/kill":
            return httpx.Response(202, json=GRAPH_VIEW)
        if path == "/v1/jobs/job-m":
            return httpx.Response(
                200,
                json={
                    "id": "job-m",
                    "state": "failed",
                    "tasks": 2,
                    "counts": {"succeeded": 1, "failed": 1},
                    "error": GRAPH_VIEW["jobs"]["map"]["error"],  # type: ignore[index]
                },
            )
        if path == "/v1/jobs/job-m/tasks":
            items = [
                {"index": 0, "state": "succeeded", "attempts": 1},
                {"index": 1, "state": "failed", "attempts": 1, "exit_code": 3,
                 "error": {"kind": "exit", "message": "exited with code 3"}},
            ]
            return httpx.Response(200, json={"items": items, "next": None})
        kind = "graph_not_found" if path.startswith("/v1/graphs/") else "not_found"
        return httpx.Response(404, json={"error": {"kind": kind, "message": f"no {path}"}})

    return httpx.MockTransport(handler)


def test_a_graph_sends_every_job_uploading_each_module_once(tmp_path: Path) -> None:
    module = tmp_path / "m.wasm"
    module.write_bytes(b"\0asm module")
    seen: List[str] = []
    bodies: List[dict] = []
    with flint_client.Client("http://flint.test", transport=graph_driver(seen, bodies)) as client:
        outside = client.job("job-0")
        graph = client.graph(
            {
                "side": dict(module="sha256:00", inputs=[outside.results_ref()], args=["echo"], network=ORIGINS[:1]),
                "map": dict(module=module, inputs=["a", b"b"], files={"f": b"file", "g": b"file"}, args=["echo"]),
                "reduce": dict(
                    module=str(module),
                    inputs=[flint_client.graph_results("map"), flint_client.graph_result("map", 1)],
                    resources=flint_client.Resources(memory_mb=64),
                ),
            },
            wait=5,
        )
    module_id = "sha256:" + hashlib.sha256(b"\0asm module").hexdigest()
    file_id = "sha256:" + hashlib.sha256(b"file").hexdigest()
    # The module and the file once each, however many jobs and names use them.
    assert seen == ["PUT /v1/modules", "PUT /v1/files", "POST /v1/graphs?wait=5"]
    assert bodies == [
        {
            "jobs": {
                "side": {
                    "module": "sha256:00",
                    "inputs": [{"results": {"job": "job-0"}}],
                    "args": ["echo"],
                    "network": {"allow": ["https://api.example.com"]},
                },
                "map": {
                    "module": module_id,
                    "inputs": [{"text": "a"}, {"base64": "Yg=="}],
                    "files": {"f": file_id, "g": file_id},
                    "args": ["echo"],
                },
                "reduce": {
                    "module": module_id,
                    "inputs": [{"results": {"job": "map"}}, {"result": {"job": "map", "task": 1}}],
                    "resources": {"memory_mb": 64},
                },
            }
        }
    ]
    assert isinstance(graph, flint_client.Graph) and graph.id == "graph-1"
    assert list(graph.jobs) == ["side", "map", "reduce"], "in the order given"
    assert graph["reduce"] == client.job("job-r") and graph.jobs["map"].id == "job-m"
    assert graph.created is not None and graph.created.state == "queued" and graph.view is None


def test_a_graph_job_is_checked_before_anything_is_sent() -> None:
    seen: List[str] = []
    with flint_client.Client("http://flint.test", transport=graph_driver(seen, [])) as client:
        with pytest.raises(TypeError, match=r"graph job 'a': unknown arguments \['idempotency_key'\]"):
            client.graph({"a": dict(module="sha256:00", inputs=[""], idempotency_key="k")})
        with pytest.raises(TypeError, match="graph job 'a': no module"):
            client.graph({"a": dict(inputs=[""])})
        with pytest.raises(TypeError, match="give a dict of submit's arguments"):
            client.graph({"a": "sha256:00"})  # type: ignore[dict-item]
        with pytest.raises(ValueError, match="graph job 'b': give exactly one of inputs"):
            client.graph({"a": dict(module="sha256:00", inputs=[""]), "b": dict(module="sha256:00")})
        with pytest.raises(ValueError, match="at least one job"):
            client.graph({})
    assert seen == []


def test_a_graph_that_failed_raises_graph_failed_blaming_the_job_that_failed() -> None:
    seen: List[str] = []
    with flint_client.Client("http://flint.test", transport=graph_driver(seen, [])) as client:
        graph = client.get_graph("graph-1")
        assert seen == ["GET /v1/graphs/graph-1"]
        assert graph.view is not None and list(graph.jobs) == ["map", "reduce", "side"]
        view = graph.wait()  # already over: no request more, and no raise by default
        assert view.state == "failed" and len(seen) == 1
        with pytest.raises(flint_client.JobFailed) as caught:
            graph.wait(raise_on_failure=True)
        failed = caught.value
        assert isinstance(failed, flint_client.GraphFailed)
        assert failed.name == "map" and failed.graph == view and failed.kind == "task_failed"
        assert failed.job.id == "job-m"
        assert failed.failures == [flint_client.TaskFailure(1, "exit", "exited with code 3", 3)]
        assert str(failed).startswith("task_failed: graph graph-1 failed: job 'map': job job-m failed")
        assert "also ended without succeeding: reduce" in str(failed)
        assert graph.kill().state == "failed"
        graph.delete()
        with pytest.raises(flint_client.NotFound) as missing:
            client.get_graph("graph-none")
        assert missing.value.kind == "graph_not_found" and missing.value.status == 404
    assert seen[-3:] == ["POST /v1/graphs/graph-1/kill", "DELETE /v1/graphs/graph-1", "GET /v1/graphs/graph-none"]


def test_a_graph_wait_times_out_with_the_graph_as_last_seen() -> None:
    seen: List[str] = []
    with flint_client.Client("http://flint.test", transport=graph_driver(seen, [], running=True)) as client:
        graph = client.get_graph("graph-1")
        with pytest.raises(flint_client.WaitTimeout) as caught:
            graph.wait(timeout=0.2)
    timeout = caught.value
    assert timeout.graph is not None and timeout.graph.state == "running"
    assert timeout.job.id == "graph-1" and timeout.job.tasks == 4 and timeout.job.counts.running == 0
    assert any(s.startswith("GET /v1/graphs/graph-1?wait=0.") for s in seen), seen


@pytest.mark.anyio
async def test_the_async_client_submits_and_follows_graphs() -> None:
    seen: List[str] = []
    bodies: List[dict] = []
    async with flint_client.AsyncClient("http://flint.test", transport=graph_driver(seen, bodies)) as client:
        graph = await client.graph(
            {
                "map": {"module": b"\0asm", "inputs": ["x"]},
                "reduce": {"module": b"\0asm", "inputs": [flint_client.graph_results("map")]},
            }
        )
        assert isinstance(graph, flint_client.AsyncGraph) and isinstance(graph["map"], flint_client.AsyncJob)
        assert (await graph.info()).jobs["map"].state == "failed"
        with pytest.raises(flint_client.GraphFailed) as caught:
            await graph.wait(raise_on_failure=True)
        assert caught.value.name == "map" and [f.index for f in caught.value.failures] == [1]
        assert (await graph.kill()).ended
        await graph.delete()
        with pytest.raises(flint_client.NotFound):
            await client.get_graph("graph-none")
    assert seen[:2] == ["PUT /v1/modules", "POST /v1/graphs"]
    assert bodies[0]["jobs"]["reduce"]["inputs"] == [{"results": {"job": "map"}}]
