"""Typed views of what the driver answers.

Every model is a frozen dataclass whose field names are exactly the JSON's (the
driver's OpenAPI document, ``GET /v1/openapi.json``, names them in
``components.schemas``; :data:`SCHEMAS` says which schema each model mirrors, and the
test suite fails when the two drift apart), but for a word Python reserves, which takes
a trailing underscore (:attr:`GraphEdge.from_` is the JSON's ``from``:
:func:`json_name`). Parsing ignores fields it does not know, so a newer driver that
adds fields still parses, and fills fields an older driver leaves out with their
defaults (``None``, ``0``, ``False`` or empty).
"""

from __future__ import annotations

import base64
import builtins
import dataclasses
import sys
import typing
from dataclasses import dataclass, field
from typing import Any, ClassVar, Dict, Iterator, List, Mapping, Optional, Tuple, Type, TypeVar, Union

__all__ = [
    "ErrorBody",
    "TaskCounts",
    "Usage",
    "JobView",
    "ResultInfo",
    "Pins",
    "TaskAttempt",
    "MemoSource",
    "TaskView",
    "TaskEvent",
    "LaggedEvent",
    "AdoptedEvent",
    "DroppedEvent",
    "EgressDeniedEvent",
    "JobEvent",
    "EndEvent",
    "UnknownEvent",
    "Event",
    "ExecutorView",
    "AllocationView",
    "ExecutorList",
    "WorkerView",
    "Uploaded",
    "TimelineAttempt",
    "Timeline",
    "ClusterSample",
    "ClusterHistory",
    "TenantUsage",
    "ReplaySource",
    "InlinePart",
    "ReplayInputPart",
    "ReplayBundle",
    "GraphCreated",
    "GraphJobView",
    "GraphEdge",
    "GraphView",
    "SCHEMAS",
    "ROUTE_SCHEMAS",
    "from_json",
    "json_name",
    "JOB_FINAL_STATES",
    "TASK_FINAL_STATES",
]

#: Job states after which nothing changes any more.
JOB_FINAL_STATES = frozenset({"succeeded", "failed", "killed"})
#: Task states after which nothing changes any more.
TASK_FINAL_STATES = frozenset({"succeeded", "failed", "killed"})


@dataclass(frozen=True)
class ErrorBody:
    """Why something failed: a ``kind`` to branch on and a human ``message``."""

    kind: str = ""
    message: str = ""


@dataclass(frozen=True)
class TaskCounts:
    """How many of a job's tasks are in each state.

    ``waiting`` tasks have an input naming results not there yet (tasks of a job still
    running, or of another job of their graph): each becomes ``pending`` once all it
    reads have succeeded, or ends ``failed`` (``upstream_failed``) without running if
    one of them fails or is killed. 0 from a driver older than pipelines. (Last of the
    fields, so that the others keep their places.)
    """

    pending: int = 0
    running: int = 0
    succeeded: int = 0
    failed: int = 0
    killed: int = 0
    waiting: int = 0

    @property
    def done(self) -> int:
        """Tasks that have ended, whichever way (succeeded, failed or killed); waiting,
        pending and running ones have not."""
        return self.succeeded + self.failed + self.killed

    def __add__(self, other: "TaskCounts") -> "TaskCounts":
        if not isinstance(other, TaskCounts):
            return NotImplemented
        return TaskCounts(
            **{f.name: getattr(self, f.name) + getattr(other, f.name) for f in dataclasses.fields(TaskCounts)}
        )


@dataclass(frozen=True)
class Usage:
    """What attempts used, measured by the executors that ran them: of one attempt
    (:attr:`TaskAttempt.usage`), of a task's attempts summed (:attr:`TaskView.usage`) or
    of every attempt of a job (:attr:`JobView.usage`).

    ``cpu_us`` is the CPU time of the task thread (instantiation included), ``wall_us``
    the time from instantiation to the guest's end, both in microseconds;
    ``peak_memory_bytes`` the most linear memory the guest held (a sum's is the largest
    of any one attempt, not a sum); ``input_bytes`` its stdin, ``output_bytes`` what it
    wrote to stdout, ``fetched_bytes`` what the executor downloaded to get it ready.
    ``egress_requests`` counts its outbound HTTP requests (a job given ``network``; each
    redirect hop is one, a request the allow-lists refused is not), ``egress_bytes_sent``
    and ``egress_bytes_received`` their bytes (method, URL, headers and body one way,
    headers and body the other); 0 for other jobs and from a driver older than egress.
    ``fuel`` is its wasm work in wasmtime fuel (about one unit per instruction), counted
    only on executors started with ``--fuel`` (where a job with ``accounting="exact"``
    runs), ``None`` elsewhere.
    """

    fuel: Optional[int] = None
    cpu_us: int = 0
    wall_us: int = 0
    peak_memory_bytes: int = 0
    input_bytes: int = 0
    output_bytes: int = 0
    fetched_bytes: int = 0
    egress_requests: int = 0
    egress_bytes_sent: int = 0
    egress_bytes_received: int = 0


@dataclass(frozen=True)
class JobView:
    """A job as ``GET /v1/jobs/{id}`` shows it.

    ``state`` is one of ``queued``, ``running``, ``succeeded``, ``failed``, ``killed``;
    ``created_at`` and ``finished_at`` are RFC 3339 strings; ``error`` says why a job
    failed (``kind`` ``task_failed`` names the task; ``upstream_failed`` when a task of
    it could not run because a result its input names failed or was killed). ``usage`` is what its attempts
    used, summed: ``None`` until one has reported, in job listings
    (:meth:`flint_client.Client.jobs`), and from a driver older than usage accounting.
    ``seed`` is a deterministic job's (``submit(deterministic=True)``): the one it was
    given, or the one the driver drew and recorded for it (submit again with
    ``seed=`` that to run it the same way); ``None`` for other jobs and in listings.

    On a driver with tenants, ``tenant`` is the tenant that submitted the job (``None``
    for the admin's, and on a driver without tenants) and ``priority`` its place among
    that tenant's jobs (``submit(priority=...)``; 0, the default, when not given).
    ``waits_for`` names the jobs whose results its waiting tasks read (empty once none
    waits, and in listings).
    """

    id: str
    name: str = ""
    state: str = ""
    created_at: str = ""
    finished_at: Optional[str] = None
    tasks: int = 0
    counts: TaskCounts = field(default_factory=TaskCounts)
    error: Optional[ErrorBody] = None
    usage: Optional[Usage] = None
    seed: Optional[int] = None
    tenant: Optional[str] = None
    priority: int = 0
    waits_for: List[str] = field(default_factory=list)

    @property
    def ended(self) -> bool:
        """Whether the job is over (succeeded, failed or killed)."""
        return self.state in JOB_FINAL_STATES

    @property
    def succeeded(self) -> bool:
        """Whether the job ended with every task succeeded."""
        return self.state == "succeeded"


@dataclass(frozen=True)
class ResultInfo:
    """A succeeded task's result: its size in bytes and its SHA-256 (hex)."""

    size: int = 0
    sha256: str = ""


@dataclass(frozen=True)
class EgressPin:
    """One outbound request of a deterministic attempt and what it got
    (``EgressPinView``): ``method`` and ``url`` as sent, the SHA-256 of its body
    (``request_sha256``), the response's ``status`` (0 when the guest was given an error
    instead: refused at connect, cut, timed out, reset) and the SHA-256 of its record
    (``response``), which ``flint replay`` serves again."""

    method: str = ""
    url: str = ""
    request_sha256: str = ""
    status: int = 0
    response: str = ""


@dataclass(frozen=True)
class Pins:
    """What an attempt of a deterministic job ran, by digest (``PinsView``; each
    ``sha256:<hex>``): its ``module``, the job's ``files`` by name, and the task's whole
    stdin (``input``), URLs resolved to the bytes the executor fetched, and its outbound
    requests in the order the guest made them with what each got (``egress``, a job
    with ``network``). Two attempts with the same pins and seed saw the same bytes."""

    module: str = ""
    files: Dict[str, str] = field(default_factory=dict)
    input: str = ""
    egress: List[EgressPin] = field(default_factory=list)


@dataclass(frozen=True)
class TaskAttempt:
    """One attempt of a task as its :class:`TaskView` lists it (``TaskAttemptView``).

    ``attempt`` is 1 for the task's first launch, counting retries and speculative
    copies. ``memory_mb`` and ``timeout_ms`` are the limits it ran with: the job's, or
    more for a retry that escalated (``retry=Escalate(...)``); 0 for an attempt stored
    before budgets were kept. ``outcome`` is ``succeeded``, a failure kind
    (``memory_limit``, ``timeout``, ``exit``, ...), ``lost`` or ``preempted`` (neither
    counts as a failure: the task ran again), ``None`` while it runs;
    ``usage`` is ``None`` while it runs and for an attempt that never reported (lost
    with its executor). ``pins`` are the digests of what it ran for a deterministic job
    (``submit(deterministic=True)``), ``None`` for other jobs.
    """

    attempt: int
    executor: str = ""
    memory_mb: int = 0
    timeout_ms: int = 0
    outcome: Optional[str] = None
    speculative: bool = False
    usage: Optional[Usage] = None
    pins: Optional[Pins] = None


@dataclass(frozen=True)
class MemoSource:
    """The earlier task a memoized task's result is a copy of
    (:attr:`TaskView.memoized_from`): task ``task`` of job ``job``."""

    job: str = ""
    task: int = 0


@dataclass(frozen=True)
class TaskView:
    """One task as ``GET /v1/jobs/{id}/tasks`` lists it.

    ``state`` is ``waiting`` (its input names results not there yet), ``pending``,
    ``running``, ``succeeded``, ``failed`` or ``killed``; a task that never ran because
    a result it reads failed is ``failed`` with ``error.kind`` ``upstream_failed`` (or
    ``input_too_large`` when the results it reads came to more than an input may take).

    ``started_at`` and ``finished_at`` are RFC 3339 with microseconds, from the
    executor's clock, for the latest attempt. ``usage`` is what its attempts used,
    summed (``None`` until one has reported); ``history`` is each attempt in launch
    order (its budget, outcome and usage), empty from a driver older than usage
    accounting and for a task that ended before a driver restart while its job ran on.
    ``memoized_from`` is, for a task of a ``memoize=True`` job that did not run, the
    earlier task whose result it has (such a task succeeded with ``attempts`` 0 and no
    ``history``); ``None`` for a task that ran.
    """

    index: int
    state: str = ""
    attempts: int = 0
    executor: Optional[str] = None
    exit_code: Optional[int] = None
    error: Optional[ErrorBody] = None
    result: Optional[ResultInfo] = None
    started_at: Optional[str] = None
    finished_at: Optional[str] = None
    usage: Optional[Usage] = None
    history: List[TaskAttempt] = field(default_factory=list)
    memoized_from: Optional[MemoSource] = None


@dataclass(frozen=True)
class TaskEvent:
    """A ``task`` event of ``GET /v1/jobs/{id}/events``: a task changed state.

    ``attempt`` is the latest attempt's number (0 before the first launch); ``error``
    says why it failed or was killed, or why the attempt before a retry failed.
    """

    event: ClassVar[str] = "task"
    index: int
    state: str = ""
    attempt: int = 0
    executor: Optional[str] = None
    error: Optional[ErrorBody] = None


@dataclass(frozen=True)
class LaggedEvent:
    """A ``lagged`` event: the reader fell behind and ``missed`` events were dropped.

    :meth:`flint_client.Job.tasks` has the current states.
    """

    event: ClassVar[str] = "lagged"
    missed: int = 0


@dataclass(frozen=True)
class AdoptedEvent:
    """An ``adopted`` event: an executor that kept running an attempt through a driver
    restart (or a broken connection) registered again, and the attempt is its task's
    running attempt again; nothing was launched for it."""

    event: ClassVar[str] = "adopted"
    index: int
    attempt: int = 0
    executor: str = ""
    reason: Optional[str] = None


@dataclass(frozen=True)
class DroppedEvent:
    """A ``dropped`` event: an attempt an executor listed when it registered again was
    killed (or its end ignored); ``reason`` says why (``job_gone``, ``task_ended``,
    ``runs_elsewhere``, ``task_waiting``, ``end_applied``, ``no_such_task``)."""

    event: ClassVar[str] = "dropped"
    index: int
    attempt: int = 0
    executor: str = ""
    reason: Optional[str] = None


@dataclass(frozen=True)
class EgressDeniedEvent:
    """An ``egress_denied`` event: outbound requests of an attempt that its executor
    refused (``EgressDenial``), sent when the attempt ends. ``denied`` holds the first
    refusals (at most 8), in order, each naming the URL and the rule that refused it
    (the job's ``network``, the tenant's ``egress_allow``, the operator's
    ``--egress-allow``, an address or a header). The guest got an error for each and
    the attempt went on: its outcome is in the ``task`` event that follows."""

    event: ClassVar[str] = "egress_denied"
    index: int
    attempt: int = 0
    executor: str = ""
    denied: List[str] = field(default_factory=list)


@dataclass(frozen=True)
class JobEvent:
    """A ``job`` event, the first of a stream: the job as it was when the stream began."""

    event: ClassVar[str] = "job"
    job: JobView


@dataclass(frozen=True)
class EndEvent:
    """An ``end`` event, the last of a stream: the job as it ended."""

    event: ClassVar[str] = "end"
    job: JobView


@dataclass(frozen=True)
class UnknownEvent:
    """An event this client does not know (from a newer driver): its name and raw data."""

    event: str
    data: str


#: Anything :meth:`flint_client.Job.events` yields.
Event = Union[
    JobEvent, TaskEvent, LaggedEvent, EndEvent, AdoptedEvent, DroppedEvent, EgressDeniedEvent, UnknownEvent
]


@dataclass(frozen=True)
class ExecutorView:
    """One executor as ``GET /v1/executors`` lists it (see the driver's README)."""

    id: str
    host: str = ""
    state: str = ""
    cores: int = 0
    free_cores: int = 0
    running: int = 0
    generation: int = 0
    last_heartbeat_ms: Optional[int] = None
    pid: Optional[int] = None
    exit_code: Optional[int] = None
    exit_signal: Optional[int] = None
    exit_reason: Optional[str] = None
    exit_description: Optional[str] = None
    cluster_manager: Optional[str] = None
    worker: Optional[str] = None
    tasks_finished: int = 0
    meters_fuel: bool = False
    modules_compiled: int = 0
    module_cache_hits: int = 0
    compile_cache_hits: int = 0
    fetch_hits: int = 0
    fetch_misses: int = 0
    task_cpu_us: int = 0
    bytes_fetched: int = 0
    result_bytes: int = 0
    tasks_active: int = 0
    tasks_completed: int = 0
    ends_held: int = 0
    ends_memory_bytes: int = 0
    ends_disk_bytes: int = 0
    ends_peak_memory_bytes: int = 0
    ends_peak_disk_bytes: int = 0
    ends_waited: int = 0
    excluded_for_ms: Optional[int] = None
    recent_task_failures: int = 0
    log_url: Optional[str] = None


@dataclass(frozen=True)
class AllocationView:
    """What the driver's cluster manager is asked for, what it launched, its failures."""

    cluster_manager: str = ""
    target: int = 0
    launching: int = 0
    running: int = 0
    decommissioning: int = 0
    idle: int = 0
    recent_failures: int = 0
    max_failures: int = 0
    failures_interval_ms: int = 0
    backoff_ms: int = 0
    gave_up: Optional[str] = None


@dataclass(frozen=True)
class ExecutorList:
    """``GET /v1/executors``: the executors (iterate it) and, with a cluster manager,
    its allocation."""

    items: List[ExecutorView] = field(default_factory=list)
    next: Optional[str] = None
    allocation: Optional[AllocationView] = None

    def __iter__(self) -> Iterator[ExecutorView]:
        return iter(self.items)

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> ExecutorView:
        return self.items[index]


@dataclass(frozen=True)
class WorkerView:
    """A standalone worker as ``GET /v1/workers`` lists it."""

    id: str
    host: str = ""
    state: str = ""
    cores: int = 0
    free_cores: int = 0
    memory_mb: int = 0
    free_memory_mb: int = 0
    pid: int = 0
    executors: List[str] = field(default_factory=list)
    last_heartbeat_ms: int = 0
    registered_at_ms: int = 0
    lost_reason: Optional[str] = None


@dataclass(frozen=True)
class Uploaded:
    """``PUT /v1/modules`` and ``PUT /v1/files``: the stored bytes' id and size."""

    id: str
    size: int = 0


@dataclass(frozen=True)
class TimelineAttempt:
    """One attempt of a task in a job's timeline (``AttemptView``).

    ``attempt`` is 1 for the task's first launch, counting retries and speculative
    copies. ``start_us`` and ``end_us`` are Unix microseconds (the executor's clock
    where it reported them, else the driver's); ``end_us`` and ``outcome`` are ``None``
    while it runs. ``outcome`` is ``succeeded``, a failure kind (``exit``, ``timeout``,
    ``killed``, ``host_error``, ...), ``lost`` (its executor was lost) or ``preempted``
    (killed to give its cores to a tenant held below its fair share); after either the
    task ran again, with no failure counted.
    """

    task: int
    attempt: int = 0
    executor: str = ""
    start_us: int = 0
    end_us: Optional[int] = None
    outcome: Optional[str] = None
    speculative: bool = False

    @property
    def duration_us(self) -> Optional[int]:
        """How long it ran, in microseconds (``None`` while it runs)."""
        return None if self.end_us is None else self.end_us - self.start_us


@dataclass(frozen=True)
class Timeline:
    """``GET /v1/jobs/{id}/timeline`` (``TimelineView``): every attempt of a job's
    tasks in launch order.

    ``now_us`` is the driver's clock when it answered, ``created_us`` and
    ``finished_us`` when the job was accepted and ended (Unix microseconds). The
    driver serves long timelines a page at a time; :meth:`flint_client.Job.timeline`
    reads every page, so ``next`` (the cursor of a following page) is ``None`` in what
    it returns.
    """

    job: str
    now_us: int = 0
    created_us: int = 0
    finished_us: Optional[int] = None
    attempts: List[TimelineAttempt] = field(default_factory=list)
    next: Optional[str] = None


@dataclass(frozen=True)
class ClusterSample:
    """One sample of :class:`ClusterHistory`: at ``t_ms`` (Unix ms), the attempts
    running (or queued) on executors, the cores given to tasks and all cores of live
    executors, the executors alive, and the tasks of live jobs waiting for a core.

    In a tenant's history (:attr:`ClusterHistory.tenant` set) the figures are the
    tenant's own tasks: those running, the cores they hold and those waiting; ``cores``
    and ``executors`` are ``None`` there (the cluster's size follows every tenant's load
    where executors are launched on demand)."""

    t_ms: int
    running_tasks: int = 0
    busy_cores: int = 0
    cores: Optional[int] = None
    executors: Optional[int] = None
    pending_tasks: int = 0


@dataclass(frozen=True)
class ClusterHistory:
    """``GET /v1/cluster/history``: the cluster once every ``interval_ms`` over the last
    minutes, oldest first (kept in the driver's memory: a restart starts it afresh).

    With a tenant's token it is that tenant's own tasks only, and ``tenant`` names it;
    ``None`` for the whole cluster, as the admin sees it."""

    interval_ms: int = 0
    tenant: Optional[str] = None
    samples: List[ClusterSample] = field(default_factory=list)


@dataclass(frozen=True)
class TenantUsage:
    """``GET /v1/tenants/{name}/usage``: what a tenant holds now and what its attempts
    used, to see how close it is to its limits (a :class:`~flint_client.QuotaExceeded`
    names the one it hit) and what it spent.

    Held now: ``live_jobs`` (queued or running), their ``pending_tasks`` and
    ``running_tasks``, the ``running_cores`` those hold, and ``storage_bytes``, the bytes
    of the modules and files it uploaded (uploads the admin shared are the admin's).
    Used since the driver started (kept in its memory: a restart counts afresh):
    ``attempts`` that reported their end, ``tasks_succeeded``, and their
    ``cpu_seconds``, ``wall_seconds`` (guest run time) and ``output_bytes`` (results),
    summed, and their outbound HTTP: ``egress_requests``, ``egress_bytes_sent`` and
    ``egress_bytes_received`` (0 from a driver older than egress). The admin's own is
    under the name ``admin``.
    """

    tenant: str
    live_jobs: int = 0
    pending_tasks: int = 0
    running_tasks: int = 0
    running_cores: int = 0
    storage_bytes: int = 0
    attempts: int = 0
    tasks_succeeded: int = 0
    cpu_seconds: float = 0.0
    wall_seconds: float = 0.0
    output_bytes: int = 0
    egress_requests: int = 0
    egress_bytes_sent: int = 0
    egress_bytes_received: int = 0


@dataclass(frozen=True)
class ReplaySource:
    """Where to get a module, a file or a part of a task's stdin, and what its bytes
    hash to (``sha256:<hex>``, ``None`` where the driver does not know).

    A ``url`` that starts with ``/`` is a path of the driver's API (an upload, a result
    or a block it serves: :meth:`flint_client.Client.replay_bytes` fetches it); any
    other is the job's own URL, which the executors fetched.
    """

    url: str
    sha256: Optional[str] = None

    @property
    def on_driver(self) -> bool:
        """Whether the driver serves it (``url`` is a path of its API)."""
        return self.url.startswith("/")


@dataclass(frozen=True)
class InlinePart:
    """A part of a task's stdin that the driver holds itself, as ``base64``."""

    base64: str

    @property
    def bytes(self) -> builtins.bytes:
        """The part's bytes."""
        return base64.b64decode(self.base64, validate=True)


#: A part of a task's stdin in a :class:`ReplayBundle` (schema ``ReplayInputPart``, an
#: untagged union): the bytes themselves, or where to fetch them.
ReplayInputPart = Union[InlinePart, ReplaySource]


@dataclass(frozen=True)
class ReplayNetwork:
    """The ``network`` a job's attempts ran under, in a :class:`ReplayBundle`: the job's
    ``allow`` list, its tenant's (``tenant_allow``, ``None`` for the admin's jobs) and
    the per-attempt limits. A replay judges the guest's requests by it again."""

    allow: List[str] = field(default_factory=list)
    tenant_allow: Optional[List[str]] = None
    max_requests: int = 0
    max_bytes: int = 0
    max_concurrent: int = 0


@dataclass(frozen=True)
class ReplayEgress:
    """One recorded request of the attempt in a :class:`ReplayBundle`: as
    :class:`EgressPin`, with where its record lies on ``egress_tape`` (``offset`` and
    ``len`` bytes, hashing to ``response_sha256``)."""

    method: str = ""
    url: str = ""
    request_sha256: str = ""
    status: int = 0
    response_sha256: str = ""
    offset: int = 0
    len: int = 0


@dataclass(frozen=True)
class ReplayBundle:
    """``GET /v1/jobs/{id}/tasks/{index}/replay``: what one attempt of a task ran with
    and how it ended, for running it again (``flint replay JOB TASK`` does, locally, in
    the executors' sandbox).

    ``attempt`` is the attempt replayed (the one asked for, else the task's latest);
    ``name`` is the guest's ``argv[0]`` (the job's name), ``task_count`` its
    ``FLINT_TASK_COUNT``. ``module``, ``files`` (by the name the guest reads them at
    under ``/files``) and the parts of ``input`` (the task's stdin, joined in order) say
    where to get the bytes and their SHA-256; ``input_sha256`` is the whole stdin's
    where the attempt recorded it (a deterministic job). ``args`` are the job's then the
    task's, ``env`` the job's under the task's (without the ``FLINT_*`` ones, which the
    sandbox sets); ``deterministic`` and ``seed`` the job's. ``memory_mb``,
    ``timeout_ms``, ``max_output_bytes`` and ``fuel`` are the budget the attempt ran
    with. ``outcome`` is how it ended (``succeeded``, a failure kind, ``lost``,
    ``preempted``; ``None`` while it runs); ``error``, ``log_sha256`` and ``result_sha256`` are recorded only
    for the attempt that decided the task (its last), ``result_sha256`` only when it
    succeeded. ``network`` is the job's grant (``None``: no network); ``egress`` the
    attempt's recorded requests in order and ``egress_tape`` where their responses are
    (``None`` when it made none, or ran where no block store could keep them).
    """

    job: str
    task: int
    attempt: int
    module: ReplaySource
    task_count: int = 0
    name: str = ""
    files: Dict[str, ReplaySource] = field(default_factory=dict)
    input: List[ReplayInputPart] = field(default_factory=list)
    input_sha256: Optional[str] = None
    args: List[str] = field(default_factory=list)
    env: Dict[str, str] = field(default_factory=dict)
    deterministic: bool = False
    seed: Optional[int] = None
    memory_mb: int = 0
    timeout_ms: int = 0
    max_output_bytes: int = 0
    fuel: Optional[int] = None
    outcome: Optional[str] = None
    error: Optional[ErrorBody] = None
    log_sha256: Optional[str] = None
    result_sha256: Optional[str] = None
    network: Optional[ReplayNetwork] = None
    egress: List[ReplayEgress] = field(default_factory=list)
    egress_tape: Optional[ReplaySource] = None


@dataclass(frozen=True)
class GraphCreated:
    """What ``POST /v1/graphs`` answers: the graph's ``id`` (``graph-...``), the id each
    job got by its local name (``jobs``), and the graph's ``state`` (with ``wait=``,
    maybe ended already)."""

    id: str
    jobs: Dict[str, str] = field(default_factory=dict)
    state: str = ""


@dataclass(frozen=True)
class GraphJobView:
    """One job of a :class:`GraphView`: its id, state, task count, tasks per state and,
    for a job that failed or was killed, why (``error.kind`` ``upstream_failed`` when a
    result it reads failed: the job to look at is upstream)."""

    id: str
    state: str = ""
    tasks: int = 0
    counts: TaskCounts = field(default_factory=TaskCounts)
    error: Optional[ErrorBody] = None

    @property
    def ended(self) -> bool:
        """Whether the job is over (succeeded, failed or killed)."""
        return self.state in JOB_FINAL_STATES

    @property
    def succeeded(self) -> bool:
        """Whether the job ended with every task succeeded."""
        return self.state == "succeeded"


@dataclass(frozen=True)
class GraphEdge:
    """An edge of a :class:`GraphView`: job ``to`` reads results of job ``from_`` (the
    JSON's ``from``), both by their local names."""

    from_: str = field(default="", metadata={"json": "from"})
    to: str = ""


@dataclass(frozen=True)
class GraphView:
    """A graph as ``GET /v1/graphs/{id}`` shows it (:meth:`flint_client.Graph.info`).

    ``state`` is ``queued`` or ``running`` until every job of it has ended, then
    ``succeeded``, or ``failed`` or ``killed`` as its jobs were; ``created_at_ms`` is
    Unix milliseconds; ``jobs`` maps each local name to its :class:`GraphJobView`;
    ``edges`` says which job reads which (:class:`GraphEdge`). ``recovered_from`` is,
    for a graph submitted again from a failed or killed one's jobs, that graph's id
    (``None`` otherwise). :attr:`counts` and :attr:`tasks` sum its jobs'.
    """

    id: str
    state: str = ""
    created_at_ms: int = 0
    jobs: Dict[str, GraphJobView] = field(default_factory=dict)
    edges: List[GraphEdge] = field(default_factory=list)
    recovered_from: Optional[str] = None

    @property
    def ended(self) -> bool:
        """Whether every job of the graph is over."""
        return self.state in JOB_FINAL_STATES

    @property
    def succeeded(self) -> bool:
        """Whether every job of the graph succeeded."""
        return self.state == "succeeded"

    @property
    def tasks(self) -> int:
        """The tasks of all its jobs."""
        return sum(job.tasks for job in self.jobs.values())

    @property
    def counts(self) -> TaskCounts:
        """Its jobs' tasks per state, summed."""
        total = TaskCounts()
        for job in self.jobs.values():
            total = total + job.counts
        return total


#: Each model and the ``components.schemas`` entry of the OpenAPI document it mirrors.
SCHEMAS: Dict[type, str] = {
    ErrorBody: "ErrorBody",
    TaskCounts: "TaskCounts",
    Usage: "Usage",
    JobView: "JobView",
    ResultInfo: "ResultInfo",
    Pins: "PinsView",
    EgressPin: "EgressPinView",
    TaskAttempt: "TaskAttemptView",
    MemoSource: "MemoSource",
    TaskView: "TaskView",
    TaskEvent: "TaskEvent",
    LaggedEvent: "LaggedEvent",
    AdoptedEvent: "AttemptNote",
    DroppedEvent: "AttemptNote",
    EgressDeniedEvent: "EgressDenial",
    ExecutorView: "ExecutorView",
    AllocationView: "AllocationView",
    ExecutorList: "ExecutorList",
    WorkerView: "WorkerView",
    Uploaded: "Uploaded",
    Timeline: "TimelineView",
    TimelineAttempt: "AttemptView",
    ClusterHistory: "ClusterHistory",
    ClusterSample: "ClusterSample",
    TenantUsage: "TenantUsage",
    ReplayBundle: "ReplayBundle",
    ReplaySource: "ReplaySource",
    ReplayNetwork: "ReplayNetwork",
    ReplayEgress: "ReplayEgress",
    GraphCreated: "GraphCreated",
    GraphView: "GraphView",
    GraphJobView: "GraphJobView",
    GraphEdge: "GraphEdge",
}

#: Models whose schema is found from a route instead of by name: (path, the JSON
#: pointer-like chain of properties below its ``200`` answer, where ``[]`` steps into
#: an array's items).
ROUTE_SCHEMAS: Dict[type, Tuple[str, Tuple[str, ...]]] = {
    Timeline: ("/v1/jobs/{id}/timeline", ()),
    TimelineAttempt: ("/v1/jobs/{id}/timeline", ("attempts", "[]")),
    ClusterHistory: ("/v1/cluster/history", ()),
    ClusterSample: ("/v1/cluster/history", ("samples", "[]")),
    GraphView: ("/v1/graphs/{id}", ()),
    GraphEdge: ("/v1/graphs/{id}", ("edges", "[]")),
}

T = TypeVar("T")

_HINTS: Dict[type, Dict[str, Any]] = {}


def _hints(cls: type) -> Dict[str, Any]:
    hints = _HINTS.get(cls)
    if hints is None:
        hints = typing.get_type_hints(cls, vars(sys.modules[cls.__module__]))
        _HINTS[cls] = hints
    return hints


def json_name(f: "dataclasses.Field[Any]") -> str:
    """The JSON name of a model's field: its own, but where Python reserves the word
    (``GraphEdge.from_`` is ``from``)."""
    name = f.metadata.get("json", f.name)
    return str(name)


def _convert(value: Any, hint: Any) -> Any:
    if value is None:
        return None
    origin = typing.get_origin(hint)
    if origin is Union:
        inner = [a for a in typing.get_args(hint) if a is not type(None)]
        return _convert(value, inner[0]) if len(inner) == 1 else _variant(value, inner)
    if origin in (list, List):
        (item,) = typing.get_args(hint) or (Any,)
        return [_convert(v, item) for v in value] if isinstance(value, list) else value
    if origin in (dict, Dict):
        _, item = typing.get_args(hint) or (Any, Any)
        return {k: _convert(v, item) for k, v in value.items()} if isinstance(value, Mapping) else value
    if dataclasses.is_dataclass(hint) and isinstance(hint, type):
        return from_json(hint, value) if isinstance(value, Mapping) else value
    return value


def _required(cls: type) -> "frozenset[str]":
    return frozenset(
        json_name(f)
        for f in dataclasses.fields(cls)
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    )


def _variant(value: Any, options: List[Any]) -> Any:
    """A value of an untagged union (serde's ``untagged``): for an object, the first
    model whose fields without a default it has, as serde tries each variant in turn."""
    models = [o for o in options if dataclasses.is_dataclass(o) and isinstance(o, type)]
    if not models or not isinstance(value, Mapping):
        return value
    for model in models:
        if _required(model) <= value.keys():
            return from_json(model, value)
    names = " or ".join(m.__name__ for m in models)
    raise ValueError(f"expected {names}, got an object of {sorted(value)}")


def from_json(cls: Type[T], data: Mapping[str, Any]) -> T:
    """Builds model ``cls`` from its JSON object, ignoring unknown fields.

    Fields the object lacks take their defaults (a field without one gets ``None``).
    """
    if not isinstance(data, Mapping):
        raise TypeError(f"{cls.__name__}: expected a JSON object, got {type(data).__name__}")
    hints = _hints(cls)
    kwargs: Dict[str, Any] = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        key = json_name(f)
        if key in data:
            kwargs[f.name] = _convert(data[key], hints[f.name])
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            kwargs[f.name] = None
    return cls(**kwargs)
