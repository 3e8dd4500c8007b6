"""The blocking client against a real ``flint dev``."""

from __future__ import annotations

import hashlib
import re
import shutil
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Dict, List

import httpx
import pytest

import flint_client
from flint_client import Client, Conflict, Escalate, InvalidModule, InvalidSpec, JobFailed, NotFound, Resources, Task

from .conftest import Driver, Guests, start_driver


class CountingTransport(httpx.HTTPTransport):
    """An HTTP transport that counts the requests it sends."""

    def __init__(self) -> None:
        super().__init__()
        self.requests: List[str] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(f"{request.method} {request.url.path}")
        return super().handle_request(request)


def words(text: str) -> Dict[str, int]:
    """What wordcount.wasm counts: runs of alphanumerics of the lowercased text."""
    return dict(Counter(re.findall(r"[^\W_]+", text.lower())))


def test_health_executors_workers(client: Client) -> None:
    assert client.health() is True
    executors = client.executors()
    assert len(executors) == 2
    assert all(e.state == "alive" and e.cores == 1 for e in executors)
    assert executors.allocation is not None and executors.allocation.cluster_manager == "local"
    assert executors[0].log_url
    assert client.workers() == []


def test_uploads_are_content_addressed(client: Client, guests: Guests, tmp_path: Path) -> None:
    module = client.upload_module(guests.testkit)
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", module)
    assert client.upload_module(guests.testkit.read_bytes()) == module
    path = tmp_path / "data.txt"
    path.write_bytes(b"file contents")
    file_id = client.upload_file(path)
    assert file_id == client.upload_file(b"file contents")
    assert client.upload_file(str(path)) == file_id


def test_submit_wait_and_read_results(client: Client, guests: Guests) -> None:
    job = client.submit(
        guests.testkit, [b"bytes \x00\xff", "text \u00e9", Path(guests.root / "testkit.wasm")], args=["echo"]
    )
    assert job.id.startswith("job-")
    view = job.wait(timeout=120)
    assert view.state == "succeeded" and view.counts.succeeded == 3 and view.tasks == 3
    assert job.result(0) == b"bytes \x00\xff"
    assert job.text(1) == "text \u00e9"
    assert job.results()[2] == guests.testkit.read_bytes()
    tasks = list(job.tasks())
    assert [t.index for t in tasks] == [0, 1, 2]
    assert tasks[0].state == "succeeded" and tasks[0].result is not None and tasks[0].result.size == 8
    assert tasks[0].exit_code == 0 and tasks[0].executor
    assert job.info() == view and job.refresh() == view


def test_module_by_id_tasks_files_env_and_resources(client: Client, guests: Guests) -> None:
    module = client.upload_module(guests.testkit)
    job = client.submit(
        module,
        tasks=[
            Task(args=["read", "/files/greeting"]),
            {"args": ["read", "/files/other"]},
            Task(input="ignored", args=["env"], env={"COLOUR": "red"}),
        ],
        files={"greeting": b"hello", "other": client.upload_file(b"other file")},
        resources=Resources(memory_mb=64, timeout_ms=30_000),
        name="py-files",
    )
    view = job.wait(60, raise_on_failure=True)
    assert view.name == "py-files"
    assert job.result(0) == b"hello"
    assert job.result(1) == b"other file"
    assert b"ARGS=env" in job.result(2)


def test_map_decodes_and_keeps_input_order(client: Client, guests: Guests) -> None:
    texts = [f"text {i}" for i in range(50)]
    assert client.map(guests.testkit, texts, args=["echo"], decode="text") == texts
    counts = client.map(guests.wordcount, ["to be or not to be", "b a b"], decode="json")
    assert counts == [{"be": 2, "not": 1, "or": 1, "to": 2}, {"a": 1, "b": 2}]


def test_map_of_20000_tasks_takes_a_few_requests(driver: Driver, guests: Guests) -> None:
    transport = CountingTransport()
    with Client(driver.url, transport=transport) as client:
        started = time.monotonic()
        results = client.map(guests.testkit, [b""] * 20_000, args=["noop"])
        elapsed = time.monotonic() - started
    assert results == [b""] * 20_000
    # The upload, the submission (answered once the job ended) and one bulk read.
    assert transport.requests[:2] == ["PUT /v1/modules", "POST /v1/jobs"]
    assert len(transport.requests) == 3, transport.requests
    assert re.fullmatch(r"GET /v1/jobs/job-[0-9a-f]+/results", transport.requests[2])
    print(f"map of 20,000 no-op tasks: {elapsed:.2f} s, {len(transport.requests)} requests")


def test_chained_map_reduce_counts_words(client: Client, guests: Guests) -> None:
    texts = [
        "It was the best of times, it was the worst of times,",
        "it was the age of wisdom, it was the age of foolishness,",
        "it was the epoch of belief, it was the epoch of incredulity,",
        "It was the season of Light, it was the season of Darkness.",
    ]
    mapped = client.submit(guests.wordcount, texts, name="py-wordcount-map")
    mapped.wait(120, raise_on_failure=True)
    assert mapped.json(0) == words(texts[0])
    reduced = client.map(guests.reduce, [mapped.results_ref()], decode="json")[0]
    assert reduced == words(" ".join(texts))
    top = client.map(guests.reduce, [mapped.results_ref(tasks=[0, 0])], args=["--top", "2"], decode="json")[0]
    assert top == {"it": 4, "of": 4}
    one = client.map(guests.reduce, [mapped.result_ref(3)], decode="json")[0]
    assert one == words(texts[3])


def test_a_failed_task_raises_job_failed_naming_it(client: Client, guests: Guests) -> None:
    with pytest.raises(JobFailed) as caught:
        client.map(guests.testkit, ["a", "b"], args=["exit", "3"])
    failed = caught.value
    assert failed.kind == "task_failed" and failed.job.state == "failed"
    assert failed.failures and failed.failures[0].kind == "exit" and failed.failures[0].exit_code == 3
    assert failed.failures[0].index in (0, 1)
    assert f"task {failed.failures[0].index}: exit" in str(failed)

    job = client.submit(guests.testkit, tasks=[Task(args=["noop"]), Task(args=["panic"])])
    view = job.wait(60)  # raise_on_failure defaults to False: the view says how it ended
    assert view.state == "failed" and view.error is not None and view.error.kind == "task_failed"
    with pytest.raises(JobFailed) as caught:
        job.wait(60, raise_on_failure=True)
    assert [(f.index, f.kind) for f in caught.value.failures] == [(1, "trap")]
    # The results of a failed job raise, like concurrent.futures' result() and ray.get,
    # from a fresh handle too (no view to go by: the missing result sends it to look).
    for reader in (job, client.job(job.id)):
        with pytest.raises(JobFailed) as caught:
            reader.results()
        assert caught.value.job.state == "failed"
        assert [(f.index, f.kind) for f in caught.value.failures] == [(1, "trap")]
    results = job.results(allow_failed=True)  # task 0 succeeded, or was killed when task 1 failed first
    assert len(results) == 2 and results[0] in (b"", None) and results[1] is None
    with pytest.raises(Conflict) as no_result:
        job.result(1)
    assert no_result.value.kind == "no_result"
    assert client.map(guests.testkit, ["x"], args=["exit", "3"], raise_on_failure=False) == [None]


def test_events_end_with_end(client: Client, guests: Guests) -> None:
    job = client.submit(guests.testkit, ["", ""], args=["sleep", "1000"])
    events = list(job.events())
    assert isinstance(events[0], flint_client.JobEvent) and events[0].job.id == job.id
    assert isinstance(events[-1], flint_client.EndEvent) and events[-1].job.state == "succeeded"
    tasks = [e for e in events if isinstance(e, flint_client.TaskEvent)]
    assert {e.index for e in tasks if e.state == "succeeded"} == {0, 1}
    assert all(e.attempt >= 1 and e.executor for e in tasks if e.state == "succeeded")
    # A job already over gets `end` at once.
    assert [type(e) for e in job.events()] == [flint_client.EndEvent]


def test_wait_with_progress(client: Client, guests: Guests, capsys: pytest.CaptureFixture[str]) -> None:
    job = client.submit(guests.testkit, [""] * 6, args=["sleep", "200"])
    view = job.wait(120, progress=True)
    assert view.state == "succeeded" and view.counts.succeeded == 6
    assert job.id in capsys.readouterr().err
    assert client.map(guests.testkit, [""] * 3, args=["noop"], progress=True) == [b""] * 3


def test_wait_timeout(client: Client, guests: Guests) -> None:
    job = client.submit(guests.testkit, [""], args=["sleep", "5000"])
    with pytest.raises(flint_client.WaitTimeout) as caught:
        job.wait(timeout=0.5)
    assert caught.value.job.state in ("queued", "running")
    with pytest.raises(flint_client.WaitTimeout):
        job.wait(timeout=0.5, progress=True)
    job.kill()


def test_kill_a_sleeping_job(client: Client, guests: Guests) -> None:
    job = client.submit(guests.testkit, [""] * 4, args=["sleep", "60000"])
    assert job.info().state in ("queued", "running")
    started = time.monotonic()
    assert job.kill().state == "killed"
    assert job.wait(30).state == "killed"
    assert time.monotonic() - started < 20
    with pytest.raises(JobFailed) as caught:
        job.wait(raise_on_failure=True)
    assert caught.value.job.state == "killed"


def test_logs_of_an_eprint_task(client: Client, guests: Guests) -> None:
    job = client.submit(guests.testkit, [""], args=["eprint", "1000"])
    job.wait(60, raise_on_failure=True)
    assert job.logs(0) == "e" * 1000
    assert job.result(0) == b""


def test_delete(client: Client, guests: Guests) -> None:
    running = client.submit(guests.testkit, [""], args=["sleep", "60000"])
    with pytest.raises(Conflict) as caught:
        running.delete()
    assert caught.value.kind == "job_running"
    running.kill()
    running.wait(30)
    running.delete()
    with pytest.raises(NotFound) as gone:
        running.info()
    assert gone.value.kind == "job_not_found" and gone.value.status == 404


def test_jobs_listing_pages_and_filters(client: Client, guests: Guests) -> None:
    name = f"py-list-{uuid.uuid4().hex[:8]}"
    ids = [client.submit(guests.testkit, [""], args=["noop"], name=name).id for _ in range(5)]
    for job_id in ids:
        client.job(job_id).wait(60)
    listed = list(client.jobs(name=name, page_size=2))  # three pages
    assert sorted(j.id for j in listed) == sorted(ids)
    assert [j.created_at for j in listed] == sorted((j.created_at for j in listed), reverse=True)
    assert [j.id for j in client.jobs(name=name, limit=3)] == [j.id for j in listed[:3]]
    assert all(j.state == "succeeded" for j in client.jobs(name=name, state="succeeded"))
    assert list(client.jobs(name=name, state="failed")) == []
    some = list(client.jobs(limit=2))
    assert len(some) == 2 and all(isinstance(j, flint_client.JobView) for j in some)


def test_idempotency_key_returns_the_same_job(client: Client, guests: Guests) -> None:
    key = f"py-{uuid.uuid4()}"
    first = client.submit(guests.testkit, ["a"], args=["echo"], idempotency_key=key)
    again = client.submit(guests.testkit, ["a"], args=["echo"], idempotency_key=key)
    assert again.id == first.id
    with pytest.raises(Conflict) as caught:
        client.submit(guests.testkit, ["b"], args=["echo"], idempotency_key=key)
    assert caught.value.kind == "idempotency_conflict" and first.id in caught.value.message


def test_errors_for_a_bad_module_and_unknown_things(client: Client, guests: Guests) -> None:
    with pytest.raises(InvalidModule) as caught:
        client.upload_module(b"this is not wasm")
    assert caught.value.kind == "invalid_module" and caught.value.status == 422
    with pytest.raises(InvalidModule):
        client.submit(b"not wasm either", ["x"])
    with pytest.raises(NotFound) as unknown:
        client.job("job-00000000000000000000000000000000").info()
    assert unknown.value.kind == "job_not_found"
    with pytest.raises(flint_client.InvalidSpec) as bad:
        client.submit("sha256:" + "0" * 64, ["x"])
    assert bad.value.kind == "unknown_module"
    job = client.submit(guests.testkit, [""], args=["noop"])
    job.wait(60)
    with pytest.raises(NotFound) as task:
        job.result(7)
    assert task.value.kind == "task_not_found"
    with pytest.raises(flint_client.InvalidSpec) as reserved:
        client.submit(guests.testkit, ["x"], args=["echo"], env={"FLINT_JOB": "mine"})
    assert reserved.value.kind == "invalid_spec" and "FLINT_" in reserved.value.message


def test_timeline(client: Client, guests: Guests) -> None:
    job = client.submit(guests.testkit, [""] * 3, args=["sleep", "50"])
    job.wait(60, raise_on_failure=True)
    timeline = job.timeline()
    assert timeline.job == job.id and timeline.now_us > 0 and timeline.next is None
    assert timeline.finished_us is not None and timeline.created_us <= timeline.finished_us
    assert sorted(a.task for a in timeline.attempts) == [0, 1, 2]
    for attempt in timeline.attempts:
        assert attempt.outcome == "succeeded" and attempt.attempt == 1 and attempt.executor.startswith("exec-")
        assert attempt.end_us is not None and attempt.duration_us is not None
        assert 40_000 <= attempt.duration_us < 30_000_000, attempt
        assert attempt.speculative is False


def test_usage_and_a_retry_that_escalates_memory(client: Client, guests: Guests) -> None:
    # 300 MiB do not fit in 128 MiB, nor in 256: the third attempt, with 512, succeeds.
    job = client.submit(
        guests.testkit,
        [""],
        args=["alloc", "300"],
        resources=Resources(memory_mb=128),
        retry=Escalate(memory=2.0),
    )
    view = job.wait(120, raise_on_failure=True)
    assert job.result(0) == str(300 << 20).encode()
    (task,) = job.tasks()
    assert task.attempts == 3
    assert [a.memory_mb for a in task.history] == [128, 256, 512]
    assert [a.outcome for a in task.history] == ["memory_limit", "memory_limit", "succeeded"]
    assert [a.attempt for a in task.history] == [1, 2, 3]
    assert all(a.executor.startswith("exec-") and not a.speculative for a in task.history)
    assert task.usage is not None and task.usage.peak_memory_bytes >= 300 << 20
    assert task.usage.fuel is None  # flint dev's executors do not meter fuel
    last = task.history[-1].usage
    assert last is not None and last.peak_memory_bytes >= 300 << 20 and last.output_bytes == len(str(300 << 20))
    # The job's usage: the final view has it, and Job.usage() reads it now.
    assert view.usage is not None and view.usage.cpu_us > 0 and view.usage.wall_us > 0
    usage = job.usage()
    assert usage is not None and usage.cpu_us > 0 and usage.peak_memory_bytes == task.usage.peak_memory_bytes
    assert usage.cpu_us == task.usage.cpu_us  # one task: the job's sum is the task's

    # A job that does not escalate fails at its first memory_limit.
    plain = client.submit(guests.testkit, [""], args=["alloc", "300"], resources=Resources(memory_mb=128))
    assert plain.wait(60).state == "failed"
    (failed,) = plain.tasks()
    assert failed.error is not None and failed.error.kind == "memory_limit"
    assert [a.outcome for a in failed.history] == ["memory_limit"]


def test_accounting_and_retry_reach_the_driver(client: Client, guests: Guests) -> None:
    # flint dev's executors do not meter fuel: exact accounting has nowhere to run.
    with pytest.raises(InvalidSpec) as exact:
        client.submit(guests.testkit, [""], args=["noop"], accounting="exact")
    assert exact.value.kind == "unschedulable" and exact.value.status == 422
    standard = client.submit(guests.testkit, [""], args=["noop"], accounting="standard")
    assert standard.wait(60).state == "succeeded"
    with pytest.raises(InvalidSpec) as unknown:
        client.submit(guests.testkit, [""], args=["noop"], retry={"escalate": {"memory": 2.0, "bogus": 1}})
    assert unknown.value.kind == "invalid_spec" and "bogus" in unknown.value.message


def test_a_deterministic_job_runs_the_same_twice_and_pins_what_it_ran(client: Client, guests: Guests) -> None:
    module = client.upload_module(guests.testkit)
    runs = [client.submit(module, ["x"], args=["env"], deterministic=True, seed=7) for _ in range(2)]
    views = [run.wait(60, raise_on_failure=True) for run in runs]
    first, second = (run.result(0) for run in runs)
    assert first == second, "two runs of a deterministic task write the same bytes"
    assert b"FLINT_JOB_ID" not in first and b"FLINT_ATTEMPT" not in first
    assert b"FLINT_TASK_INDEX=0" in first
    assert [v.seed for v in views] == [7, 7] and runs[0].info().seed == 7
    for run in runs:
        (task,) = run.tasks()
        pins = task.history[0].pins
        assert isinstance(pins, flint_client.Pins)
        assert pins.input == "sha256:" + hashlib.sha256(b"x").hexdigest()
        assert pins.module == module and pins.files == {}

    # Without a seed the driver derives one from the spec and records it: the same spec,
    # the same seed. A plain job has no seed, no pins, and is told its job id.
    drawn = client.submit(module, ["x"], args=["env"], deterministic=True)
    seed = drawn.wait(60, raise_on_failure=True).seed
    assert seed is not None and 0 <= seed < 2**53
    again = client.submit(module, ["x"], args=["env"], deterministic=True)
    assert again.wait(60, raise_on_failure=True).seed == seed
    plain = client.submit(module, ["x"], args=["env"])
    view = plain.wait(60, raise_on_failure=True)
    assert view.seed is None and b"FLINT_JOB_ID" in plain.result(0)
    (task,) = plain.tasks()
    assert [a.pins for a in task.history] == [None]

    # A seed is only for a deterministic job.
    with pytest.raises(InvalidSpec) as refused:
        client.submit(module, ["x"], args=["env"], seed=7)
    assert refused.value.kind == "invalid_spec" and refused.value.status == 422
    assert "deterministic" in refused.value.message


def test_a_memoized_job_takes_the_results_of_one_that_ran_the_same(client: Client, guests: Guests) -> None:
    module = client.upload_module(guests.testkit)
    first = client.submit(module, ["a", "b"], args=["echo"], deterministic=True, seed=3, memoize=True)
    first.wait(60, raise_on_failure=True)
    assert first.results() == [b"a", b"b"]
    ran = list(first.tasks())
    assert [t.memoized_from for t in ran] == [None, None], "nothing computed these before"
    assert all(t.attempts >= 1 and t.history for t in ran)

    again = client.submit(module, ["a", "b"], args=["echo"], deterministic=True, seed=3, memoize=True)
    view = again.wait(60, raise_on_failure=True)
    assert view.state == "succeeded" and view.counts.succeeded == 2
    assert again.results() == first.results()
    tasks = list(again.tasks())
    assert [t.index for t in tasks] == [0, 1]
    for task in tasks:
        assert isinstance(task.memoized_from, flint_client.MemoSource)
        assert task.memoized_from.job == first.id and task.memoized_from.task == task.index
        assert task.attempts == 0 and task.history == [] and task.state == "succeeded"
        assert task.result == ran[task.index].result

    # Memoizing is for a deterministic job only.
    with pytest.raises(InvalidSpec) as refused:
        client.submit(module, ["a", "b"], args=["echo"], memoize=True)
    assert refused.value.kind == "invalid_spec" and refused.value.status == 422
    assert "deterministic" in refused.value.message


def test_replay_of_a_failed_deterministic_task(client: Client, guests: Guests) -> None:
    module = client.upload_module(guests.testkit)
    job = client.submit(module, ["hi"], args=["exit", "3"], deterministic=True, seed=5)
    assert job.wait(60).state == "failed"
    bundle = client.replay(job.id, 0)
    assert isinstance(bundle, flint_client.ReplayBundle)
    assert (bundle.job, bundle.task, bundle.attempt, bundle.task_count) == (job.id, 0, 1, 1)
    assert bundle.outcome == "exit"
    assert bundle.error is not None and bundle.error.kind == "exit" and "3" in bundle.error.message
    log = job.logs(0).encode()
    assert log, "testkit's exit says so on stderr"
    assert bundle.log_sha256 == "sha256:" + hashlib.sha256(log).hexdigest()
    assert bundle.result_sha256 is None  # it failed
    assert bundle.module.sha256 == module and bundle.module.url == f"/v1/modules/{module}"
    (part,) = bundle.input
    assert isinstance(part, flint_client.InlinePart) and part.bytes == b"hi"
    assert bundle.input_sha256 == "sha256:" + hashlib.sha256(b"hi").hexdigest()
    assert bundle.seed == 5 and bundle.deterministic is True
    assert bundle.args == ["exit", "3"] and bundle.files == {} and bundle.env == {}
    (task,) = job.tasks()
    assert (bundle.memory_mb, bundle.timeout_ms) == (task.history[0].memory_mb, task.history[0].timeout_ms)
    # The same through the job's handle and by its attempt's number; the bytes from the
    # driver, checked against the bundle's digests.
    assert job.replay(0) == bundle and client.replay(job.id, 0, attempt=1) == bundle
    assert client.replay_input(bundle) == b"hi"
    assert client.replay_bytes(bundle.module) == guests.testkit.read_bytes()
    with pytest.raises(NotFound) as attempt:
        client.replay(job.id, 0, attempt=9)
    assert attempt.value.kind == "attempt_not_found" and attempt.value.status == 404
    with pytest.raises(NotFound) as task_missing:
        job.replay(1)
    assert task_missing.value.kind == "task_not_found"


def test_replay_of_a_task_whose_input_the_driver_serves(client: Client, guests: Guests) -> None:
    big = "b" * 3_000_000  # past the inline limit: the result is a block, and so the next task's input
    first = client.submit(guests.testkit, [big], args=["echo"])
    first.wait(120, raise_on_failure=True)
    chained = client.submit(guests.testkit, [first.result_ref(0), "!"], args=["echo"], deterministic=True)
    chained.wait(120, raise_on_failure=True)
    bundle = chained.replay(0)
    (part,) = bundle.input
    assert isinstance(part, flint_client.ReplaySource) and part.on_driver and part.sha256
    assert client.replay_input(bundle) == big.encode()
    assert bundle.outcome == "succeeded" and bundle.error is None
    assert bundle.result_sha256 == "sha256:" + hashlib.sha256(big.encode()).hexdigest()
    assert client.replay_input(chained.replay(1)) == b"!"


def test_cluster_history(client: Client) -> None:
    history = client.cluster_history()
    deadline = time.monotonic() + 5
    while not history.samples and time.monotonic() < deadline:
        time.sleep(0.2)
        history = client.cluster_history()
    assert history.interval_ms > 0
    assert history.samples, "the driver samples its cluster every interval"
    assert [s.t_ms for s in history.samples] == sorted(s.t_ms for s in history.samples)
    sample = history.samples[-1]
    assert history.tenant is None, "the admin's is the whole cluster's"
    assert sample.cores == 2 and sample.executors == 2 and sample.t_ms > 0
    assert 0 <= sample.busy_cores <= sample.cores


def test_bulk_results_refuse_a_running_job(client: Client, guests: Guests) -> None:
    job = client.submit(guests.testkit, [""], args=["sleep", "60000"])
    try:
        with pytest.raises(Conflict) as caught:
            job.results()
        assert caught.value.kind == "job_running"
    finally:
        job.kill()
    with pytest.raises(NotFound):
        client.job("job-00000000000000000000000000000000").results()
    assert client.map(guests.testkit, ["a", "", "b" * 3_000_000], args=["echo"]) == [b"a", b"", b"b" * 3_000_000]


@pytest.mark.parametrize("lost_at", [1, 0])
def test_a_results_stream_cut_by_a_lost_block_is_an_error_not_missing_results(guests: Guests, lost_at: int) -> None:
    # Its own driver: the test deletes the block store's files under it. The lost block
    # is task 1, or task 0: then the cut comes before any frame, and the response's head
    # (its frame count) must still reach the client.
    driver = start_driver(executors=1)
    try:
        with Client(driver.url) as client:
            big = "b" * 3_000_000  # past the inline limit: its result is a block
            inputs = ["a", big, "c"] if lost_at == 1 else [big, "a", "c"]
            job = client.submit(guests.testkit, inputs, args=["echo"])
            assert job.wait(timeout=120).state == "succeeded"
            assert job.results() == [i.encode() for i in inputs]
            blocks = [p for p in (driver.data_dir / "data" / "blocks").rglob("*") if p.is_file()]
            assert blocks, "the large result is in the driver's block store"
            for path in blocks:
                path.unlink()
            # The driver cuts the body at task 1: without the frame count the client
            # would have read tasks 1 and 2 as tasks without a result.
            with pytest.raises(flint_client.ProtocolError, match=rf"cut after {lost_at} of 3 tasks"):
                job.results()
    finally:
        driver.stop()
        shutil.rmtree(driver.data_dir, ignore_errors=True)


# --- pipelines: waiting tasks and graphs ----------------------------------------------


def test_a_job_reading_a_running_job_waits_for_it(client: Client, guests: Guests) -> None:
    # No wait between the two submissions: the readers' tasks wait for the map's results
    # (slow-first spins 1.5 s on its first attempt, then echoes its input).
    mapped = client.submit(guests.testkit, ["to ", "be"], args=["slow-first", "1500"])
    joined = client.submit(guests.testkit, [mapped.results_ref()], args=["echo"])
    one = client.submit(guests.testkit, [mapped.result_ref(1)], args=["echo"])
    view = joined.info()
    assert view.counts.waiting == 1 and view.counts.done == 0 and not view.ended, view
    (task,) = joined.tasks()
    assert task.state == "waiting" and task.attempts == 0
    assert mapped.info().state in ("queued", "running")
    # The event stream of a waiting job: it starts waiting, then runs like any other.
    events = list(one.events())
    first = events[0]
    assert isinstance(first, flint_client.JobEvent) and first.job.counts.waiting == 1
    states = [e.state for e in events if isinstance(e, flint_client.TaskEvent)]
    assert states[-3:] == ["pending", "running", "succeeded"], states
    assert isinstance(events[-1], flint_client.EndEvent) and events[-1].job.state == "succeeded"
    assert one.result(0) == b"be"
    final = joined.wait(120, progress=True, raise_on_failure=True)
    assert final.counts == flint_client.TaskCounts(succeeded=1)
    assert joined.result(0) == b"to be"
    assert mapped.wait(60).state == "succeeded"


def test_a_failed_upstream_fails_its_readers_without_running_them(client: Client, guests: Guests) -> None:
    # Still running when the reader comes (a job that has already failed is refused:
    # `no_result`), then out of time.
    failing = client.submit(guests.testkit, [""], args=["sleep", "60000"], resources=Resources(timeout_ms=1500))
    reader = client.submit(guests.testkit, [failing.results_ref()], args=["echo"])
    assert reader.info().counts.waiting == 1
    view = reader.wait(120)
    assert view.state == "failed" and view.error is not None and view.error.kind == "upstream_failed", view
    (task,) = reader.tasks()
    assert task.state == "failed" and task.error is not None and task.error.kind == "upstream_failed"
    assert task.attempts == 0, "it never ran"
    with pytest.raises(JobFailed) as caught:
        reader.results()
    assert caught.value.kind == "upstream_failed"
    assert [(f.index, f.kind) for f in caught.value.failures] == [(0, "upstream_failed")]
    assert failing.info().state == "failed"
    (upstream,) = failing.tasks()
    assert upstream.error is not None and upstream.error.kind == "timeout"
    # Once it has failed, a new reader is refused at once.
    with pytest.raises(Conflict) as refused:
        client.submit(guests.testkit, [failing.result_ref(0)], args=["echo"])
    assert refused.value.kind == "no_result"

    # The same in a graph: the graph fails, and raises about the job that failed itself.
    graph = client.graph(
        {
            "split": dict(module=guests.testkit, inputs=["x"], args=["exit", "3"]),
            "reader": dict(module=guests.testkit, inputs=[flint_client.graph_result("split", 0)], args=["echo"]),
        }
    )
    view = graph.wait(120)
    assert view.state == "failed"
    split, read = view.jobs["split"], view.jobs["reader"]
    assert split.state == "failed" and split.error is not None and split.error.kind == "task_failed"
    assert read.state == "failed" and read.error is not None and read.error.kind == "upstream_failed"
    assert read.counts == flint_client.TaskCounts(failed=1)
    with pytest.raises(flint_client.GraphFailed) as raised:
        graph.wait(raise_on_failure=True)
    failed = raised.value
    assert failed.name == "split" and failed.job.id == graph["split"].id and failed.kind == "task_failed"
    assert [(f.index, f.kind, f.exit_code) for f in failed.failures] == [(0, "exit", 3)]
    assert "reader" in str(failed)


def test_a_graph_map_reduce_in_one_call(client: Client, guests: Guests) -> None:
    texts = [
        "It was the best of times, it was the worst of times,",
        "it was the age of wisdom, it was the age of foolishness,",
        "it was the epoch of belief, it was the epoch of incredulity,",
        "It was the season of Light, it was the season of Darkness.",
    ]
    module = client.upload_module(guests.reduce)
    graph = client.graph(
        {
            "map": dict(module=guests.wordcount, inputs=texts, name="py-graph-map"),
            "reduce": dict(module=module, inputs=[flint_client.graph_results("map")]),
            "top": dict(module=module, inputs=[flint_client.graph_results("map", [0, 0])], args=["--top", "2"]),
        }
    )
    assert graph.id.startswith("graph-") and list(graph.jobs) == ["map", "reduce", "top"]
    assert all(job.id.startswith("job-") for job in graph.jobs.values())
    view = graph.wait(120, raise_on_failure=True)
    assert view.state == "succeeded" and view.succeeded and view.created_at_ms > 0
    assert {name: job.id for name, job in view.jobs.items()} == {name: job.id for name, job in graph.jobs.items()}
    assert all(job.state == "succeeded" for job in view.jobs.values())
    assert view.jobs["map"].tasks == 4 and view.jobs["map"].counts.succeeded == 4
    assert sorted((e.from_, e.to) for e in view.edges) == [("map", "reduce"), ("map", "top")]
    assert graph["reduce"].json(0) == words(" ".join(texts))
    assert graph["top"].json(0) == {"it": 4, "of": 4}
    assert graph["map"].info().name == "py-graph-map"

    # Read again by id; then submitted with wait=, answered once it ended.
    again = client.get_graph(graph.id)
    assert again == graph and again.view is not None and again.view.state == "succeeded"
    assert {n: j.id for n, j in again.jobs.items()} == {n: j.id for n, j in graph.jobs.items()}
    waited = client.graph({"count": dict(module=guests.wordcount, inputs=["a b a"])}, wait=60)
    assert waited.created is not None and waited.created.state == "succeeded"
    assert waited["count"].json(0) == {"a": 2, "b": 1}

    # Deleting the graph deletes its jobs.
    graph.delete()
    with pytest.raises(NotFound) as gone:
        graph.info()
    assert gone.value.kind == "graph_not_found"
    with pytest.raises(NotFound) as job_gone:
        graph["reduce"].info()
    assert job_gone.value.kind == "job_not_found"


def test_a_graph_reads_a_job_outside_it_and_is_killed_whole(client: Client, guests: Guests) -> None:
    sleeping = client.submit(guests.testkit, [""], args=["sleep", "60000"])
    graph = client.graph(
        {
            "after": dict(module=guests.testkit, inputs=[sleeping.results_ref()], args=["echo"]),
            "last": dict(module=guests.testkit, inputs=[flint_client.graph_results("after")], args=["echo"]),
        }
    )
    view = graph.info()
    assert graph["after"].info().waits_for == [sleeping.id]
    assert view.state in ("queued", "running") and not view.ended
    assert view.jobs["after"].counts.waiting == 1 and view.jobs["last"].counts.waiting == 1
    assert view.counts.waiting == 2 and view.tasks == 2
    assert [(e.from_, e.to) for e in view.edges] == [("after", "last")]
    with pytest.raises(flint_client.WaitTimeout) as timed_out:
        graph.wait(timeout=0.5)
    assert timed_out.value.graph is not None and timed_out.value.graph.id == graph.id
    with pytest.raises(Conflict) as running:
        graph.delete()
    assert running.value.kind == "job_running"
    killed = graph.kill()
    assert killed.state == "killed" and all(job.state == "killed" for job in killed.jobs.values())
    assert graph.wait(30).state == "killed"
    with pytest.raises(JobFailed) as caught:
        graph.wait(raise_on_failure=True)
    assert caught.value.kind == "killed"
    # A killed graph is recovered as a new one, whose reader waits for the same job.
    again = graph.recover()
    assert again.id != graph.id and set(again.jobs) == {"after", "last"}
    view = again.info()
    assert view.recovered_from == graph.id and view.jobs["after"].counts.waiting == 1
    assert again.kill().state == "killed"
    again.wait(30)
    again.delete()
    graph.delete()
    sleeping.kill()


def test_graphs_refused_and_not_found(client: Client, guests: Guests) -> None:
    with pytest.raises(NotFound) as missing:
        client.get_graph("graph-00000000000000000000000000000000")
    assert missing.value.kind == "graph_not_found" and missing.value.status == 404
    module = client.upload_module(guests.testkit)
    with pytest.raises(InvalidSpec) as cycle:
        client.graph(
            {
                "a": dict(module=module, inputs=[flint_client.graph_results("b")], args=["echo"]),
                "b": dict(module=module, inputs=[flint_client.graph_results("a")], args=["echo"]),
            }
        )
    assert cycle.value.kind == "invalid_spec" and cycle.value.status == 422
    with pytest.raises(InvalidSpec) as unknown:
        client.graph({"a": dict(module=module, inputs=[flint_client.graph_results("nowhere")], args=["echo"])})
    assert unknown.value.kind == "unknown_result"
