"""What a job is made of: inputs, tasks, files, resources, retries, and their JSON forms.

A task's input (its stdin) may be given as

- ``bytes`` (sent as ``{"base64": ...}``), ``str`` (``{"text": ...}``),
- a :class:`pathlib.Path` (the file's bytes, read now and sent as ``base64``),
- a :class:`Url` (fetched by the executor: ``{"url": ..., "sha256": ...}``),
- an earlier result, :meth:`flint_client.Job.result_ref` (:class:`ResultRef`) or all
  or some of an earlier job's results, :meth:`flint_client.Job.results_ref`
  (:class:`ResultsRef`), of a job that may still be running (the task then waits for
  them); in a graph (:meth:`flint_client.Client.graph`), another job of the graph's by
  its local name, :func:`graph_result` and :func:`graph_results`,
- or a ``dict`` already in the API's JSON form, passed through as it is.
"""

from __future__ import annotations

import base64
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Union

__all__ = [
    "Url",
    "ResultRef",
    "ResultsRef",
    "graph_result",
    "graph_results",
    "Resources",
    "EgressLimits",
    "Escalate",
    "Task",
    "Input",
    "encode_input",
    "encode_network",
    "encode_resources",
    "encode_retry",
    "encode_task",
]


@dataclass(frozen=True)
class Url:
    """Something the executors fetch by URL (``http(s)://``, ``s3://``, ``file://``,
    where the driver's fetch policy allows it), as a task input, a job file or the
    module.

    ``sha256`` (hex, or ``sha256:<hex>``) pins the bytes: other bytes fail the task as
    ``fetch_error``. ``timestamp_ms`` (files and modules only) says when the content was
    last published: a newer one makes every executor fetch it again.
    """

    url: str
    sha256: Optional[str] = None
    timestamp_ms: Optional[int] = None

    def as_input(self) -> Dict[str, Any]:
        """The JSON form of this URL as a task input."""
        if self.timestamp_ms is not None:
            raise ValueError("a URL input takes no timestamp_ms (files and modules do)")
        out: Dict[str, Any] = {"url": self.url}
        if self.sha256 is not None:
            out["sha256"] = self.sha256
        return out

    def as_file(self) -> Dict[str, Any]:
        """The JSON form of this URL as a job file."""
        out: Dict[str, Any] = {"url": self.url}
        if self.sha256 is not None:
            out["sha256"] = self.sha256
        if self.timestamp_ms is not None:
            out["timestamp_ms"] = self.timestamp_ms
        return out


@dataclass(frozen=True)
class ResultRef:
    """Task ``task``'s result of job ``job`` as an input (a chained job). The job may
    still be running: the task reading it is ``waiting`` until that task has succeeded
    (and fails ``upstream_failed`` without running if it fails or is killed). In a graph,
    ``job`` may be another job's local name (:func:`graph_result`)."""

    job: str
    task: int

    def as_input(self) -> Dict[str, Any]:
        """The JSON form: ``{"result": {"job": ..., "task": ...}}``."""
        return {"result": {"job": self.job, "task": self.task}}


@dataclass(frozen=True)
class ResultsRef:
    """Results of job ``job`` one after the other as one input: every task's in index
    order, or those of ``tasks`` in the order given (repeats allowed). A reduce over a
    map job, which may still be running: the task reading them is ``waiting`` until
    they have all succeeded. In a graph, ``job`` may be another job's local name
    (:func:`graph_results`)."""

    job: str
    tasks: Optional[Sequence[int]] = None

    def as_input(self) -> Dict[str, Any]:
        """The JSON form: ``{"results": {"job": ..., "tasks": [...]}}``."""
        inner: Dict[str, Any] = {"job": self.job}
        if self.tasks is not None:
            inner["tasks"] = list(self.tasks)
        return {"results": inner}


def graph_result(job: str, task: int) -> ResultRef:
    """Task ``task``'s result of the job named ``job`` in the same graph, as an input of
    another job of it (:meth:`flint_client.Client.graph`):
    ``{"result": {"job": "split", "task": 3}}``."""
    return ResultRef(job, task)


def graph_results(job: str, tasks: Optional[Sequence[int]] = None) -> ResultsRef:
    """The results of the job named ``job`` in the same graph, one after the other
    (every task's in order, or those of ``tasks``), as one input of another job of it
    (:meth:`flint_client.Client.graph`): ``{"results": {"job": "map"}}``."""
    return ResultsRef(job, list(tasks) if tasks is not None else None)


@dataclass(frozen=True)
class EgressLimits:
    """How much outbound HTTP each attempt of a job given ``network`` may make
    (``Resources(egress=...)``, the API's ``resources.egress``); ``None`` leaves the
    driver's default: ``max_requests`` 100 (each redirect hop followed is one),
    ``max_bytes`` 16 MiB sent and received together (method, URL, headers and bodies),
    ``max_concurrent`` 4 requests in flight. A tenant's own maxima (its
    ``max_egress_*`` limits) bring the defaults down to them, and a job asking for more
    is refused (:class:`~flint_client.QuotaExceeded`). Each is at least 1. Past one, the
    guest's request fails with an error naming it, and the guest decides what follows:
    the task does not fail for it."""

    max_requests: Optional[int] = None
    max_bytes: Optional[int] = None
    max_concurrent: Optional[int] = None

    def as_json(self) -> Dict[str, Any]:
        """The JSON form (``EgressSpec``), without the fields left to their defaults."""
        return {k: v for k, v in self.__dict__.items() if v is not None}


@dataclass(frozen=True)
class Resources:
    """What each task of a job may use; ``None`` leaves the driver's default (README,
    "Limits and defaults"): 1 core, 256 MiB, 60 s per attempt, 1 GiB of result, no fuel
    budget, and for a job given ``network`` the :class:`EgressLimits` defaults."""

    cores: Optional[int] = None
    memory_mb: Optional[int] = None
    timeout_ms: Optional[int] = None
    max_output_bytes: Optional[int] = None
    fuel: Optional[int] = None
    egress: Optional[EgressLimits] = None

    def as_json(self) -> Dict[str, Any]:
        """The JSON form, without the fields left to their defaults (an ``egress`` of
        nothing but defaults left out too)."""
        out = {k: v for k, v in self.__dict__.items() if v is not None and k != "egress"}
        if self.egress is not None and self.egress.as_json():
            out["egress"] = self.egress.as_json()
        return out


@dataclass(frozen=True)
class Escalate:
    """Retries that learn (``submit(retry=Escalate(...))``): a task that failed with
    ``memory_limit`` runs again with its memory multiplied by ``memory`` (from the larger
    of its budget and the peak it reached), one that failed with ``timeout`` with its
    time limit multiplied by ``timeout``, up to ``max_memory_mb`` and ``max_timeout_ms``
    (``None``: the cluster's limits). Factors are more than 1 and at most 16; give
    either or both. Each escalated attempt counts towards the job's ``max_failures``;
    each attempt's budget is in the task's ``history``."""

    memory: Optional[float] = None
    timeout: Optional[float] = None
    max_memory_mb: Optional[int] = None
    max_timeout_ms: Optional[int] = None

    def as_json(self) -> Dict[str, Any]:
        """The JSON form (``EscalateSpec``), without the fields not given."""
        return {k: v for k, v in self.__dict__.items() if v is not None}

    def as_retry(self) -> Dict[str, Any]:
        """The job's ``retry`` JSON form: ``{"escalate": {...}}``."""
        return {"escalate": self.as_json()}


#: Anything :func:`encode_input` takes.
Input = Union[bytes, bytearray, memoryview, str, Path, Url, ResultRef, ResultsRef, Mapping[str, Any]]


@dataclass(frozen=True)
class Task:
    """One task of a job given task by task (``submit(tasks=[...])``): its input and
    its own arguments and environment (the job's ``args`` and ``env`` are for jobs given
    ``inputs``)."""

    input: Optional[Input] = None
    args: Sequence[str] = ()
    env: Mapping[str, str] = field(default_factory=dict)


def encode_input(value: Input) -> Dict[str, Any]:
    """The API's JSON form of one task input (see the module's docstring)."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return {"base64": base64.b64encode(bytes(value)).decode("ascii")}
    if isinstance(value, str):
        return {"text": value}
    if isinstance(value, (Url, ResultRef, ResultsRef)):
        return value.as_input()
    if isinstance(value, os.PathLike):
        with open(value, "rb") as f:
            return {"base64": base64.b64encode(f.read()).decode("ascii")}
    if isinstance(value, Mapping):
        return dict(value)
    raise TypeError(
        f"a task input is bytes, str, a Path, a Url, a result reference or a dict, not {type(value).__name__}"
    )


def encode_resources(value: Union[Resources, Mapping[str, Any], None]) -> Optional[Dict[str, Any]]:
    """The JSON form of a job's resources (``None`` when none are given)."""
    if value is None:
        return None
    if isinstance(value, Resources):
        return value.as_json()
    if isinstance(value, Mapping):
        out = {k: v for k, v in value.items() if v is not None}
        if isinstance(out.get("egress"), EgressLimits):
            out["egress"] = out["egress"].as_json()
        return out
    raise TypeError(f"resources is a Resources or a dict, not {type(value).__name__}")


def encode_network(value: Optional[Sequence[str]]) -> Optional[Dict[str, Any]]:
    """The JSON form of a job's ``network`` (``NetworkSpec``) from its allow-list of
    origins: ``{"allow": [...]}``; ``None`` when none is given. The list is sent as it
    is (an empty one too): the driver judges it against its ceilings."""
    if value is None:
        return None
    if isinstance(value, Mapping):
        raise TypeError('network is the list of origins the tasks may call (["https://api.example.com"]), not a dict')
    return {"allow": as_list(value, "network")}


def encode_retry(value: Union[Escalate, Mapping[str, Any], None]) -> Optional[Dict[str, Any]]:
    """The JSON form of a job's ``retry`` (``RetrySpec``): an :class:`Escalate` becomes
    ``{"escalate": {...}}``; a dict is that form already and is passed through as it is
    (the driver refuses fields it does not know). ``None`` when none is given."""
    if value is None:
        return None
    if isinstance(value, Escalate):
        return value.as_retry()
    if isinstance(value, Mapping):
        out = dict(value)
        if isinstance(out.get("escalate"), Escalate):
            out["escalate"] = out["escalate"].as_json()
        return out
    raise TypeError(f"retry is an Escalate or a dict, not {type(value).__name__}")


def encode_task(value: Union[Task, Mapping[str, Any]]) -> Dict[str, Any]:
    """The JSON form of one task given task by task: a :class:`Task`, or a dict with
    ``input`` (any :data:`Input`), ``args`` and ``env``."""
    if isinstance(value, Task):
        item, args, env = value.input, value.args, value.env
    elif isinstance(value, Mapping):
        unknown = set(value) - {"input", "args", "env"}
        if unknown:
            raise ValueError(f"a task has input, args and env, not {sorted(unknown)}")
        item, args, env = value.get("input"), value.get("args") or (), value.get("env") or {}
    else:
        raise TypeError(f"a task is a Task or a dict, not {type(value).__name__}")
    if isinstance(args, str):
        raise TypeError("a task's args is a list of strings, not one string")
    out: Dict[str, Any] = {}
    if item is not None:
        out["input"] = encode_input(item)
    if args:
        out["args"] = list(args)
    if env:
        out["env"] = dict(env)
    return out


def as_list(args: Optional[Sequence[str]], what: str) -> List[str]:
    """``args`` as a list, refusing a lone string (a common slip: ``args="noop"``)."""
    if args is None:
        return []
    if isinstance(args, str):
        raise TypeError(f"{what} is a list of strings, not one string (write [{args!r}])")
    return [str(a) for a in args]


#: Each spec type and the ``components.schemas`` entry of the OpenAPI document it
#: mirrors (the test suite checks the fields against the live document).
SCHEMAS: Dict[type, str] = {
    Url: "UrlFileSpec",
    ResultRef: "ResultRef",
    ResultsRef: "ResultsRef",
    Resources: "ResourcesSpec",
    EgressLimits: "EgressSpec",
    Escalate: "EscalateSpec",
    Task: "TaskSpec",
}

#: The keys of a task input's JSON form (``InputSpec``).
INPUT_KEYS = ("text", "base64", "url", "sha256", "result", "results")
