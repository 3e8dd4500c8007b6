"""The client's sans-I/O core, shared by :class:`~flint_client.Client` and
:class:`~flint_client.AsyncClient`.

Every operation is a *flow*: a generator that yields the :class:`Request` it needs
sent, is sent back the ``httpx.Response`` (its body read), and returns the parsed
answer. The sync client runs a flow with a plain loop and the async one with an
``await`` in the same loop, so the request building, the answer parsing, paging and
waiting loops are written once. An error answer is thrown into the flow at its
``yield`` (as the :class:`~flint_client.FlintError` it maps to), so a flow may catch it.

Streamed answers (a task's result, the bulk results of a job, the event stream) are
read chunk by chunk by each client; what the chunks mean is decoded here by the
incremental :class:`FrameParser` and :class:`SSEParser`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import struct
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Generator, List, Mapping, Optional, Sequence, Tuple, TypeVar, Union
from urllib.parse import quote

import httpx

from .errors import FlintError, ProtocolError, ReplayUnavailable, TaskFailure, WaitTimeout, error_for
from .models import (
    AdoptedEvent,
    ClusterHistory,
    DroppedEvent,
    EgressDeniedEvent,
    EndEvent,
    Event,
    ExecutorList,
    GraphCreated,
    GraphView,
    InlinePart,
    JobEvent,
    JobView,
    LaggedEvent,
    ReplayBundle,
    ReplayInputPart,
    TaskEvent,
    TaskView,
    TenantUsage,
    Timeline,
    TimelineAttempt,
    UnknownEvent,
    Uploaded,
    WorkerView,
    from_json,
)
from .specs import (
    Escalate,
    Input,
    Resources,
    Task,
    Url,
    as_list,
    encode_input,
    encode_network,
    encode_resources,
    encode_retry,
    encode_task,
)

T = TypeVar("T")

#: A flow: yields requests, is sent their responses, returns its answer.
Flow = Generator["Request", httpx.Response, T]

#: The longest ``?wait=`` the driver honours, in seconds.
MAX_WAIT = 300.0
#: The largest page of a list the driver serves.
MAX_PAGE = 10_000
#: Every field of a ``JobSpec`` that :func:`submit` can set (checked against the live
#: document by the test suite).
JOB_SPEC_FIELDS = (
    "name",
    "module",
    "module_sha256",
    "module_timestamp_ms",
    "files",
    "args",
    "env",
    "inputs",
    "tasks",
    "resources",
    "max_failures",
    "max_result_bytes",
    "accounting",
    "deterministic",
    "seed",
    "memoize",
    "retry",
    "priority",
    "network",
)
#: The bulk results' media type.
RESULTS_MEDIA_TYPE = "application/vnd.flint.results"

#: A module as :meth:`Client.submit` takes it: a path, bytes, an ``sha256:`` id, a URL
#: string, a :class:`Url` (with a digest or timestamp) or an :class:`Uploaded`.
Module = Union[str, "os.PathLike[str]", bytes, bytearray, Url, Uploaded]
#: A job file: the same forms as a module (a path or bytes are uploaded).
FileLike = Union[str, "os.PathLike[str]", bytes, bytearray, Url, Uploaded]


@dataclass
class Request:
    """One HTTP request a flow wants sent.

    ``path`` is relative to the driver's URL; ``upload`` is a file whose bytes are the
    body, streamed from disk; ``wait`` is the ``?wait=`` the driver may hold the
    request for, added to the client's read timeout; ``read_timeout`` replaces the
    client's read timeout (for streams). Any 2xx answer is a success.
    """

    method: str
    path: str
    params: Optional[Dict[str, Any]] = None
    headers: Optional[Dict[str, str]] = None
    json: Any = None
    content: Optional[bytes] = None
    upload: Optional[Path] = None
    wait: Optional[float] = None
    read_timeout: Optional[float] = None
    #: Whether an ``overloaded`` answer may be retried (the driver did nothing).
    retry_overloaded: bool = True


#: Bytes read from disk at a time when a file is uploaded.
UPLOAD_CHUNK = 1 << 20


def timeout_for(base: httpx.Timeout, request: Request) -> httpx.Timeout:
    """The client's timeout stretched by the request's ``?wait=`` (the driver holds a
    waiting request that long before it answers), or with the stream's read timeout."""
    read = base.read
    if request.read_timeout is not None:
        read = request.read_timeout
    elif request.wait and read is not None:
        read = read + request.wait
    return httpx.Timeout(connect=base.connect, read=read, write=base.write, pool=base.pool)


def request_args(request: Request, base: httpx.Timeout) -> Dict[str, Any]:
    """The ``httpx`` ``build_request`` arguments of a request, but for an ``upload``
    body (each client streams the file its own way)."""
    headers = dict(request.headers or {})
    args: Dict[str, Any] = {
        "method": request.method,
        "url": request.path,
        "params": request.params,
        "headers": headers,
        "timeout": timeout_for(base, request),
    }
    if request.json is not None:
        args["json"] = request.json
    elif request.content is not None:
        args["content"] = request.content
    if request.upload is not None:
        headers["content-length"] = str(request.upload.stat().st_size)
    return args


def is_success(response: httpx.Response) -> bool:
    """Whether the answer is a 2xx."""
    return 200 <= response.status_code < 300


def transport_error(error: Exception, base_url: str) -> FlintError:
    """An ``httpx`` transport failure as :class:`FlintConnectionError` (or
    :class:`FlintTimeoutError`), naming the driver's address."""
    from .errors import FlintConnectionError, FlintTimeoutError

    if isinstance(error, httpx.TimeoutException):
        return FlintTimeoutError(
            "timeout", f"the driver at {base_url} did not answer in time: {type(error).__name__}: {error}"
        )
    return FlintConnectionError("connection", f"cannot reach the driver at {base_url}: {type(error).__name__}: {error}")


def job_path(job_id: str, *rest: Union[str, int]) -> str:
    """``/v1/jobs/{id}[/rest...]`` with each segment escaped."""
    parts = [quote(str(job_id), safe="")] + [quote(str(p), safe="") for p in rest]
    return "/v1/jobs/" + "/".join(parts)


def error_from_response(response: httpx.Response) -> FlintError:
    """The :class:`FlintError` for an error answer (``{"error": {"kind", "message"}}``);
    an answer without that body is named by its status."""
    status = response.status_code
    kind, message = "", ""
    try:
        body = json.loads(response.content)
        error = body.get("error") if isinstance(body, dict) else None
        if isinstance(error, dict):
            kind = str(error.get("kind") or "")
            message = str(error.get("message") or "")
    except (ValueError, UnicodeDecodeError):
        pass
    if not kind:
        kind = {401: "unauthorized", 404: "not_found", 503: "overloaded"}.get(status, f"http_{status}")
        text = response.content[:500].decode("utf-8", "replace").strip()
        message = text or (response.reason_phrase or f"HTTP {status}")
    if kind == "unauthorized" and "FLINT_TOKEN" not in message:
        message += " (give the driver's token as Client(token=...) or in FLINT_TOKEN)"
    retry_after: Optional[float] = None
    if "retry-after" in response.headers:
        try:
            retry_after = float(response.headers["retry-after"])
        except ValueError:
            retry_after = None
    return error_for(kind, message, status, retry_after)


def json_of(response: httpx.Response) -> Any:
    """The answer's JSON body, or :class:`ProtocolError` naming what came instead."""
    try:
        return json.loads(response.content)
    except ValueError as e:
        snippet = response.content[:200].decode("utf-8", "replace")
        raise ProtocolError(
            "bad_response",
            f"{response.request.method} {response.request.url.path}: expected JSON, got {snippet!r} ({e})",
            response.status_code,
        ) from None


def parse(cls: "type[T]", response: httpx.Response) -> T:
    """The answer's JSON body as model ``cls``."""
    body = json_of(response)
    try:
        return from_json(cls, body)
    except (TypeError, ValueError) as e:
        raise ProtocolError("bad_response", f"{response.request.url.path}: {e}", response.status_code) from None


# --- uploads and submission ---------------------------------------------------------


def upload(kind: str, data: Union[bytes, bytearray, memoryview, str, "os.PathLike[str]"]) -> Flow[Uploaded]:
    """``PUT /v1/modules`` (``kind`` ``modules``) or ``PUT /v1/files`` of bytes or of a
    file's contents (streamed from disk)."""
    request = Request("PUT", f"/v1/{kind}", headers={"content-type": "application/octet-stream"})
    if isinstance(data, (bytes, bytearray, memoryview)):
        request.content = bytes(data)
    else:
        path = Path(data)
        if not path.is_file():
            raise FileNotFoundError(f"no such file: {path}")
        request.upload = path
    response = yield request
    return parse(Uploaded, response)


def _looks_like_url(text: str) -> bool:
    return "://" in text


def resolve_module(module: Module) -> Flow[Dict[str, Any]]:
    """The spec fields naming ``module``, uploading it first when it is a path or bytes."""
    if isinstance(module, Uploaded):
        return {"module": module.id}
    if isinstance(module, Url):
        fields: Dict[str, Any] = {"module": module.url}
        if module.sha256 is not None:
            fields["module_sha256"] = module.sha256
        if module.timestamp_ms is not None:
            fields["module_timestamp_ms"] = module.timestamp_ms
        return fields
    if isinstance(module, str) and (module.startswith("sha256:") or _looks_like_url(module)):
        return {"module": module}
    if isinstance(module, (bytes, bytearray, memoryview, str, os.PathLike)):
        uploaded = yield from upload("modules", module)
        return {"module": uploaded.id}
    raise TypeError(f"a module is a path, bytes, an sha256: id or a URL, not {type(module).__name__}")


def resolve_file(value: FileLike) -> Flow[Any]:
    """A job file's spec value, uploading it first when it is a path or bytes."""
    if isinstance(value, Uploaded):
        return value.id
    if isinstance(value, Url):
        return value.as_file()
    if isinstance(value, str) and value.startswith("sha256:"):
        return value
    if isinstance(value, str) and _looks_like_url(value):
        return {"url": value}
    if isinstance(value, (bytes, bytearray, memoryview, str, os.PathLike)):
        uploaded = yield from upload("files", value)
        return uploaded.id
    raise TypeError(f"a job file is a path, bytes, an sha256: id or a Url, not {type(value).__name__}")


def build_spec(
    module_fields: Mapping[str, Any],
    *,
    inputs: Optional[Sequence[Input]] = None,
    tasks: Optional[Sequence[Union[Task, Mapping[str, Any]]]] = None,
    files: Optional[Mapping[str, Any]] = None,
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
) -> Dict[str, Any]:
    """A ``JobSpec`` document (files already resolved to their spec values).

    ``deterministic`` and ``memoize`` go in only when true, ``seed``, ``priority`` and
    ``network`` (as ``{"allow": [...]}``) only when given; a seed or ``memoize`` without
    ``deterministic`` is sent as it is, for the driver to refuse, and so are a priority
    over the tenant's cap, origins beyond what the cluster allows, ``memoize`` with
    ``network`` and ``resources.egress`` without it (the client knows none of the
    ceilings, and leaves every rule to the driver)."""
    if (inputs is None) == (tasks is None):
        raise ValueError("give exactly one of inputs (one task per input) and tasks")
    spec: Dict[str, Any] = dict(module_fields)
    if name is not None:
        spec["name"] = name
    if inputs is not None:
        if isinstance(inputs, (str, bytes, bytearray)):
            raise TypeError("inputs is a list of inputs (one task each), not a single str or bytes")
        spec["inputs"] = [encode_input(i) for i in inputs]
    else:
        assert tasks is not None
        spec["tasks"] = [encode_task(t) for t in tasks]
    if files:
        spec["files"] = dict(files)
    job_args = as_list(args, "args")
    if job_args:
        spec["args"] = job_args
    if env:
        spec["env"] = {str(k): str(v) for k, v in env.items()}
    encoded = encode_resources(resources)
    if encoded:
        spec["resources"] = encoded
    if max_failures is not None:
        spec["max_failures"] = max_failures
    if max_result_bytes is not None:
        spec["max_result_bytes"] = max_result_bytes
    if accounting is not None:
        spec["accounting"] = accounting
    if deterministic:
        spec["deterministic"] = True
    if seed is not None:
        spec["seed"] = seed
    if memoize:
        spec["memoize"] = True
    encoded_retry = encode_retry(retry)
    if encoded_retry is not None:
        spec["retry"] = encoded_retry
    if priority is not None:
        spec["priority"] = priority
    encoded_network = encode_network(network)
    if encoded_network is not None:
        spec["network"] = encoded_network
    return spec


#: The keyword arguments of :meth:`Client.submit` that make a job's spec: what a job of
#: a graph (:func:`submit_graph`) may be given.
SPEC_OPTIONS = (
    "module",
    "inputs",
    "tasks",
    "files",
    "args",
    "env",
    "resources",
    "max_failures",
    "max_result_bytes",
    "name",
    "accounting",
    "retry",
    "deterministic",
    "seed",
    "memoize",
    "priority",
    "network",
)
#: Every field of a ``GraphSpec`` (checked against the live document by the test suite).
GRAPH_SPEC_FIELDS = ("jobs",)


def _upload_key(value: Any) -> Optional[Tuple[str, str]]:
    """What identifies bytes to upload (a path, or the bytes' digest), so that a graph
    whose jobs share a module or a file uploads it once; ``None`` for what is not
    uploaded."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return ("bytes", hashlib.sha256(value).hexdigest())
    if isinstance(value, os.PathLike) or (
        isinstance(value, str) and not value.startswith("sha256:") and not _looks_like_url(value)
    ):
        return ("path", os.path.abspath(os.fspath(value)))
    return None


def job_spec(
    module: Module,
    *,
    files: Optional[Mapping[str, FileLike]] = None,
    uploaded: Optional[Dict[Tuple[str, Tuple[str, str]], Any]] = None,
    **options: Any,
) -> Flow[Dict[str, Any]]:
    """A ``JobSpec`` document from :meth:`Client.submit`'s arguments: the module and
    files uploaded first where they are paths or bytes (each once per ``uploaded``
    cache, when one is given), then :func:`build_spec`."""
    if (options.get("inputs") is None) == (options.get("tasks") is None):
        raise ValueError("give exactly one of inputs (one task per input) and tasks")
    key = _upload_key(module)
    cached = uploaded.get(("modules", key)) if uploaded is not None and key is not None else None
    if cached is not None:
        module_fields: Dict[str, Any] = dict(cached)
    else:
        module_fields = yield from resolve_module(module)
        if uploaded is not None and key is not None:
            uploaded[("modules", key)] = dict(module_fields)
    resolved: Dict[str, Any] = {}
    for file_name, value in (files or {}).items():
        key = _upload_key(value)
        if uploaded is not None and key is not None and ("files", key) in uploaded:
            resolved[file_name] = uploaded[("files", key)]
            continue
        resolved[file_name] = yield from resolve_file(value)
        if uploaded is not None and key is not None:
            uploaded[("files", key)] = resolved[file_name]
    return build_spec(module_fields, files=resolved, **options)


def submit(
    module: Module,
    *,
    inputs: Optional[Sequence[Input]] = None,
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
) -> Flow[JobView]:
    """Uploads what needs uploading, then ``POST /v1/jobs[?wait=S]``."""
    spec = yield from job_spec(
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
    )
    request = Request("POST", "/v1/jobs", json=spec)
    if idempotency_key is not None:
        request.headers = {"idempotency-key": idempotency_key}
    _set_wait(request, wait)
    response = yield request
    return parse(JobView, response)


def _set_wait(request: Request, wait: Optional[float]) -> None:
    """Adds ``?wait=S`` (at most :data:`MAX_WAIT`) to a request, when ``wait`` is
    positive."""
    if wait is not None and wait > 0:
        wait = min(float(wait), MAX_WAIT)
        request.params = {"wait": _num(wait)}
        request.wait = wait


def _num(seconds: float) -> str:
    return str(int(seconds)) if float(seconds).is_integer() else f"{seconds:.3f}"


# --- jobs ----------------------------------------------------------------------------


def get_job(job_id: str, wait: Optional[float] = None) -> Flow[JobView]:
    """``GET /v1/jobs/{id}[?wait=S]``."""
    request = Request("GET", job_path(job_id))
    _set_wait(request, wait)
    response = yield request
    return parse(JobView, response)


def wait_job(job_id: str, timeout: Optional[float] = None, view: Optional[JobView] = None) -> Flow[JobView]:
    """Long-polls ``GET /v1/jobs/{id}?wait=`` until the job ends; raises
    :class:`WaitTimeout` once ``timeout`` seconds pass first."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while view is None or not view.ended:
        if deadline is None:
            wait = MAX_WAIT
        else:
            remaining = deadline - time.monotonic()
            if remaining <= 0 and view is not None:
                raise WaitTimeout(f"job {job_id} did not end within {timeout} s (it is {view.state})", view)
            wait = max(0.0, min(MAX_WAIT, remaining))
        view = yield from get_job(job_id, wait if wait > 0 else None)
    return view


def kill_job(job_id: str) -> Flow[JobView]:
    """``POST /v1/jobs/{id}/kill``."""
    response = yield Request("POST", job_path(job_id, "kill"))
    return parse(JobView, response)


def delete_job(job_id: str) -> Flow[None]:
    """``DELETE /v1/jobs/{id}``."""
    yield Request("DELETE", job_path(job_id))
    return None


def task_page(job_id: str, after: Optional[str], limit: int = MAX_PAGE) -> Flow[Tuple[List[TaskView], Optional[str]]]:
    """One page of ``GET /v1/jobs/{id}/tasks``: the tasks and the ``next`` cursor."""
    params: Dict[str, Any] = {"limit": limit}
    if after is not None:
        params["after"] = after
    response = yield Request("GET", job_path(job_id, "tasks"), params=params)
    return _page(TaskView, response)


def _page(cls: "type[T]", response: httpx.Response) -> Tuple[List[T], Optional[str]]:
    body = json_of(response)
    if not isinstance(body, dict) or not isinstance(body.get("items"), list):
        raise ProtocolError(
            "bad_response", f"{response.request.url.path}: expected a page of items", response.status_code
        )
    try:
        items = [from_json(cls, item) for item in body["items"]]
    except (TypeError, ValueError) as e:
        raise ProtocolError("bad_response", f"{response.request.url.path}: {e}", response.status_code) from None
    nxt = body.get("next")
    return items, (str(nxt) if nxt is not None else None)


def job_page(
    *,
    after: Optional[str] = None,
    limit: Optional[int] = None,
    state: Optional[str] = None,
    name: Optional[str] = None,
    created_after: Optional[str] = None,
    created_before: Optional[str] = None,
    tenant: Optional[str] = None,
) -> Flow[Tuple[List[JobView], Optional[str]]]:
    """One page of ``GET /v1/jobs``: the jobs (newest first) and the ``next`` cursor."""
    params = {
        k: v
        for k, v in {
            "after": after,
            "limit": limit,
            "state": state,
            "name": name,
            "created_after": created_after,
            "created_before": created_before,
            "tenant": tenant,
        }.items()
        if v is not None
    }
    response = yield Request("GET", "/v1/jobs", params=params)
    return _page(JobView, response)


def task_failures(job_id: str) -> Flow[List[TaskFailure]]:
    """The failed tasks of a job (every page of its tasks), for :class:`JobFailed`."""
    failures: List[TaskFailure] = []
    after: Optional[str] = None
    while True:
        items, after = yield from task_page(job_id, after)
        for task in items:
            if task.state == "failed":
                error = task.error
                failures.append(
                    TaskFailure(
                        task.index,
                        error.kind if error else "failed",
                        error.message if error else "",
                        task.exit_code,
                    )
                )
        if after is None:
            return failures


def job_failed(view: JobView) -> Flow[FlintError]:
    """The :class:`JobFailed` of a job that ended without succeeding."""
    from .errors import JobFailed

    try:
        failures = yield from task_failures(view.id)
    except FlintError:
        failures = []
    return JobFailed(view, failures)


def get_result(job_id: str, index: int) -> Flow[bytes]:
    """``GET /v1/jobs/{id}/tasks/{index}/result``, the whole body."""
    response = yield Request("GET", job_path(job_id, "tasks", index, "result"))
    return response.content


def result_request(job_id: str, index: int) -> Request:
    """The request of a task's result, for streaming it."""
    return Request("GET", job_path(job_id, "tasks", index, "result"))


def results_request(job_id: str) -> Request:
    """The request of a job's bulk results (``GET /v1/jobs/{id}/results``)."""
    return Request("GET", job_path(job_id, "results"), headers={"accept": RESULTS_MEDIA_TYPE})


def events_request(job_id: str) -> Request:
    """The request of a job's event stream (``GET /v1/jobs/{id}/events``)."""
    return Request("GET", job_path(job_id, "events"), headers={"accept": "text/event-stream"}, retry_overloaded=False)


def get_log(job_id: str, index: int) -> Flow[str]:
    """``GET /v1/jobs/{id}/tasks/{index}/log``."""
    response = yield Request("GET", job_path(job_id, "tasks", index, "log"))
    return response.content.decode("utf-8", "replace")


def get_timeline(job_id: str) -> Flow[Timeline]:
    """``GET /v1/jobs/{id}/timeline``, every page: one :class:`Timeline` with all the
    attempts (the times of the last page read)."""
    attempts: List[TimelineAttempt] = []
    after: Optional[str] = None
    while True:
        params = {"after": after} if after is not None else None
        response = yield Request("GET", job_path(job_id, "timeline"), params=params)
        page = parse(Timeline, response)
        attempts.extend(page.attempts)
        if page.next is None or not page.attempts:
            return dataclasses.replace(page, attempts=attempts, next=None)
        after = page.next


# --- graphs --------------------------------------------------------------------------


def graph_path(graph_id: str, *rest: Union[str, int]) -> str:
    """``/v1/graphs/{id}[/rest...]`` with each segment escaped."""
    parts = [quote(str(graph_id), safe="")] + [quote(str(p), safe="") for p in rest]
    return "/v1/graphs/" + "/".join(parts)


def graph_job_options(name: str, job: Any) -> Dict[str, Any]:
    """The :meth:`Client.submit` arguments of the graph's job ``name``: a mapping of
    them (``module`` among them), checked for names submit does not take."""
    if not isinstance(name, str):
        raise TypeError(f"a graph's jobs are named by strings, not {type(name).__name__}")
    if not isinstance(job, Mapping):
        raise TypeError(
            f"graph job {name!r}: give a dict of submit's arguments "
            f"(dict(module=..., inputs=[...], ...)), not {type(job).__name__}"
        )
    unknown = sorted(set(job) - set(SPEC_OPTIONS))
    if unknown:
        raise TypeError(f"graph job {name!r}: unknown arguments {unknown} (a job takes {', '.join(SPEC_OPTIONS)})")
    if "module" not in job:
        raise TypeError(f"graph job {name!r}: no module")
    return dict(job)


def submit_graph(jobs: Mapping[str, Mapping[str, Any]], wait: Optional[float] = None) -> Flow[GraphCreated]:
    """Uploads what the jobs need (each module or file once), then ``POST
    /v1/graphs[?wait=S]`` with every job's spec under its local name."""
    if not isinstance(jobs, Mapping) or not jobs:
        raise ValueError("a graph has at least one job: give a dict of local name -> the job's submit arguments")
    uploaded: Dict[Tuple[str, Tuple[str, str]], Any] = {}
    specs: Dict[str, Any] = {}
    for name, job in jobs.items():
        options = graph_job_options(name, job)
        module = options.pop("module")
        try:
            specs[name] = yield from job_spec(module, uploaded=uploaded, **options)
        except (TypeError, ValueError) as e:
            if type(e) not in (TypeError, ValueError):
                raise
            raise type(e)(f"graph job {name!r}: {e}") from None
    request = Request("POST", "/v1/graphs", json={"jobs": specs})
    _set_wait(request, wait)
    response = yield request
    return parse(GraphCreated, response)


def get_graph(graph_id: str, wait: Optional[float] = None) -> Flow[GraphView]:
    """``GET /v1/graphs/{id}[?wait=S]``."""
    request = Request("GET", graph_path(graph_id))
    _set_wait(request, wait)
    response = yield request
    return parse(GraphView, response)


def graph_as_job(view: GraphView) -> JobView:
    """A graph summed as one job's view (its id and state, its jobs' tasks and counts),
    for :class:`WaitTimeout`'s ``job``."""
    return JobView(id=view.id, state=view.state, tasks=view.tasks, counts=view.counts)


def wait_graph(graph_id: str, timeout: Optional[float] = None, view: Optional[GraphView] = None) -> Flow[GraphView]:
    """Long-polls ``GET /v1/graphs/{id}?wait=`` until every job of the graph has ended;
    raises :class:`WaitTimeout` once ``timeout`` seconds pass first."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while view is None or not view.ended:
        if deadline is None:
            wait = MAX_WAIT
        else:
            remaining = deadline - time.monotonic()
            if remaining <= 0 and view is not None:
                raise WaitTimeout(
                    f"graph {graph_id} did not end within {timeout} s (it is {view.state})", graph_as_job(view), view
                )
            wait = max(0.0, min(MAX_WAIT, remaining))
        view = yield from get_graph(graph_id, wait if wait > 0 else None)
    return view


def kill_graph(graph_id: str) -> Flow[GraphView]:
    """``POST /v1/graphs/{id}/kill``."""
    response = yield Request("POST", graph_path(graph_id, "kill"))
    return parse(GraphView, response)


def recover_graph(graph_id: str) -> Flow[GraphCreated]:
    """``POST /v1/graphs/{id}/recover``: the new graph."""
    response = yield Request("POST", graph_path(graph_id, "recover"))
    return parse(GraphCreated, response)


def delete_graph(graph_id: str) -> Flow[None]:
    """``DELETE /v1/graphs/{id}``."""
    yield Request("DELETE", graph_path(graph_id))
    return None


def blamed_job(view: GraphView) -> Optional[str]:
    """The local name of the job a graph that did not succeed is blamed on: the first
    (by name) that failed for a reason of its own, else the first that failed because a
    result it reads failed (what it reads is outside the graph), else the first killed;
    ``None`` when none of them failed or was killed."""

    def first(test: Any) -> Optional[str]:
        return next((name for name in sorted(view.jobs) if test(view.jobs[name])), None)

    return (
        first(lambda j: j.state == "failed" and (j.error is None or j.error.kind != "upstream_failed"))
        or first(lambda j: j.state == "failed")
        or first(lambda j: j.state == "killed")
    )


def graph_failed(view: GraphView) -> Flow[FlintError]:
    """The :class:`GraphFailed` of a graph that ended without succeeding: about the job
    :func:`blamed_job` names (its view and failed tasks read now)."""
    from .errors import GraphFailed

    name = blamed_job(view)
    if name is None:
        # No job failed nor was killed (a graph not over yet): the graph as one job.
        return GraphFailed(view, "", graph_as_job(view), [])
    graph_job = view.jobs[name]
    try:
        job = yield from get_job(graph_job.id)
    except FlintError:
        job = JobView(
            id=graph_job.id,
            state=graph_job.state,
            tasks=graph_job.tasks,
            counts=graph_job.counts,
            error=graph_job.error,
        )
    try:
        failures = yield from task_failures(graph_job.id)
    except FlintError:
        failures = []
    return GraphFailed(view, name, job, failures)


# --- replay --------------------------------------------------------------------------


def get_replay(job_id: str, index: int, attempt: Optional[int] = None) -> Flow[ReplayBundle]:
    """``GET /v1/jobs/{id}/tasks/{index}/replay[?attempt=N]``."""
    params = {"attempt": attempt} if attempt is not None else None
    response = yield Request("GET", job_path(job_id, "tasks", index, "replay"), params=params)
    return parse(ReplayBundle, response)


def check_digest(data: bytes, expected: Optional[str], what: str) -> None:
    """:class:`ReplayUnavailable` ``source_changed`` unless ``data`` hashes to
    ``expected`` (``sha256:<hex>``; ``None``: nothing to check)."""
    if expected is None:
        return
    got = "sha256:" + hashlib.sha256(data).hexdigest()
    if got != expected:
        raise ReplayUnavailable(
            "source_changed", f"{what} has changed since the attempt ran: it was {expected}, it is now {got}"
        )


def fetch_part(part: ReplayInputPart, what: Optional[str] = None) -> Flow[bytes]:
    """The bytes of an inline part, or of a source the driver serves (a path of its
    API), checked against its digest. A job's own URL is refused: the client sends its
    token to the driver only, and does not fetch from anywhere else."""
    if isinstance(part, InlinePart):
        return part.bytes
    if not part.on_driver:
        where = f"{what} is at {part.url}," if what else f"{part.url} is"
        digest = f" and compare it with {part.sha256}" if part.sha256 else ""
        raise ValueError(f"{where} not on the driver: fetch it yourself{digest}")
    what = what or part.url
    response = yield Request("GET", part.url)
    data = response.content
    check_digest(data, part.sha256, what)
    return data


def replay_input(bundle: ReplayBundle) -> Flow[bytes]:
    """A bundle's task stdin: its parts joined, each fetched as :func:`fetch_part` does,
    the whole checked against ``input_sha256``."""
    parts: List[bytes] = []
    for at, part in enumerate(bundle.input):
        data = yield from fetch_part(part, f"input part {at}")
        parts.append(data)
    data = b"".join(parts)
    check_digest(data, bundle.input_sha256, "the input")
    return data


# --- the cluster ---------------------------------------------------------------------


def get_executors() -> Flow[ExecutorList]:
    """``GET /v1/executors``."""
    response = yield Request("GET", "/v1/executors")
    return parse(ExecutorList, response)


def get_workers() -> Flow[List[WorkerView]]:
    """``GET /v1/workers``."""
    response = yield Request("GET", "/v1/workers")
    items, _ = _page(WorkerView, response)
    return items


def get_health() -> Flow[bool]:
    """``GET /healthz``: true when the driver answers."""
    response = yield Request("GET", "/healthz")
    return response.status_code == 200


def get_cluster_history() -> Flow[ClusterHistory]:
    """``GET /v1/cluster/history``."""
    response = yield Request("GET", "/v1/cluster/history")
    return parse(ClusterHistory, response)


def get_tenant_usage(name: str) -> Flow[TenantUsage]:
    """``GET /v1/tenants/{name}/usage``."""
    response = yield Request("GET", f"/v1/tenants/{quote(name, safe='')}/usage")
    return parse(TenantUsage, response)


def get_openapi() -> Flow[Dict[str, Any]]:
    """``GET /v1/openapi.json``, the driver's OpenAPI 3.1 document."""
    response = yield Request("GET", "/v1/openapi.json")
    body = json_of(response)
    if not isinstance(body, dict):
        raise ProtocolError("bad_response", "/v1/openapi.json is not a JSON object", response.status_code)
    return body


def get_metrics() -> Flow[str]:
    """``GET /metrics``, Prometheus text."""
    response = yield Request("GET", "/metrics")
    return response.content.decode("utf-8", "replace")


# --- streamed answers ----------------------------------------------------------------

_FRAME_HEADER = struct.Struct(">IBQ")


class FrameParser:
    """Decodes ``application/vnd.flint.results`` incrementally.

    Per task a 13-byte header (task index, u32 big-endian; ``1`` if a result follows or
    ``0`` if the task has none; the length, u64 big-endian) and that many bytes. Feed it
    the body's chunks as they arrive; :meth:`feed` returns the frames they completed as
    ``(index, bytes)``, or ``(index, None)`` for a task without a result. Only the
    result being assembled is held, never the body.
    """

    def __init__(self, expected: Optional[int] = None) -> None:
        # The frame count the driver announced (``Flint-Tasks``) or the job's task count:
        # a body cut between two frames reads as a clean end otherwise (a proxy that
        # delimits the body by closing its connection, say), and the tasks after the cut
        # would read as tasks without a result.
        self.expected = expected
        self._head = bytearray()
        self._index = 0
        self._remaining = -1  # -1: reading a header
        self._parts: List[bytes] = []
        self.frames = 0

    def feed(self, chunk: bytes) -> List[Tuple[int, Optional[bytes]]]:
        """The frames ``chunk`` completes, in order."""
        out: List[Tuple[int, Optional[bytes]]] = []
        view = memoryview(chunk)
        pos, end = 0, len(view)
        size, unpack_from = _FRAME_HEADER.size, _FRAME_HEADER.unpack_from
        while pos < end:
            if self._remaining < 0:
                if not self._head and end - pos >= size:
                    # The common case, a header whole in this chunk: read in place
                    # (thousands of small frames per chunk; each copy shows).
                    index, present, length = unpack_from(view, pos)
                    pos += size
                else:
                    take = min(size - len(self._head), end - pos)
                    self._head += view[pos : pos + take]
                    pos += take
                    if len(self._head) < size:
                        break
                    index, present, length = _FRAME_HEADER.unpack(self._head)
                    self._head.clear()
                if present not in (0, 1) or (present == 0 and length != 0):
                    raise ProtocolError(
                        "bad_response", f"results stream: bad frame header for task {index} ({present}, {length})"
                    )
                if index != self.frames:
                    raise ProtocolError(
                        "bad_response", f"results stream: a frame for task {index} where task {self.frames} was next"
                    )
                self.frames += 1
                if present == 0:
                    out.append((index, None))
                elif length == 0:
                    out.append((index, b""))
                elif end - pos >= length:
                    out.append((index, bytes(view[pos : pos + length])))
                    pos += length
                else:
                    self._index, self._remaining = index, length
                continue
            take = min(self._remaining, end - pos)
            if take == self._remaining and not self._parts:
                out.append((self._index, bytes(view[pos : pos + take])))
                self._remaining = -1
            else:
                self._parts.append(bytes(view[pos : pos + take]))
                self._remaining -= take
                if self._remaining == 0:
                    out.append((self._index, b"".join(self._parts)))
                    self._parts = []
                    self._remaining = -1
            pos += take
        return out

    def finish(self) -> None:
        """Checks the body ended between frames, after the frames expected
        (:class:`ProtocolError` if not)."""
        if self._remaining >= 0 or self._head:
            raise ProtocolError("bad_response", "results stream: the body ended inside a frame (a truncated answer)")
        if self.expected is not None and self.frames != self.expected:
            raise ProtocolError(
                "bad_response",
                f"results stream: the body ended after {self.frames} of {self.expected} tasks (a truncated answer)",
            )

    def cut(self, error: Exception, base_url: str) -> FlintError:
        """The error for a body whose connection failed part way: the driver cuts it
        when a large result cannot be read (its block gone or of the wrong size). A
        read timeout stays a :class:`FlintTimeoutError`, as anywhere else."""
        if isinstance(error, httpx.TimeoutException):
            return transport_error(error, base_url)
        of = f" of {self.expected}" if self.expected is not None else ""
        return ProtocolError(
            "bad_response",
            f"results stream: cut after {self.frames}{of} tasks (the driver could not send the next "
            f"result, or the connection failed; its log says which): {type(error).__name__}: {error}",
        )


def expected_frames(headers: Mapping[str, str], view: Optional[JobView]) -> Optional[int]:
    """The frame count of a results stream: the driver's ``Flint-Tasks`` header, else
    the job's task count if its view is at hand."""
    announced = headers.get("flint-tasks")
    if announced is not None and announced.isdigit():
        return int(announced)
    return view.tasks if view is not None else None


class SSEParser:
    """Decodes ``text/event-stream`` incrementally: :meth:`feed` returns the
    ``(event, data)`` pairs the chunk completes; comments (keep-alives) are skipped."""

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._event = ""
        self._data: List[str] = []

    def feed(self, chunk: bytes) -> List[Tuple[str, str]]:
        """The events ``chunk`` completes, in order."""
        self._buffer += chunk
        out: List[Tuple[str, str]] = []
        while True:
            nl = self._buffer.find(b"\n")
            if nl < 0:
                return out
            line = bytes(self._buffer[:nl]).rstrip(b"\r").decode("utf-8", "replace")
            del self._buffer[: nl + 1]
            if not line:
                if self._data or self._event:
                    out.append((self._event or "message", "\n".join(self._data)))
                self._event, self._data = "", []
                continue
            if line.startswith(":"):
                continue
            name, _, value = line.partition(":")
            if value.startswith(" "):
                value = value[1:]
            if name == "event":
                self._event = value
            elif name == "data":
                self._data.append(value)


#: The events of a job's stream that :func:`parse_event` knows (the test suite checks
#: them against those the driver's document names); any other is an
#: :class:`UnknownEvent`.
EVENTS = ("job", "end", "task", "lagged", "adopted", "dropped", "egress_denied")


def parse_event(name: str, data: str) -> Event:
    """One server-sent event of a job's stream as its typed :data:`Event`."""
    try:
        body: Any = json.loads(data) if name in EVENTS else None
        if name == "job":
            return JobEvent(from_json(JobView, body))
        if name == "end":
            return EndEvent(from_json(JobView, body))
        if name == "task":
            return from_json(TaskEvent, body)
        if name == "lagged":
            return from_json(LaggedEvent, body)
        if name == "adopted":
            return from_json(AdoptedEvent, body)
        if name == "dropped":
            return from_json(DroppedEvent, body)
        if name == "egress_denied":
            return from_json(EgressDeniedEvent, body)
    except (ValueError, TypeError) as e:
        raise ProtocolError("bad_response", f"event {name}: {e}: {data[:200]!r}") from None
    return UnknownEvent(name, data)


DECODINGS = ("bytes", "text", "json")


class Collector:
    """Gathers ``(index, bytes)`` pairs into a list in task order, decoding each as it
    comes (``bytes``, ``text`` or ``json``); sized from the job's view when known."""

    def __init__(self, how: str, view: Optional[JobView] = None) -> None:
        if how not in DECODINGS:
            raise ValueError(f"decode is 'bytes', 'text' or 'json', not {how!r}")
        self.how = how
        self.items: List[Any] = [None] * (view.tasks if view is not None else 0)

    def add(self, index: int, data: Optional[bytes]) -> None:
        """Puts task ``index``'s result in its place."""
        if index >= len(self.items):
            self.items.extend([None] * (index + 1 - len(self.items)))
        self.items[index] = decode(data, self.how)


def decode(data: Optional[bytes], how: str) -> Any:
    """A result decoded as ``bytes`` (as is), ``text`` (UTF-8) or ``json``."""
    if data is None or how == "bytes":
        return data
    if how == "text":
        return data.decode("utf-8")
    if how == "json":
        return json.loads(data)
    raise ValueError(f"decode is 'bytes', 'text' or 'json', not {how!r}")
