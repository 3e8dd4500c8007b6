"""The exceptions of the client.

Every error the driver answers is ``{"error": {"kind", "message"}}`` with an HTTP
status; it is raised as a :class:`FlintError` subclass chosen by ``kind`` first and by
the status when the kind is one this client does not know, so ``except NotFound``
catches ``job_not_found`` and ``task_not_found`` alike, and a new kind of 404 still
lands there. Failing to reach the driver at all raises :class:`FlintConnectionError`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Dict, Optional, Sequence, Type

if TYPE_CHECKING:  # pragma: no cover
    from .models import GraphView, JobView

__all__ = [
    "FlintError",
    "FlintConnectionError",
    "FlintTimeoutError",
    "BadRequest",
    "Unauthorized",
    "Forbidden",
    "NotFound",
    "Conflict",
    "InvalidSpec",
    "InvalidModule",
    "TooLarge",
    "Overloaded",
    "StorageFull",
    "QuotaExceeded",
    "ReplayUnavailable",
    "ServerError",
    "ProtocolError",
    "WaitTimeout",
    "TaskFailure",
    "JobFailed",
    "GraphFailed",
    "error_for",
]


class FlintError(Exception):
    """An error from the driver (or about what it answered).

    ``kind`` is the driver's error kind (``job_not_found``, ``invalid_spec``, ...),
    ``message`` its explanation and ``status`` the HTTP status (``None`` when the error
    did not come with one).
    """

    def __init__(self, kind: str, message: str, status: Optional[int] = None) -> None:
        super().__init__(kind, message, status)
        self.kind = kind
        self.message = message
        self.status = status

    def __str__(self) -> str:
        where = f" ({self.status})" if self.status is not None else ""
        return f"{self.kind}{where}: {self.message}"

    def __repr__(self) -> str:
        return f"{type(self).__name__}(kind={self.kind!r}, message={self.message!r}, status={self.status!r})"


class FlintConnectionError(FlintError):
    """The driver could not be reached, or the connection broke (``kind`` ``connection``).

    The underlying ``httpx`` exception is the ``__cause__``.
    """


class FlintTimeoutError(FlintConnectionError):
    """A request to the driver took longer than the client's timeout (``kind`` ``timeout``)."""


class BadRequest(FlintError):
    """400: a request the driver could not read (``invalid_json``, ``bad_query``,
    ``bad_path``, ``bad_body``, ``bad_idempotency_key``)."""


class Unauthorized(FlintError):
    """401 ``unauthorized``: no bearer token, or a wrong one. Give the driver's token (or,
    on a driver with tenants, your tenant's) as ``Client(token=...)`` or in
    ``FLINT_TOKEN``."""


class Forbidden(FlintError):
    """403 ``admin_only``: a tenant's token asked for what only the admin (the driver's
    ``--token``) may do: read ``/metrics``, list, kill or decommission executors, read
    their logs, list the workers or kill a worker's executors, or share an upload with
    every tenant. The token is right; asking again with it will not help."""


class NotFound(FlintError):
    """404: no such job, graph (``graph_not_found``), task, attempt
    (``attempt_not_found``), module, file, executor, worker, log, tenant
    (``tenant_not_found``) or route. On a driver with tenants,
    another tenant's job or upload is not found either: it answers exactly as one that
    does not exist."""


class Conflict(FlintError):
    """409, or a request that conflicts with the job's state: ``job_running`` (kill it
    first), ``job_in_use``, ``executor_not_alive``, ``not_run`` (a task not run yet has
    nothing to replay), and, with 422, ``no_result`` (the task has no result; 409 from
    drivers before issue 39) and ``idempotency_conflict`` (the key belongs to a job
    submitted with another spec)."""


class InvalidSpec(FlintError):
    """422: the job spec was refused (``invalid_spec``, ``unknown_module``,
    ``unknown_file``, ``no_tasks``, ``too_many_tasks``, ``unschedulable``,
    ``unknown_result``, ...); a graph's (``POST /v1/graphs``) also for a bad local name
    or a cycle, its message naming the job (``jobs.<name>: ...``). ``result_not_ready``
    only from drivers before pipelines, which refused an input naming a result not
    there yet."""


class InvalidModule(InvalidSpec):
    """422 ``invalid_module``: the bytes are not a module Flint runs (the message names
    the rule); also ``invalid_module_id``."""


class TooLarge(FlintError):
    """413: a body over the route's limit (``body_too_large``) or a result over
    ``max_output_bytes`` (``output_limit``)."""


class Overloaded(FlintError):
    """503 ``overloaded``: the driver is at its concurrency or event-stream limit.

    ``retry_after`` is the driver's ``Retry-After`` in seconds, when it gave one.
    """

    def __init__(
        self, kind: str, message: str, status: Optional[int] = None, retry_after: Optional[float] = None
    ) -> None:
        super().__init__(kind, message, status)
        self.retry_after = retry_after


class StorageFull(FlintError):
    """507 ``storage_full``: the data dir is at its quota or the driver's disk is full;
    nothing was stored."""


class QuotaExceeded(FlintError):
    """429 ``quota_exceeded``: a submission that would take the tenant past one of its
    limits (``max_jobs``, ``max_pending_tasks``, ``max_storage_bytes``,
    ``max_task_memory_mb``, ``max_task_timeout_ms``, ``max_priority``, and for a job's
    ``resources.egress`` ``max_egress_requests``, ``max_egress_bytes``,
    ``max_egress_concurrent``). The message names the limit, what the tenant holds and
    what the job would add; nothing was stored. Not retried, unlike :class:`Overloaded`:
    a limit on what the tenant holds (live jobs, pending tasks, storage) clears only as
    its own jobs end or its uploads go, and one on the job itself (memory, timeout,
    priority, outbound requests) never does."""


class ReplayUnavailable(FlintError):
    """An attempt cannot be replayed as it ran: 410 ``replay_unavailable``, an upload it
    ran (its module or a file) was deleted since, by retention or ``DELETE``; or, from
    :meth:`flint_client.Client.replay_bytes` and ``replay_input``, ``source_changed``
    (no status): bytes fetched now do not have the digest the attempt's bundle gives."""


class ServerError(FlintError):
    """500, or another 5xx: the driver failed (``storage``: its own store failed a read
    or a write; ``internal``). Not retried: whether it clears, and whether a retry is
    safe (a submission with an idempotency key is), is the caller's call."""


class ProtocolError(FlintError):
    """The driver answered something this client cannot read (``kind``
    ``bad_response``): not the JSON it documents, a truncated results stream, ..."""


class WaitTimeout(FlintError, TimeoutError):
    """``Job.wait(timeout=...)`` or ``Graph.wait(timeout=...)`` passed its timeout
    before the job (or graph) ended (``kind`` ``wait_timeout``). ``job`` is the job as
    last seen. For a graph, ``graph`` is the graph as last seen and ``job`` sums it as
    one view (its id and state, its jobs' tasks and counts); a job's ``graph`` is
    ``None``."""

    def __init__(self, message: str, job: "JobView", graph: "Optional[GraphView]" = None) -> None:
        super().__init__("wait_timeout", message, None)
        self.job = job
        self.graph = graph


@dataclass(frozen=True)
class TaskFailure:
    """One failed task of a :class:`JobFailed`: its index, the failure's ``kind``
    (``exit``, ``trap``, ``timeout``, ``memory_limit``, ...), ``message`` and, for
    ``exit``, the guest's ``exit_code``."""

    index: int
    kind: str
    message: str
    exit_code: Optional[int] = None

    def __str__(self) -> str:
        return f"task {self.index}: {self.kind}: {self.message}"


class JobFailed(FlintError):
    """A job ended without succeeding (failed or killed).

    ``kind`` is the job's error kind (``task_failed`` when one of its tasks failed for a
    reason of the guest's own, ``killed`` when it was killed), ``job`` the final
    :class:`~flint_client.JobView` and ``failures`` the failed tasks (index, kind,
    message; tasks killed because the job failed are not listed).
    """

    def __init__(self, job: "JobView", failures: Sequence[TaskFailure]) -> None:
        self.job = job
        self.failures = list(failures)
        kind = job.error.kind if job.error else job.state
        reason = job.error.message if job.error else f"job {job.state}"
        shown = "; ".join(str(f) for f in self.failures[:5])
        more = f"; and {len(self.failures) - 5} more failed tasks" if len(self.failures) > 5 else ""
        message = f"job {job.id} {job.state}: {reason}"
        if shown:
            message += f" [{shown}{more}]"
        super().__init__(kind, message, None)


class GraphFailed(JobFailed):
    """A graph ended without succeeding (``Graph.wait(raise_on_failure=True)``): a
    :class:`JobFailed` about the job of it to look at, so ``except JobFailed`` catches
    both.

    ``graph`` is the final :class:`~flint_client.GraphView` and ``name`` the local name
    of the job blamed: one that failed for a reason of its own (not
    ``upstream_failed``: that one's cause is upstream), else one that failed because
    a job outside the graph it reads did, else one killed. ``kind``,
    ``job`` and ``failures`` are that job's, as :class:`JobFailed` has them; the other
    jobs' states and errors are in ``graph.jobs``.
    """

    def __init__(self, graph: "GraphView", name: str, job: "JobView", failures: Sequence[TaskFailure]) -> None:
        super().__init__(job, failures)
        self.graph = graph
        self.name = name
        others = sorted(n for n, j in graph.jobs.items() if n != name and j.state in ("failed", "killed"))
        message = f"graph {graph.id} {graph.state}: job {name!r}: {self.message}"
        if others:
            message += f"; also ended without succeeding: {', '.join(others)}"
        FlintError.__init__(self, self.kind, message, None)


_BY_KIND: Dict[str, Type[FlintError]] = {
    "unauthorized": Unauthorized,
    "invalid_json": BadRequest,
    "bad_query": BadRequest,
    "bad_path": BadRequest,
    "bad_body": BadRequest,
    "bad_idempotency_key": BadRequest,
    "not_found": NotFound,
    "job_not_found": NotFound,
    "graph_not_found": NotFound,
    "task_not_found": NotFound,
    "module_not_found": NotFound,
    "file_not_found": NotFound,
    "block_not_found": NotFound,
    "executor_not_found": NotFound,
    "worker_not_found": NotFound,
    "no_log": NotFound,
    "attempt_not_found": NotFound,
    "tenant_not_found": NotFound,
    "admin_only": Forbidden,
    "quota_exceeded": QuotaExceeded,
    "no_result": Conflict,
    "job_running": Conflict,
    "job_in_use": Conflict,
    "executor_not_alive": Conflict,
    "idempotency_conflict": Conflict,
    "not_run": Conflict,
    "invalid_module": InvalidModule,
    "invalid_module_id": InvalidModule,
    "invalid_block_id": InvalidSpec,
    "invalid_spec": InvalidSpec,
    "unknown_module": InvalidSpec,
    "unknown_file": InvalidSpec,
    "no_tasks": InvalidSpec,
    "too_many_tasks": InvalidSpec,
    "unschedulable": InvalidSpec,
    "unknown_result": InvalidSpec,
    "result_not_ready": InvalidSpec,
    "input_too_large": InvalidSpec,
    "too_many_input_parts": InvalidSpec,
    "body_too_large": TooLarge,
    "output_limit": TooLarge,
    "body_timeout": BadRequest,
    "overloaded": Overloaded,
    "storage_full": StorageFull,
    "replay_unavailable": ReplayUnavailable,
    "storage": ServerError,
    "internal": ServerError,
}

_BY_STATUS: Dict[int, Type[FlintError]] = {
    400: BadRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    408: BadRequest,
    409: Conflict,
    413: TooLarge,
    422: InvalidSpec,
    429: QuotaExceeded,
    503: Overloaded,
    507: StorageFull,
}


def error_for(kind: str, message: str, status: Optional[int], retry_after: Optional[float] = None) -> FlintError:
    """The exception for an error answer: by ``kind`` first, then by ``status``."""
    cls = _BY_KIND.get(kind) or _BY_STATUS.get(status or 0)
    if cls is None:
        cls = ServerError if status is not None and status >= 500 else FlintError
    if cls is Overloaded:
        return Overloaded(kind, message, status, retry_after)
    return cls(kind, message, status)
