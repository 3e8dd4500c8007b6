"""The async client against a real ``flint dev``: the same calls, awaited."""

from __future__ import annotations

import hashlib

import pytest

import flint_client
from flint_client import AsyncClient, JobFailed, NotFound

from .conftest import Driver, Guests

pytestmark = pytest.mark.anyio


async def test_submit_wait_events_results(driver: Driver, guests: Guests) -> None:
    async with AsyncClient(driver.url) as client:
        assert await client.health()
        module = await client.upload_module(guests.testkit)
        job = await client.submit(module, ["one", b"two"], args=["echo"])
        assert isinstance(job, flint_client.AsyncJob)
        view = await job.wait(60)
        assert view.state == "succeeded"
        assert await job.result(0) == b"one"
        assert await job.text(1) == "two"
        assert await job.results() == [b"one", b"two"]
        assert await job.results(decode="text") == ["one", "two"]
        assert [(i, r) async for i, r in job.iter_results()] == [(0, b"one"), (1, b"two")]
        assert [t.index async for t in job.tasks()] == [0, 1]
        chunks = [c async for c in job.stream_result(0)]
        assert b"".join(chunks) == b"one"
        events = [e async for e in job.events()]
        assert [type(e) for e in events] == [flint_client.EndEvent]

        running = await client.submit(guests.testkit, ["", ""], args=["sleep", "1000"])
        events = [e async for e in running.events()]
        assert isinstance(events[0], flint_client.JobEvent)
        assert isinstance(events[-1], flint_client.EndEvent) and events[-1].job.state == "succeeded"
        assert {e.index for e in events if isinstance(e, flint_client.TaskEvent) and e.state == "succeeded"} == {0, 1}


async def test_map_failures_kill_logs_and_errors(driver: Driver, guests: Guests) -> None:
    async with AsyncClient(driver.url) as client:
        counts = await client.map(guests.wordcount, ["a b a", "c"], decode="json")
        assert counts == [{"a": 2, "b": 1}, {"c": 1}]
        mapped = await client.submit(guests.wordcount, ["x y", "y z"])
        await mapped.wait(60, raise_on_failure=True)
        total = await client.map(guests.reduce, [mapped.results_ref()], decode="json")
        assert total == [{"x": 1, "y": 2, "z": 1}]
        assert await client.map(guests.testkit, [""] * 4, args=["noop"], progress=True) == [b""] * 4

        with pytest.raises(JobFailed) as caught:
            await client.map(guests.testkit, ["x"], args=["panic"])
        assert [(f.index, f.kind) for f in caught.value.failures] == [(0, "trap")]

        sleeping = await client.submit(guests.testkit, [""], args=["sleep", "60000"])
        assert (await sleeping.kill()).state == "killed"
        assert (await sleeping.wait(30, progress=True)).state == "killed"
        with pytest.raises(JobFailed) as killed:
            await client.job(sleeping.id).results()
        assert killed.value.job.state == "killed"
        assert await sleeping.results(allow_failed=True) == [None]

        logged = await client.submit(guests.testkit, [""], args=["eprint", "10"])
        await logged.wait(60)
        assert await logged.logs(0) == "e" * 10
        bundle = await logged.replay(0)
        assert bundle.outcome == "succeeded" and bundle.args == ["eprint", "10"] and not bundle.deterministic
        assert bundle.log_sha256 == "sha256:" + hashlib.sha256(b"e" * 10).hexdigest()
        assert bundle.result_sha256 == "sha256:" + hashlib.sha256(b"").hexdigest()
        assert await client.replay(logged.id, 0, attempt=1) == bundle
        assert await client.replay_input(bundle) == b""

        names = [j.id async for j in client.jobs(limit=3)]
        assert len(names) == 3
        assert len(await client.executors()) == 2
        assert await client.workers() == []

        with pytest.raises(NotFound):
            await client.job("job-00000000000000000000000000000000").info()
        with pytest.raises(flint_client.InvalidModule):
            await client.upload_module(b"nope")
        await logged.delete()
        with pytest.raises(NotFound):
            await logged.info()
        with pytest.raises(NotFound) as gone:
            await logged.replay(0)
        assert gone.value.kind == "job_not_found"


async def test_timeline_history_and_usage(driver: Driver, guests: Guests) -> None:
    async with AsyncClient(driver.url) as client:
        job = await client.submit(guests.testkit, [""], args=["noop"])
        await job.wait(60)
        timeline = await job.timeline()
        assert timeline.job == job.id and [a.task for a in timeline.attempts] == [0]
        history = await client.cluster_history()
        assert history.interval_ms > 0
        usage = await job.usage()
        assert usage is not None and usage.cpu_us > 0
        (task,) = [t async for t in job.tasks()]
        assert task.usage is not None and [a.outcome for a in task.history] == ["succeeded"]


async def test_a_graph_and_a_job_that_waits(driver: Driver, guests: Guests) -> None:
    async with AsyncClient(driver.url) as client:
        graph = await client.graph(
            {
                "map": dict(module=guests.wordcount, inputs=["x y", "y z"]),
                "reduce": dict(module=guests.reduce, inputs=[flint_client.graph_results("map")]),
            }
        )
        assert isinstance(graph, flint_client.AsyncGraph)
        view = await graph.wait(120, raise_on_failure=True)
        assert view.state == "succeeded" and [(e.from_, e.to) for e in view.edges] == [("map", "reduce")]
        assert await graph["reduce"].json(0) == {"x": 1, "y": 2, "z": 1}
        again = await client.get_graph(graph.id)
        assert again.view is not None and again.view.jobs["reduce"].id == graph["reduce"].id
        await graph.delete()
        with pytest.raises(NotFound) as gone:
            await client.get_graph(graph.id)
        assert gone.value.kind == "graph_not_found"

        # A reduce submitted right after its map, without waiting for it.
        mapped = await client.submit(guests.wordcount, ["a b", "b"])
        total = await client.submit(guests.reduce, [mapped.results_ref()])
        assert (await total.wait(120, raise_on_failure=True)).state == "succeeded"
        assert await total.json(0) == {"a": 1, "b": 2}
