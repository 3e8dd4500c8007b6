"""Python client of Flint, the WebAssembly task executor.

Connect with :class:`Client` (or :class:`AsyncClient`), submit jobs, wait for them,
read their results::

    from flint_client import Client

    with Client() as client:  # FLINT_URL, FLINT_TOKEN
        counts = client.map("wordcount.wasm", ["to be or not to be"], decode="json")

See the package's README for a walkthrough.
"""

from ._async import AsyncClient, AsyncJob
from ._sync import DEFAULT_TIMEOUT, DEFAULT_URL, Client, Job
from .errors import (
    BadRequest,
    Conflict,
    FlintConnectionError,
    FlintError,
    FlintTimeoutError,
    InvalidModule,
    InvalidSpec,
    JobFailed,
    NotFound,
    Overloaded,
    ProtocolError,
    ServerError,
    StorageFull,
    TaskFailure,
    TooLarge,
    Unauthorized,
    WaitTimeout,
)
from .models import (
    AllocationView,
    ClusterHistory,
    ClusterSample,
    EndEvent,
    ErrorBody,
    Event,
    ExecutorList,
    ExecutorView,
    JobEvent,
    JobView,
    LaggedEvent,
    Pins,
    ResultInfo,
    TaskAttempt,
    TaskCounts,
    TaskEvent,
    TaskView,
    Timeline,
    TimelineAttempt,
    UnknownEvent,
    Uploaded,
    Usage,
    WorkerView,
)
from .specs import Escalate, Resources, ResultRef, ResultsRef, Task, Url

__version__ = "0.1.0"

__all__ = [
    "__version__",
    "Client",
    "Job",
    "AsyncClient",
    "AsyncJob",
    "DEFAULT_URL",
    "DEFAULT_TIMEOUT",
    "Url",
    "Resources",
    "Escalate",
    "Task",
    "ResultRef",
    "ResultsRef",
    "FlintError",
    "FlintConnectionError",
    "FlintTimeoutError",
    "BadRequest",
    "Unauthorized",
    "NotFound",
    "Conflict",
    "InvalidSpec",
    "InvalidModule",
    "TooLarge",
    "Overloaded",
    "StorageFull",
    "ServerError",
    "ProtocolError",
    "WaitTimeout",
    "JobFailed",
    "TaskFailure",
    "JobView",
    "TaskCounts",
    "ErrorBody",
    "TaskView",
    "TaskAttempt",
    "Pins",
    "Usage",
    "ResultInfo",
    "Event",
    "JobEvent",
    "TaskEvent",
    "LaggedEvent",
    "EndEvent",
    "UnknownEvent",
    "ExecutorView",
    "ExecutorList",
    "AllocationView",
    "WorkerView",
    "Uploaded",
    "Timeline",
    "TimelineAttempt",
    "ClusterHistory",
    "ClusterSample",
]
