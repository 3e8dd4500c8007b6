"""The asyncio (anyio) client: :class:`AsyncClient` and its :class:`AsyncJob` handles.

The same surface as :class:`~flint_client.Client` and :class:`~flint_client.Job`, with
``async`` methods and async iterators; the requests and their parsing are the shared
core's (:mod:`flint_client._core`).
"""

from __future__ import annotations

import os
import time
from datetime import datetime
from typing import Any, AsyncGenerator, AsyncIterator, Dict, List, Mapping, Optional, Sequence, Tuple, TypeVar, Union

import anyio
import httpx

from . import _core as core
from ._core import FileLike, Flow, Module, Request
from ._progress import Progress
from ._sync import DEFAULT_TIMEOUT, EVENTS_READ_TIMEOUT, _headers, _in_order, _rfc3339, _settings
from .errors import FlintError, FlintTimeoutError, Overloaded, WaitTimeout
from .models import (
    ClusterHistory,
    EndEvent,
    Event,
    ExecutorList,
    GraphCreated,
    GraphView,
    JobView,
    LaggedEvent,
    ReplayBundle,
    ReplayInputPart,
    TaskView,
    TenantUsage,
    Timeline,
    Usage,
    WorkerView,
)
from .specs import Escalate, Input, Resources, ResultRef, ResultsRef, Task

__all__ = ["AsyncClient", "AsyncJob", "AsyncGraph"]

T = TypeVar("T")


class AsyncClient:
    """An async client of a Flint driver: :class:`~flint_client.Client`'s methods,
    awaited.

    ``url`` defaults to ``FLINT_URL`` (else ``http://127.0.0.1:7070``), ``token`` to
    ``FLINT_TOKEN``; ``timeout`` and ``retries`` as for the blocking client::

        async with AsyncClient() as client:
            counts = await client.map("wordcount.wasm", ["a b a"], decode="json")
    """

    def __init__(
        self,
        url: Optional[str] = None,
        token: Optional[str] = None,
        timeout: Optional[float] = DEFAULT_TIMEOUT,
        *,
        retries: int = 3,
        transport: Optional[httpx.AsyncBaseTransport] = None,
    ) -> None:
        self.url, token, self._timeout = _settings(url, token, timeout)
        self.retries = retries
        self._http = httpx.AsyncClient(
            base_url=self.url, headers=_headers(token), timeout=self._timeout, transport=transport
        )

    # --- plumbing -------------------------------------------------------------------

    async def aclose(self) -> None:
        """Closes the connections."""
        await self._http.aclose()

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        return f"AsyncClient({self.url!r})"

    def _build(self, request: Request) -> httpx.Request:
        args = core.request_args(request, self._timeout)
        if request.upload is not None:
            path = request.upload

            async def chunks() -> AsyncIterator[bytes]:
                with open(path, "rb") as f:
                    while True:
                        chunk = await anyio.to_thread.run_sync(f.read, core.UPLOAD_CHUNK)
                        if not chunk:
                            return
                        yield chunk

            args["content"] = chunks()
        return self._http.build_request(**args)

    async def _send(self, request: Request, stream: bool = False) -> httpx.Response:
        attempt = 0
        while True:
            try:
                response = await self._http.send(self._build(request), stream=stream)
                if core.is_success(response):
                    return response
                if stream:
                    await response.aread()
                    await response.aclose()
            except httpx.TransportError as e:
                raise core.transport_error(e, self.url) from e
            error = core.error_from_response(response)
            if isinstance(error, Overloaded) and request.retry_overloaded and attempt < self.retries:
                attempt += 1
                await anyio.sleep(min(1.0 if error.retry_after is None else error.retry_after, 30.0))
                continue
            raise error

    async def _drive(self, flow: Flow[T]) -> T:
        """Runs a flow of the core, awaiting each request it yields."""
        try:
            request = next(flow)
            while True:
                try:
                    response = await self._send(request)
                except FlintError as error:
                    request = flow.throw(error)
                    continue
                request = flow.send(response)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]

    async def _chunks(self, request: Request, chunk_size: Optional[int] = None) -> AsyncGenerator[bytes, None]:
        response = await self._send(request, stream=True)
        try:
            async for chunk in response.aiter_bytes(chunk_size):
                yield chunk
        except httpx.TransportError as e:
            raise core.transport_error(e, self.url) from e
        finally:
            await response.aclose()

    # --- uploads and jobs -------------------------------------------------------------

    async def upload_module(self, module: Union[str, "os.PathLike[str]", bytes]) -> str:
        """Uploads a wasm module (a path, or the bytes); returns its ``sha256:`` id."""
        return (await self._drive(core.upload("modules", module))).id

    async def upload_file(self, file: Union[str, "os.PathLike[str]", bytes]) -> str:
        """Uploads a file jobs can mount; returns its ``sha256:`` id."""
        return (await self._drive(core.upload("files", file))).id

    async def submit(
        self,
        module: Module,
        inputs: Optional[Sequence[Input]] = None,
        *,
        tasks: Optional[Sequence[Union[Task, Mapping[str, Any]]]] = None,
        files: Optional[Mapping[str, FileLike]] = None,
        args: Optional[Sequence[str]] = None,
        env: Optional[Mapping[str, str]] = None,
        resources: Union[Resources, Mapping[str, Any], None] = None,
        max_failures: Optional[int] = None,
        max_result_bytes: Optional[int] = None,
        name: Optional[str] = None,
        accounting: Optional[str] = None,
        retry: Union[Escalate, Mapping[str, Any], None] = None,
        deterministic: bool = False,
        seed: Optional[int] = None,
        memoize: bool = False,
        priority: Optional[int] = None,
        network: Optional[Sequence[str]] = None,
        idempotency_key: Optional[str] = None,
        wait: Optional[float] = None,
    ) -> "AsyncJob":
        """Submits a job and returns its :class:`AsyncJob` (see
        :meth:`flint_client.Client.submit` for the arguments)."""
        view = await self._drive(
            core.submit(
                module,
                inputs=inputs,
                tasks=tasks,
                files=files,
                args=args,
                env=env,
                resources=resources,
                max_failures=max_failures,
                max_result_bytes=max_result_bytes,
                name=name,
                accounting=accounting,
                retry=retry,
                deterministic=deterministic,
                seed=seed,
                memoize=memoize,
                priority=priority,
                network=network,
                idempotency_key=idempotency_key,
                wait=wait,
            )
        )
        return AsyncJob(self, view.id, view)

    async def map(
        self,
        module: Module,
        inputs: Sequence[Input],
        *,
        decode: str = "bytes",
        progress: bool = False,
        raise_on_failure: bool = True,
        timeout: Optional[float] = None,
        **options: Any,
    ) -> List[Any]:
        """Runs ``module`` once per input and returns the results in input order (see
        :meth:`flint_client.Client.map`)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        wait = None if progress else (core.MAX_WAIT if timeout is None else min(core.MAX_WAIT, timeout))
        job = await self.submit(module, inputs, wait=wait, **options)
        remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
        view = await job.wait(remaining, progress=progress, raise_on_failure=raise_on_failure)
        return await job.results(decode=decode, view=view, allow_failed=not raise_on_failure)

    def job(self, job_id: str) -> "AsyncJob":
        """The :class:`AsyncJob` of an id (no request is made)."""
        return AsyncJob(self, job_id)

    # --- graphs -----------------------------------------------------------------------

    async def graph(self, jobs: Mapping[str, Mapping[str, Any]], wait: Optional[float] = None) -> "AsyncGraph":
        """Submits jobs together, as one graph, and returns its :class:`AsyncGraph`
        (see :meth:`flint_client.Client.graph` for the arguments)."""
        created = await self._drive(core.submit_graph(jobs, wait))
        return AsyncGraph(self, created.id, _in_order(created.jobs, jobs), created=created)

    async def get_graph(self, graph_id: str) -> "AsyncGraph":
        """The :class:`AsyncGraph` of an id, read now (:class:`~flint_client.NotFound`
        ``graph_not_found`` if there is none)."""
        view = await self._drive(core.get_graph(graph_id))
        return AsyncGraph(self, view.id, {name: job.id for name, job in view.jobs.items()}, view=view)

    async def jobs(
        self,
        state: Optional[str] = None,
        name: Optional[str] = None,
        limit: Optional[int] = None,
        *,
        created_after: Union[str, datetime, None] = None,
        created_before: Union[str, datetime, None] = None,
        tenant: Optional[str] = None,
        page_size: int = 100,
    ) -> AsyncIterator[JobView]:
        """The jobs, newest first, page after page, a tenant's own only on a driver
        with tenants (see :meth:`flint_client.Client.jobs`)."""
        after: Optional[str] = None
        seen = 0
        while limit is None or seen < limit:
            size = page_size if limit is None else max(1, min(page_size, limit - seen))
            items, after = await self._drive(
                core.job_page(
                    after=after,
                    limit=min(size, core.MAX_PAGE),
                    state=state,
                    name=name,
                    created_after=_rfc3339(created_after),
                    created_before=_rfc3339(created_before),
                    tenant=tenant,
                )
            )
            for view in items:
                if limit is not None and seen >= limit:
                    return
                seen += 1
                yield view
            if after is None or not items:
                return

    # --- replay -----------------------------------------------------------------------

    async def replay(self, job_id: str, task: int, attempt: Optional[int] = None) -> ReplayBundle:
        """What an attempt of a task ran with and how it ended (see
        :meth:`flint_client.Client.replay`)."""
        return await self._drive(core.get_replay(job_id, task, attempt))

    async def replay_bytes(self, source: ReplayInputPart) -> bytes:
        """The bytes of a bundle's module, file or input part, checked against its
        digest (see :meth:`flint_client.Client.replay_bytes`)."""
        return await self._drive(core.fetch_part(source))

    async def replay_input(self, bundle: ReplayBundle) -> bytes:
        """A bundle's task stdin, joined and checked (see
        :meth:`flint_client.Client.replay_input`)."""
        return await self._drive(core.replay_input(bundle))

    # --- the cluster ------------------------------------------------------------------

    async def executors(self) -> ExecutorList:
        """The executors and the cluster manager's allocation (the admin's: a tenant's
        token raises :class:`~flint_client.Forbidden`)."""
        return await self._drive(core.get_executors())

    async def workers(self) -> List[WorkerView]:
        """The standalone workers that registered (the admin's, as the executors)."""
        return await self._drive(core.get_workers())

    async def health(self) -> bool:
        """``True`` when the driver answers ``GET /healthz``."""
        return await self._drive(core.get_health())

    async def cluster_history(self) -> ClusterHistory:
        """Recent samples of the cluster's load (a tenant's: its own tasks only)."""
        return await self._drive(core.get_cluster_history())

    async def openapi(self) -> Dict[str, Any]:
        """The driver's OpenAPI 3.1 document."""
        return await self._drive(core.get_openapi())

    async def metrics(self) -> str:
        """The driver's Prometheus metrics, as text (the admin's only: see
        :meth:`flint_client.Client.metrics`)."""
        return await self._drive(core.get_metrics())

    # --- tenants ----------------------------------------------------------------------

    async def tenant_usage(self, name: str) -> TenantUsage:
        """What tenant ``name`` holds now and what its attempts used (see
        :meth:`flint_client.Client.tenant_usage`)."""
        return await self._drive(core.get_tenant_usage(name))


class AsyncJob:
    """A job of an :class:`AsyncClient`: :class:`~flint_client.Job`'s methods,
    awaited (its iterators are async iterators)."""

    def __init__(self, client: AsyncClient, job_id: str, view: Optional[JobView] = None) -> None:
        self.client = client
        self.id = job_id
        self.view = view

    def __repr__(self) -> str:
        state = f" {self.view.state}" if self.view else ""
        return f"<AsyncJob {self.id}{state}>"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, AsyncJob) and other.id == self.id

    def __hash__(self) -> int:
        return hash(self.id)

    async def info(self, wait: Optional[float] = None) -> JobView:
        """The job now; with ``wait`` (seconds), once it ended or that time passed."""
        self.view = await self.client._drive(core.get_job(self.id, wait))
        return self.view

    async def refresh(self) -> JobView:
        """The job now; the same as :meth:`info`."""
        return await self.info()

    async def usage(self) -> Optional[Usage]:
        """What the job's attempts used so far, summed, read now (see
        :meth:`flint_client.Job.usage`)."""
        return (await self.info()).usage

    async def wait(
        self, timeout: Optional[float] = None, *, progress: bool = False, raise_on_failure: bool = False
    ) -> JobView:
        """Waits for the job to end and returns its final view (see
        :meth:`flint_client.Job.wait`)."""
        if progress:
            view = await self._wait_with_progress(timeout)
        else:
            view = await self.client._drive(core.wait_job(self.id, timeout, self.view))
        self.view = view
        if raise_on_failure and not view.succeeded:
            raise await self.client._drive(core.job_failed(view))
        return view

    async def _wait_with_progress(self, timeout: Optional[float]) -> JobView:
        deadline = None if timeout is None else time.monotonic() + timeout
        bar = Progress(self.id)
        view = self.view
        try:
            while True:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    view = await self.info()
                    if view.ended:
                        return view
                    raise WaitTimeout(f"job {self.id} did not end within {timeout} s (it is {view.state})", view)
                read = EVENTS_READ_TIMEOUT if remaining is None else max(0.1, min(remaining, EVENTS_READ_TIMEOUT))
                events = self._events(read)
                try:
                    async for event in events:
                        bar.event(event)
                        if isinstance(event, EndEvent):
                            view = event.job
                            return view
                        if isinstance(event, LaggedEvent):
                            bar.view(await self.info())
                        if deadline is not None and time.monotonic() >= deadline:
                            break
                    else:
                        view = await self.info()
                        if view.ended:
                            return view
                        await anyio.sleep(0.5)
                except FlintTimeoutError:
                    continue
                except Overloaded:
                    view = await self.info()
                    while not view.ended:
                        bar.view(view)
                        if deadline is not None and time.monotonic() >= deadline:
                            raise WaitTimeout(
                                f"job {self.id} did not end within {timeout} s (it is {view.state})", view
                            ) from None
                        view = await self.info(wait=1.0)
                    return view
                finally:
                    await events.aclose()
        finally:
            bar.close(view if view is not None and view.ended else None)

    def events(self) -> AsyncIterator[Event]:
        """The job's events as they happen, ending after the ``end`` event (see
        :meth:`flint_client.Job.events`)."""
        return self._events(EVENTS_READ_TIMEOUT)

    async def _events(self, read_timeout: float) -> AsyncGenerator[Event, None]:
        request = core.events_request(self.id)
        request.read_timeout = read_timeout
        parser = core.SSEParser()
        chunks = self.client._chunks(request)
        try:
            async for chunk in chunks:
                for name, data in parser.feed(chunk):
                    event = core.parse_event(name, data)
                    yield event
                    if isinstance(event, EndEvent):
                        self.view = event.job
                        return
        finally:
            await chunks.aclose()

    async def tasks(self) -> AsyncIterator[TaskView]:
        """Every task of the job in index order, read 10,000 a page."""
        after: Optional[str] = None
        while True:
            items, after = await self.client._drive(core.task_page(self.id, after))
            for item in items:
                yield item
            if after is None:
                return

    async def result(self, index: int) -> bytes:
        """Task ``index``'s result bytes."""
        return await self.client._drive(core.get_result(self.id, index))

    async def text(self, index: int, encoding: str = "utf-8") -> str:
        """Task ``index``'s result decoded as text."""
        return (await self.result(index)).decode(encoding)

    async def json(self, index: int) -> Any:
        """Task ``index``'s result parsed as JSON."""
        return core.decode(await self.result(index), "json")

    async def stream_result(self, index: int, chunk_size: Optional[int] = 1 << 20) -> AsyncIterator[bytes]:
        """Task ``index``'s result as it arrives, in chunks, never held whole."""
        chunks = self.client._chunks(core.result_request(self.id, index), chunk_size)
        try:
            async for chunk in chunks:
                yield chunk
        finally:
            await chunks.aclose()

    async def iter_results(self) -> AsyncIterator[Tuple[int, Optional[bytes]]]:
        """``(index, bytes or None)`` for every task in order, from one streamed answer."""
        response = await self.client._send(core.results_request(self.id), stream=True)
        try:
            parser = core.FrameParser(core.expected_frames(response.headers, self.view))
            try:
                async for chunk in response.aiter_bytes():
                    for frame in parser.feed(chunk):
                        yield frame
            except httpx.TransportError as e:
                raise parser.cut(e, self.client.url) from e
        finally:
            await response.aclose()
        parser.finish()

    async def results(
        self, decode: str = "bytes", *, view: Optional[JobView] = None, allow_failed: bool = False
    ) -> List[Any]:
        """Every task's result in task order, in one request; ``decode`` is ``"bytes"``,
        ``"text"`` or ``"json"``.

        A job that failed or was killed raises :class:`~flint_client.JobFailed` naming
        its failed tasks, as ``concurrent.futures`` and ``ray.get`` do; with
        ``allow_failed=True`` it returns what there is, ``None`` for a task without a
        result."""
        collector = core.Collector(decode, view or self.view)
        missing = False
        async for index, data in self.iter_results():
            missing = missing or data is None
            collector.add(index, data)
        if allow_failed:
            return collector.items
        # Every task with a result is a job that succeeded: no request more. A task
        # without one, or a view already saying so, is a job that did not.
        ended = next((v for v in (view, self.view) if v is not None and v.ended), None)
        if missing and ended is None:
            ended = await self.info()
        if ended is not None and not ended.succeeded:
            raise await self.client._drive(core.job_failed(ended))
        return collector.items

    async def kill(self) -> JobView:
        """Kills the job (a job already over is left as it is)."""
        self.view = await self.client._drive(core.kill_job(self.id))
        return self.view

    async def delete(self) -> None:
        """Deletes the ended job and everything it owns."""
        await self.client._drive(core.delete_job(self.id))

    async def logs(self, index: int) -> str:
        """Task ``index``'s log (its stderr, up to 1 MiB)."""
        return await self.client._drive(core.get_log(self.id, index))

    async def replay(self, index: int, attempt: Optional[int] = None) -> ReplayBundle:
        """What task ``index``'s latest attempt (or ``attempt``) ran with and how it
        ended (see :meth:`flint_client.Client.replay`)."""
        return await self.client.replay(self.id, index, attempt)

    async def timeline(self) -> Timeline:
        """Every attempt of the job's tasks."""
        return await self.client._drive(core.get_timeline(self.id))

    def result_ref(self, index: int) -> ResultRef:
        """Task ``index``'s result as an input of another job, which may be submitted
        at once: its task waits for the result (see
        :meth:`flint_client.Job.result_ref`)."""
        return ResultRef(self.id, index)

    def results_ref(self, tasks: Optional[Sequence[int]] = None) -> ResultsRef:
        """This job's results, one after the other, as one input of another job, which
        may be submitted at once (see :meth:`flint_client.Job.results_ref`)."""
        return ResultsRef(self.id, list(tasks) if tasks is not None else None)


class AsyncGraph:
    """A graph of an :class:`AsyncClient`: :class:`~flint_client.Graph`'s methods,
    awaited; its ``jobs`` are :class:`AsyncJob` handles by local name."""

    def __init__(
        self,
        client: AsyncClient,
        graph_id: str,
        jobs: Mapping[str, str],
        view: Optional[GraphView] = None,
        created: Optional[GraphCreated] = None,
    ) -> None:
        self.client = client
        self.id = graph_id
        self.jobs: Dict[str, AsyncJob] = {name: AsyncJob(client, job_id) for name, job_id in jobs.items()}
        self.view = view
        self.created = created

    def __repr__(self) -> str:
        state = f" {self.view.state}" if self.view else ""
        return f"<AsyncGraph {self.id} ({', '.join(self.jobs)}){state}>"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, AsyncGraph) and other.id == self.id

    def __hash__(self) -> int:
        return hash(self.id)

    def __getitem__(self, name: str) -> AsyncJob:
        return self.jobs[name]

    def _saw(self, view: GraphView) -> GraphView:
        self.view = view
        for name, job in view.jobs.items():
            if name not in self.jobs:
                self.jobs[name] = AsyncJob(self.client, job.id)
        return view

    async def info(self, wait: Optional[float] = None) -> GraphView:
        """The graph now; with ``wait`` (seconds), once every job has ended or that time
        passed (see :meth:`flint_client.Graph.info`)."""
        return self._saw(await self.client._drive(core.get_graph(self.id, wait)))

    async def wait(self, timeout: Optional[float] = None, *, raise_on_failure: bool = False) -> GraphView:
        """Waits for every job of the graph to end and returns its final view (see
        :meth:`flint_client.Graph.wait`)."""
        view = self._saw(await self.client._drive(core.wait_graph(self.id, timeout, self.view)))
        if raise_on_failure and not view.succeeded:
            raise await self.client._drive(core.graph_failed(view))
        return view

    async def kill(self) -> GraphView:
        """Kills every job of the graph that has not ended."""
        return self._saw(await self.client._drive(core.kill_graph(self.id)))

    async def recover(self) -> "AsyncGraph":
        """Submits the graph again as a new one (see :meth:`Graph.recover`)."""
        created = await self.client._drive(core.recover_graph(self.id))
        return AsyncGraph(self.client, created.id, created.jobs, created=created)

    async def delete(self) -> None:
        """Deletes the graph and every job of it (each must have ended)."""
        await self.client._drive(core.delete_graph(self.id))
