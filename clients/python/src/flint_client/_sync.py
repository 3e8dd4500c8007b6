"""The blocking client: :class:`Client` and its :class:`Job` handles."""

from __future__ import annotations

import os
import time
from contextlib import contextmanager
from datetime import datetime, timezone
from typing import Any, Dict, Generator, Iterator, List, Mapping, Optional, Sequence, Tuple, TypeVar, Union

import httpx

from . import _core as core
from ._core import FileLike, Flow, Module, Request
from ._progress import Progress
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

__all__ = ["Client", "Job", "Graph", "DEFAULT_URL", "DEFAULT_TIMEOUT"]

T = TypeVar("T")

#: The driver's address when neither ``url`` nor ``FLINT_URL`` gives one.
DEFAULT_URL = "http://127.0.0.1:7070"
#: Seconds a request may take (connect, each read, each write) unless told otherwise;
#: requests that ask the driver to wait (``?wait=``) get that long on top.
DEFAULT_TIMEOUT = 30.0
#: Read timeout of an event stream (the driver sends a keep-alive every 15 s).
EVENTS_READ_TIMEOUT = 60.0


def _settings(
    url: Optional[str], token: Optional[str], timeout: Optional[float]
) -> Tuple[str, Optional[str], httpx.Timeout]:
    url = (url or os.environ.get("FLINT_URL") or DEFAULT_URL).rstrip("/")
    if token is None:
        token = os.environ.get("FLINT_TOKEN") or None
    connect = None if timeout is None else min(timeout, 10.0)
    return url, token, httpx.Timeout(timeout, connect=connect)


def _headers(token: Optional[str]) -> Dict[str, str]:
    from . import __version__

    headers = {"user-agent": f"flint-client-python/{__version__}"}
    if token:
        headers["authorization"] = f"Bearer {token}"
    return headers


def _in_order(ids: Mapping[str, str], given: Mapping[str, Any]) -> Dict[str, str]:
    """A graph's job ids by local name, in the order the jobs were given (the driver
    answers them sorted by name)."""
    ordered = {name: ids[name] for name in given if name in ids}
    ordered.update((name, job_id) for name, job_id in ids.items() if name not in ordered)
    return ordered


def _rfc3339(value: Union[str, datetime, None]) -> Optional[str]:
    if value is None or isinstance(value, str):
        return value
    if value.tzinfo is None:
        value = value.replace(tzinfo=timezone.utc)
    return value.astimezone(timezone.utc).isoformat().replace("+00:00", "Z")


class Client:
    """A blocking client of a Flint driver.

    ``url`` defaults to ``FLINT_URL`` (else ``http://127.0.0.1:7070``), ``token`` to
    ``FLINT_TOKEN`` (sent as ``Authorization: Bearer``): the driver's own, the admin's,
    or on a driver with tenants a tenant's, which sees only that tenant's jobs and
    uploads (:meth:`tenant_usage` shows what it holds). ``timeout`` bounds each
    connect, read and write in seconds (``None``: no bound); requests that ask the
    driver to wait are given that long on top. An answer of 503 ``overloaded`` is
    retried up to ``retries`` times after the driver's ``Retry-After``.

    Use it as a context manager, or call :meth:`close`::

        with Client() as client:
            print(client.map("wordcount.wasm", ["to be or not to be"], decode="json"))
    """

    def __init__(
        self,
        url: Optional[str] = None,
        token: Optional[str] = None,
        timeout: Optional[float] = DEFAULT_TIMEOUT,
        *,
        retries: int = 3,
        transport: Optional[httpx.BaseTransport] = None,
    ) -> None:
        self.url, token, self._timeout = _settings(url, token, timeout)
        self.retries = retries
        self._http = httpx.Client(
            base_url=self.url, headers=_headers(token), timeout=self._timeout, transport=transport
        )

    # --- plumbing -------------------------------------------------------------------

    def close(self) -> None:
        """Closes the connections."""
        self._http.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Client({self.url!r})"

    def _build(self, request: Request) -> httpx.Request:
        args = core.request_args(request, self._timeout)
        if request.upload is not None:
            path = request.upload

            def chunks() -> Iterator[bytes]:
                with open(path, "rb") as f:
                    while True:
                        chunk = f.read(core.UPLOAD_CHUNK)
                        if not chunk:
                            return
                        yield chunk

            args["content"] = chunks()
        return self._http.build_request(**args)

    def _send(self, request: Request, stream: bool = False) -> httpx.Response:
        attempt = 0
        while True:
            try:
                response = self._http.send(self._build(request), stream=stream)
                if core.is_success(response):
                    return response
                if stream:
                    response.read()
                    response.close()
            except httpx.TransportError as e:
                raise core.transport_error(e, self.url) from e
            error = core.error_from_response(response)
            if isinstance(error, Overloaded) and request.retry_overloaded and attempt < self.retries:
                attempt += 1
                time.sleep(min(1.0 if error.retry_after is None else error.retry_after, 30.0))
                continue
            raise error

    def _drive(self, flow: Flow[T]) -> T:
        """Runs a flow of the core: sends each request it yields, gives it back the
        answer (or throws the error into it), returns what it returns."""
        try:
            request = next(flow)
            while True:
                try:
                    response = self._send(request)
                except FlintError as error:
                    request = flow.throw(error)
                    continue
                request = flow.send(response)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]

    @contextmanager
    def _stream(self, request: Request) -> Iterator[httpx.Response]:
        response = self._send(request, stream=True)
        try:
            yield response
        except httpx.TransportError as e:
            raise core.transport_error(e, self.url) from e
        finally:
            response.close()

    # --- uploads and jobs -------------------------------------------------------------

    def upload_module(self, module: Union[str, "os.PathLike[str]", bytes]) -> str:
        """Uploads a wasm module (a path, or the bytes) and returns its id,
        ``sha256:<hex>``. Validated by the driver (:class:`InvalidModule` if it is not a
        module Flint runs); uploading the same bytes again is a no-op."""
        return self._drive(core.upload("modules", module)).id

    def upload_file(self, file: Union[str, "os.PathLike[str]", bytes]) -> str:
        """Uploads a file that jobs can mount (``files={"name": id}``) and returns its
        id, ``sha256:<hex>``; idempotent. Up to 256 MiB; a path is streamed from disk."""
        return self._drive(core.upload("files", file)).id

    def submit(
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
    ) -> "Job":
        """Submits a job and returns its :class:`Job`.

        ``module`` is a path or bytes (uploaded first), an ``sha256:`` id, a URL string,
        or a :class:`~flint_client.Url` (to pin a digest or a timestamp). Give either
        ``inputs`` (one task per input; see :mod:`flint_client.specs` for the forms) or
        ``tasks`` (:class:`~flint_client.Task` or dicts with their own ``input``,
        ``args``, ``env``). ``files`` maps names the tasks read at ``/files/<name>`` to
        paths or bytes (uploaded), ``sha256:`` ids or URLs. ``args`` and ``env`` are
        every task's; ``resources`` a :class:`~flint_client.Resources` or a dict of the
        same fields. With ``idempotency_key``, a repeat of the same submission gets the
        job the first made instead of a second one. With ``wait`` (seconds, at most
        300) the driver answers once the job ended or that time passed.

        ``accounting="exact"`` counts each attempt's wasm work in fuel too
        (:attr:`~flint_client.Usage.fuel`): the job then runs only on executors started
        with ``--fuel``, and is refused (:class:`~flint_client.InvalidSpec`
        ``unschedulable``) while none is; ``"standard"`` (the driver's default) counts
        time, memory and bytes. ``retry`` is an :class:`~flint_client.Escalate` (or the
        ``RetrySpec`` dict, ``{"escalate": {...}}``): a task that fails with
        ``memory_limit`` or ``timeout`` runs again with more memory or time.

        ``deterministic=True`` runs every task reproducibly: a virtual clock (the wall
        clock starts at 2000-01-01T00:00:00Z, the monotonic one at 0, and only the
        guest's own sleeps move them, returning at once), random bytes seeded from
        ``seed`` and the task's index, no ``FLINT_JOB_ID`` or ``FLINT_ATTEMPT`` in its
        environment, and its module, files and input pinned by digest (each attempt's
        :attr:`~flint_client.TaskAttempt.pins`). Without ``seed`` the driver derives one
        from the spec (the same spec, the same seed) and records it
        (:attr:`~flint_client.JobView.seed`); a ``seed`` without
        ``deterministic=True`` is refused (:class:`~flint_client.InvalidSpec`).

        ``memoize=True`` (only with ``deterministic=True``, else
        :class:`~flint_client.InvalidSpec`) lets a task take the result of an earlier
        one that ran the same way instead of running: the same module, name, input,
        args, env, files, seed, index, task count and limits (bytes compared by digest),
        in a ``memoize=True`` job, succeeded with a result small enough to be kept
        inline. Such a task starts succeeded, with ``attempts`` 0 and the task it copies
        in :attr:`~flint_client.TaskView.memoized_from`. A module, file or input given
        by URL needs its ``sha256`` (a :class:`~flint_client.Url` with one), else the
        job is refused (:class:`~flint_client.InvalidSpec` naming it).

        ``priority`` orders the job among its tenant's own jobs: higher goes first
        (0 when not given; a negative one waits behind the rest). It does not reach
        past the tenant: cores are shared between tenants by their weights whatever the
        priorities, and one above the tenant's ``max_priority`` is refused
        (:class:`~flint_client.QuotaExceeded`), as is a job past any of the tenant's
        other limits.

        ``network`` lists the origins the tasks may call over HTTP,
        ``scheme://host[:port]`` (http or https; ``*.`` as a host's first label admits
        its subdomains): ``["https://api.example.com", "https://*.example.org:8443"]``.
        Without it a task may make no request. The list only narrows what the cluster's
        operator allows (``--egress-allow``) and, on a driver with tenants, the
        tenant's ``egress_allow``: an origin beyond either, or ``network`` on a cluster
        that allows none, is refused (:class:`~flint_client.InvalidSpec`, naming it), as
        is ``memoize=True`` with ``network`` (such a task is not a function of its
        inputs alone). ``resources`` may then set each attempt's budget,
        ``Resources(egress=EgressLimits(max_requests=, max_bytes=,
        max_concurrent=))``. A request outside the list fails in the guest with an error
        naming the URL and the rule, and the job's events carry an
        :class:`~flint_client.EgressDeniedEvent`; the attempt goes on. Each attempt's
        :attr:`~flint_client.TaskAttempt.usage` counts its requests and their bytes.
        """
        view = self._drive(
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
        return Job(self, view.id, view)

    def map(
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
        """Runs ``module`` once per input and returns the results in input order.

        ``decode`` is ``"bytes"`` (default), ``"text"`` (UTF-8) or ``"json"``.
        ``options`` are :meth:`submit`'s (``args``, ``env``, ``files``, ``resources``,
        ``max_failures``, ``accounting``, ``retry``, ``deterministic``, ``seed``,
        ``memoize``, ``priority``, ``network``, ...).
        A job that does not succeed raises :class:`~flint_client.JobFailed` naming the
        failed tasks (with ``raise_on_failure=False`` their results are ``None``
        instead). ``progress=True`` shows a bar following the job's events; ``timeout``
        (seconds) raises :class:`~flint_client.WaitTimeout` once passed.

        A few requests whatever the number of tasks: the submission, which the driver
        answers when the job ends (``?wait=``), and one read of all the results.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        wait = None if progress else (core.MAX_WAIT if timeout is None else min(core.MAX_WAIT, timeout))
        job = self.submit(module, inputs, wait=wait, **options)
        remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
        view = job.wait(remaining, progress=progress, raise_on_failure=raise_on_failure)
        return job.results(decode=decode, view=view, allow_failed=not raise_on_failure)

    def job(self, job_id: str) -> "Job":
        """The :class:`Job` of an id (no request is made: :meth:`Job.info` reads it)."""
        return Job(self, job_id)

    # --- graphs -----------------------------------------------------------------------

    def graph(self, jobs: Mapping[str, Mapping[str, Any]], wait: Optional[float] = None) -> "Graph":
        """Submits jobs together, as one graph, and returns its :class:`Graph`.

        ``jobs`` maps each job's local name (letters, digits, ``_`` and ``-``, up to 64,
        not starting with ``job-``) to a dict of :meth:`submit`'s arguments:
        ``module`` (a path or bytes are uploaded, once however many jobs use them),
        ``inputs`` or ``tasks``, ``files``, ``args``, ``env``, ``resources``,
        ``max_failures``, ``name``, ``retry``, ``network``, ... An input may name
        another job of the graph by its local name: :func:`~flint_client.graph_results`
        (all its results, one after the other) or :func:`~flint_client.graph_result`
        (one task's); or a job outside it, with :meth:`Job.results_ref` and
        :meth:`Job.result_ref`. A task reading results not there yet is ``waiting``; it
        runs once they have all succeeded, and fails ``upstream_failed`` without running
        if one fails or is killed.

        The driver checks the whole graph (each job as :meth:`submit` is checked, the
        names it reads, no cycle, the tenant's limits summed over its jobs) and stores
        all of it or nothing: :class:`~flint_client.InvalidSpec` (the message names the
        job, ``jobs.<name>: ...``) or :class:`~flint_client.QuotaExceeded`. With
        ``wait`` (seconds, at most 300) the driver answers once every job has ended or
        that time passed.
        """
        created = self._drive(core.submit_graph(jobs, wait))
        return Graph(self, created.id, _in_order(created.jobs, jobs), created=created)

    def get_graph(self, graph_id: str) -> "Graph":
        """The :class:`Graph` of an id, read now (:class:`~flint_client.NotFound`
        ``graph_not_found`` if there is none)."""
        view = self._drive(core.get_graph(graph_id))
        return Graph(self, view.id, {name: job.id for name, job in view.jobs.items()}, view=view)

    def jobs(
        self,
        state: Optional[str] = None,
        name: Optional[str] = None,
        limit: Optional[int] = None,
        *,
        created_after: Union[str, datetime, None] = None,
        created_before: Union[str, datetime, None] = None,
        tenant: Optional[str] = None,
        page_size: int = 100,
    ) -> Iterator[JobView]:
        """The jobs, newest first, following the pages' ``next`` cursors: only those in
        ``state`` (``queued``, ``running``, ``succeeded``, ``failed``, ``killed``), of
        ``name``, created at or after ``created_after`` and before ``created_before``
        (datetimes or RFC 3339 strings); at most ``limit`` of them (``None``: all).

        On a driver with tenants a tenant's token lists only that tenant's jobs,
        whatever ``tenant`` says; the admin's lists everyone's, or with ``tenant`` only
        that tenant's (``"admin"``: the admin's own)."""
        after: Optional[str] = None
        seen = 0
        while limit is None or seen < limit:
            size = page_size if limit is None else max(1, min(page_size, limit - seen))
            items, after = self._drive(
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

    def replay(self, job_id: str, task: int, attempt: Optional[int] = None) -> ReplayBundle:
        """What an attempt of task ``task`` of a job ran with and how it ended (the
        task's latest attempt, or ``attempt``, 1 for the first): its module, files and
        input (where to get them and their SHA-256), args, env, seed and budget, with
        its outcome and, for the attempt that decided the task, its error, log digest
        and result digest. ``flint replay JOB TASK`` runs it again locally; this client
        cannot run wasm, but :meth:`replay_bytes` and :meth:`replay_input` fetch the
        bytes.

        :class:`~flint_client.NotFound` for a job, task or attempt that does not exist
        (``attempt_not_found``), :class:`~flint_client.Conflict` ``not_run`` for a task
        not run yet, :class:`~flint_client.ReplayUnavailable` when an upload it ran was
        deleted since."""
        return self._drive(core.get_replay(job_id, task, attempt))

    def replay_bytes(self, source: ReplayInputPart) -> bytes:
        """The bytes of a :class:`~flint_client.ReplayBundle`'s module, file or input
        part: an inline part decoded, a source the driver serves fetched from it, checked
        against its ``sha256`` (:class:`~flint_client.ReplayUnavailable`
        ``source_changed`` if they differ). A job's own URL raises ``ValueError``: fetch
        it yourself (the client sends its token to the driver only)."""
        return self._drive(core.fetch_part(source))

    def replay_input(self, bundle: ReplayBundle) -> bytes:
        """A bundle's task stdin: its parts' bytes (as :meth:`replay_bytes` gets them)
        joined, checked against ``input_sha256`` where the bundle has it."""
        return self._drive(core.replay_input(bundle))

    # --- the cluster ------------------------------------------------------------------

    def executors(self) -> ExecutorList:
        """The executors (iterate the answer) and the cluster manager's allocation. The
        admin's to read: a tenant's token raises :class:`~flint_client.Forbidden`."""
        return self._drive(core.get_executors())

    def workers(self) -> List[WorkerView]:
        """The standalone workers that registered, alive or lost. The admin's to read:
        a tenant's token raises :class:`~flint_client.Forbidden`."""
        return self._drive(core.get_workers())

    def health(self) -> bool:
        """``True`` when the driver answers ``GET /healthz``; raises
        :class:`~flint_client.FlintConnectionError` when it cannot be reached."""
        return self._drive(core.get_health())

    def cluster_history(self) -> ClusterHistory:
        """Recent samples of the cluster's load (running tasks, busy cores, executors);
        with a tenant's token, of that tenant's own tasks only."""
        return self._drive(core.get_cluster_history())

    def openapi(self) -> Dict[str, Any]:
        """The driver's OpenAPI 3.1 document."""
        return self._drive(core.get_openapi())

    def metrics(self) -> str:
        """The driver's Prometheus metrics, as text. The admin's: a tenant's token gets
        :class:`~flint_client.Forbidden` (they cover every tenant)."""
        return self._drive(core.get_metrics())

    # --- tenants ----------------------------------------------------------------------

    def tenant_usage(self, name: str) -> TenantUsage:
        """What tenant ``name`` holds now (live jobs, their tasks and cores, its
        uploads' bytes) and what its attempts used since the driver started: to see how
        close it is to its limits before a :class:`~flint_client.QuotaExceeded`.

        A tenant may read only its own; the admin any tenant's, and its own as
        ``"admin"``. Any other name, or another tenant's, is
        :class:`~flint_client.NotFound` (``tenant_not_found``): a tenant cannot tell
        which other tenants exist."""
        return self._drive(core.get_tenant_usage(name))


class Job:
    """A job of a :class:`Client`: its ``id``, and every call about it.

    ``view`` is the job as last read (``None`` until something read it).
    """

    def __init__(self, client: Client, job_id: str, view: Optional[JobView] = None) -> None:
        self.client = client
        self.id = job_id
        self.view = view

    def __repr__(self) -> str:
        state = f" {self.view.state}" if self.view else ""
        return f"<Job {self.id}{state}>"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Job) and other.id == self.id

    def __hash__(self) -> int:
        return hash(self.id)

    def info(self, wait: Optional[float] = None) -> JobView:
        """The job now (state, counts per task state, times, error); with ``wait``
        (seconds, at most 300), once it ended or that time passed."""
        self.view = self.client._drive(core.get_job(self.id, wait))
        return self.view

    def refresh(self) -> JobView:
        """The job now; the same as :meth:`info`."""
        return self.info()

    def usage(self) -> Optional[Usage]:
        """What the job's attempts used so far, summed (CPU and wall time, peak memory,
        bytes in, out and fetched, fuel under exact accounting), read now like
        :meth:`info`; ``None`` until an attempt has reported. Each task's is in
        :meth:`tasks` (``usage``, and per attempt in ``history``)."""
        return self.info().usage

    def wait(
        self, timeout: Optional[float] = None, *, progress: bool = False, raise_on_failure: bool = False
    ) -> JobView:
        """Waits for the job to end and returns its final view.

        Without progress it long-polls ``GET /v1/jobs/{id}?wait=`` (one request per
        300 s); with ``progress=True`` it shows a ``tqdm`` bar that follows the job's
        event stream (polling instead when the driver has no stream to spare).
        ``timeout`` (seconds, ``None``: forever) raises
        :class:`~flint_client.WaitTimeout`. By default a job that failed or was killed
        is returned like any other (look at ``state``); with ``raise_on_failure=True``
        it raises :class:`~flint_client.JobFailed` naming the failed tasks.
        """
        if progress:
            view = self._wait_with_progress(timeout)
        else:
            view = self.client._drive(core.wait_job(self.id, timeout, self.view))
        self.view = view
        if raise_on_failure and not view.succeeded:
            raise self.client._drive(core.job_failed(view))
        return view

    def _wait_with_progress(self, timeout: Optional[float]) -> JobView:
        deadline = None if timeout is None else time.monotonic() + timeout
        bar = Progress(self.id)
        view = self.view
        try:
            while True:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    view = self.info()
                    if view.ended:
                        return view
                    raise WaitTimeout(f"job {self.id} did not end within {timeout} s (it is {view.state})", view)
                read = EVENTS_READ_TIMEOUT if remaining is None else max(0.1, min(remaining, EVENTS_READ_TIMEOUT))
                events = self._events(read)
                try:
                    for event in events:
                        bar.event(event)
                        if isinstance(event, EndEvent):
                            view = event.job
                            return view
                        if isinstance(event, LaggedEvent):
                            bar.view(self.info())
                        if deadline is not None and time.monotonic() >= deadline:
                            break
                    else:
                        # The stream closed without an end (the driver stopping).
                        view = self.info()
                        if view.ended:
                            return view
                        time.sleep(0.5)
                except FlintTimeoutError:
                    continue
                except Overloaded:
                    # No event stream to spare: poll the job, a second at a time.
                    view = self.info()
                    while not view.ended:
                        bar.view(view)
                        if deadline is not None and time.monotonic() >= deadline:
                            raise WaitTimeout(
                                f"job {self.id} did not end within {timeout} s (it is {view.state})", view
                            ) from None
                        view = self.info(wait=1.0)
                    return view
                finally:
                    events.close()
        finally:
            bar.close(view if view is not None and view.ended else None)

    def events(self) -> Iterator[Event]:
        """The job's events as they happen: :class:`~flint_client.JobEvent` first (the
        job now), a :class:`~flint_client.TaskEvent` per task state change,
        :class:`~flint_client.LaggedEvent` if this reader fell behind, an
        :class:`~flint_client.AdoptedEvent` or :class:`~flint_client.DroppedEvent` for
        an attempt an executor kept through a driver restart, an
        :class:`~flint_client.EgressDeniedEvent` for an attempt whose outbound requests
        were refused, and last :class:`~flint_client.EndEvent`, after which the iterator
        ends (at once for a job already over)."""
        return self._events(EVENTS_READ_TIMEOUT)

    def _events(self, read_timeout: float) -> Generator[Event, None, None]:
        request = core.events_request(self.id)
        request.read_timeout = read_timeout
        parser = core.SSEParser()
        with self.client._stream(request) as response:
            for chunk in response.iter_bytes():
                for name, data in parser.feed(chunk):
                    event = core.parse_event(name, data)
                    yield event
                    if isinstance(event, EndEvent):
                        self.view = event.job
                        return

    def tasks(self) -> Iterator[TaskView]:
        """Every task of the job in index order (state, attempts, executor, exit code,
        error, result size and digest, usage, each attempt's ``history``), read 10,000 a
        page."""
        after: Optional[str] = None
        while True:
            items, after = self.client._drive(core.task_page(self.id, after))
            yield from items
            if after is None:
                return

    def result(self, index: int) -> bytes:
        """Task ``index``'s result bytes (:class:`~flint_client.Conflict`
        ``no_result`` unless it succeeded). For large results see
        :meth:`stream_result`."""
        return self.client._drive(core.get_result(self.id, index))

    def text(self, index: int, encoding: str = "utf-8") -> str:
        """Task ``index``'s result decoded as text."""
        return self.result(index).decode(encoding)

    def json(self, index: int) -> Any:
        """Task ``index``'s result parsed as JSON."""
        return core.decode(self.result(index), "json")

    def stream_result(self, index: int, chunk_size: Optional[int] = 1 << 20) -> Iterator[bytes]:
        """Task ``index``'s result as it arrives, in chunks of about ``chunk_size``
        bytes, never held whole: for results too large to keep in memory."""
        with self.client._stream(core.result_request(self.id, index)) as response:
            yield from response.iter_bytes(chunk_size)

    def iter_results(self) -> Iterator[Tuple[int, Optional[bytes]]]:
        """``(index, bytes)`` for every task in order, ``None`` for a task without a
        result, read from one streamed answer (``GET /v1/jobs/{id}/results``) as it
        arrives. The job must have ended (:class:`~flint_client.Conflict`
        ``job_running`` otherwise)."""
        with self.client._stream(core.results_request(self.id)) as response:
            parser = core.FrameParser(core.expected_frames(response.headers, self.view))
            try:
                for chunk in response.iter_bytes():
                    yield from parser.feed(chunk)
            except httpx.TransportError as e:
                raise parser.cut(e, self.client.url) from e
        parser.finish()

    def results(
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
        for index, data in self.iter_results():
            missing = missing or data is None
            collector.add(index, data)
        if allow_failed:
            return collector.items
        # Every task with a result is a job that succeeded: no request more. A task
        # without one, or a view already saying so, is a job that did not.
        ended = next((v for v in (view, self.view) if v is not None and v.ended), None)
        if missing and ended is None:
            ended = self.info()
        if ended is not None and not ended.succeeded:
            raise self.client._drive(core.job_failed(ended))
        return collector.items

    def kill(self) -> JobView:
        """Kills the job: pending tasks never start, running ones stop at once. A job
        already over is left as it is."""
        self.view = self.client._drive(core.kill_job(self.id))
        return self.view

    def delete(self) -> None:
        """Deletes the ended job and everything it owns (results, logs, blocks);
        :class:`~flint_client.Conflict` ``job_running`` while it runs."""
        self.client._drive(core.delete_job(self.id))

    def logs(self, index: int) -> str:
        """Task ``index``'s log (its stderr, up to 1 MiB)."""
        return self.client._drive(core.get_log(self.id, index))

    def replay(self, index: int, attempt: Optional[int] = None) -> ReplayBundle:
        """What task ``index``'s latest attempt (or ``attempt``) ran with and how it
        ended; see :meth:`Client.replay`."""
        return self.client.replay(self.id, index, attempt)

    def timeline(self) -> Timeline:
        """Every attempt of the job's tasks: executor, start and end (driver clock),
        outcome, whether speculative."""
        return self.client._drive(core.get_timeline(self.id))

    def result_ref(self, index: int) -> ResultRef:
        """Task ``index``'s result as an input of another job (a chained job). No need
        to wait for this job first: the task reading it is ``waiting`` until the result
        is there, and fails ``upstream_failed`` without running if the task fails."""
        return ResultRef(self.id, index)

    def results_ref(self, tasks: Optional[Sequence[int]] = None) -> ResultsRef:
        """This job's results, one after the other, as one input of another job: every
        task's in order, or those of ``tasks`` (a reduce over a map job). No need to
        wait for this job first: the task reading them is ``waiting`` until they are
        all there (see :meth:`result_ref`)."""
        return ResultsRef(self.id, list(tasks) if tasks is not None else None)


class Graph:
    """A graph of a :class:`Client` (:meth:`Client.graph`, :meth:`Client.get_graph`):
    its ``id``, its ``jobs`` as :class:`Job` handles by local name (``graph["reduce"]``
    is ``graph.jobs["reduce"]``), and the calls about the whole of it.

    ``view`` is the graph as last read (``None`` until something read it), ``created``
    what its submission answered (``None`` for one read by id).
    """

    def __init__(
        self,
        client: Client,
        graph_id: str,
        jobs: Mapping[str, str],
        view: Optional[GraphView] = None,
        created: Optional[GraphCreated] = None,
    ) -> None:
        self.client = client
        self.id = graph_id
        self.jobs: Dict[str, Job] = {name: Job(client, job_id) for name, job_id in jobs.items()}
        self.view = view
        self.created = created

    def __repr__(self) -> str:
        state = f" {self.view.state}" if self.view else ""
        return f"<Graph {self.id} ({', '.join(self.jobs)}){state}>"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Graph) and other.id == self.id

    def __hash__(self) -> int:
        return hash(self.id)

    def __getitem__(self, name: str) -> Job:
        return self.jobs[name]

    def _saw(self, view: GraphView) -> GraphView:
        self.view = view
        for name, job in view.jobs.items():
            if name not in self.jobs:
                self.jobs[name] = Job(self.client, job.id)
        return view

    def info(self, wait: Optional[float] = None) -> GraphView:
        """The graph now: its state, each job's state, task counts (``waiting`` among
        them) and error, and its edges; with ``wait`` (seconds, at most 300), once every
        job has ended or that time passed."""
        return self._saw(self.client._drive(core.get_graph(self.id, wait)))

    def wait(self, timeout: Optional[float] = None, *, raise_on_failure: bool = False) -> GraphView:
        """Waits for every job of the graph to end and returns the graph's final view,
        long-polling ``GET /v1/graphs/{id}?wait=`` (one request per 300 s).

        As :meth:`Job.wait`: ``timeout`` (seconds, ``None``: forever) raises
        :class:`~flint_client.WaitTimeout` (its ``graph`` the graph as last seen); a
        graph that failed or was killed is returned like any other (look at
        ``state``), or with ``raise_on_failure=True`` raises
        :class:`~flint_client.GraphFailed`, a :class:`~flint_client.JobFailed` about
        the job to blame (one that failed of its own accord, not for an upstream's
        failure) naming its failed tasks.
        """
        view = self._saw(self.client._drive(core.wait_graph(self.id, timeout, self.view)))
        if raise_on_failure and not view.succeeded:
            raise self.client._drive(core.graph_failed(view))
        return view

    def kill(self) -> GraphView:
        """Kills every job of the graph that has not ended: waiting and pending tasks
        never start, running ones stop. A graph already over is left as it is."""
        return self._saw(self.client._drive(core.kill_graph(self.id)))

    def recover(self) -> "Graph":
        """Submits the graph again, as a new graph of new jobs made from this one's
        (it must have failed or been killed): with ``memoize=True`` on its jobs only
        what failed and what reads it runs again. The new graph."""
        created = self.client._drive(core.recover_graph(self.id))
        return Graph(self.client, created.id, created.jobs, created=created)

    def delete(self) -> None:
        """Deletes the graph and every job of it (results, logs, blocks);
        :class:`~flint_client.Conflict` ``job_running`` while one of them runs (kill
        the graph first), ``job_in_use`` while a job outside the graph that has not
        ended reads one of its results."""
        self.client._drive(core.delete_graph(self.id))
