"""A driver with tenants (``--tenants FILE``): a tenant's token sees its own jobs only
(another's answer as jobs that do not exist), a submission past one of its limits is
QuotaExceeded, what is the admin's alone is Forbidden, and each reads its own usage.

One driver for the module, 1 executor of 1 core: tenant ``a`` without limits, tenant
``b`` with ``max_jobs = 1``, ``max_task_memory_mb = 64`` and ``max_priority = 1``.
``b``'s jobs ask for 64 MiB (the default, 256, is past its limit). The driver's
``--egress-allow`` lists one origin (nothing serves it: only submissions are judged),
which ``b``'s ``egress_allow`` lists too, with ``max_egress_requests = 5``; ``a`` lists
none.
"""

from __future__ import annotations

import hashlib
import secrets
import shutil
import subprocess
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterator, List

import pytest

import flint_client
from flint_client import (
    AsyncClient,
    Client,
    EgressLimits,
    Forbidden,
    InvalidSpec,
    NotFound,
    QuotaExceeded,
    Resources,
    Unauthorized,
)

from .conftest import Driver, Guests, _flint_bin, free_service, start_driver

#: What b's jobs ask for: its max_task_memory_mb.
SMALL = Resources(memory_mb=64)


def token_hash(token: str) -> str:
    """A token as the tenants file holds it (what ``flint hash-token`` prints)."""
    return "sha256:" + hashlib.sha256(token.encode()).hexdigest()


@dataclass
class Tenancy:
    """The driver and the tokens of its admin and of tenants ``a`` and ``b``."""

    driver: Driver
    admin: str
    tokens: Dict[str, str]


@pytest.fixture(scope="module")
def tenancy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tenancy]:
    tokens = {"a": secrets.token_hex(16), "b": secrets.token_hex(16)}
    service = free_service()
    path = tmp_path_factory.mktemp("tenants") / "tenants.toml"
    path.write_text(
        f"""
[[tenant]]
name = "a"
tokens = ["{token_hash(tokens["a"])}"]

[[tenant]]
name = "b"
tokens = ["{token_hash(tokens["b"])}"]
max_priority = 1
egress_allow = ["{service}"]
[tenant.limits]
max_jobs = 1
max_task_memory_mb = 64
max_egress_requests = 5
"""
    )
    admin = secrets.token_hex(16)
    # The admin's token as --token (start_driver gives it, with a cluster secret, by
    # their environment variables), the tenants' in the file.
    d = start_driver(executors=1, token=admin, extra_args=["--tenants", str(path)], service=service)
    try:
        yield Tenancy(d, admin, tokens)
    finally:
        d.stop()
        shutil.rmtree(d.data_dir, ignore_errors=True)


@pytest.fixture()
def admin(tenancy: Tenancy) -> Iterator[Client]:
    with Client(tenancy.driver.url, token=tenancy.admin) as c:
        yield c


@pytest.fixture()
def as_a(tenancy: Tenancy) -> Iterator[Client]:
    with Client(tenancy.driver.url, token=tenancy.tokens["a"]) as c:
        yield c


@pytest.fixture()
def as_b(tenancy: Tenancy) -> Iterator[Client]:
    with Client(tenancy.driver.url, token=tenancy.tokens["b"]) as c:
        yield c


def ids(jobs: Iterator[flint_client.JobView]) -> List[str]:
    return [j.id for j in jobs]


def test_hash_token_prints_what_the_file_holds() -> None:
    out = subprocess.run(
        [str(_flint_bin()), "hash-token"], input=b"s3cret", capture_output=True, check=True, timeout=30
    ).stdout
    assert out.decode().strip() == token_hash("s3cret")


def test_a_tenant_sees_only_its_own_jobs(admin: Client, as_a: Client, as_b: Client, guests: Guests) -> None:
    job = as_a.submit(guests.testkit, ["hi"], args=["echo"], wait=60)
    view = job.wait(60)
    assert view.succeeded and view.tenant == "a" and view.priority == 0
    assert job.results() == [b"hi"] and isinstance(job.logs(0), str)

    mine = ids(as_a.jobs())
    assert job.id in mine and all(v.tenant == "a" for v in as_a.jobs())
    # A tenant's filter cannot reach past its own jobs.
    assert ids(as_a.jobs(tenant="b")) == mine
    assert job.id not in ids(as_b.jobs())
    # The admin sees every tenant's, or one's, or its own as "admin".
    assert admin.job(job.id).info().tenant == "a"
    assert job.id in ids(admin.jobs())
    assert ids(admin.jobs(tenant="a")) == mine
    assert all(v.tenant == "a" for v in admin.jobs(tenant="a"))
    assert job.id not in ids(admin.jobs(tenant="b"))
    assert job.id not in ids(admin.jobs(tenant="admin"))

    # To b, a's job answers exactly as a job that does not exist.
    theirs, missing = as_b.job(job.id), as_b.job("job-does-not-exist")
    calls: Dict[str, Callable[[flint_client.Job], Any]] = {
        "info": lambda j: j.info(),
        "tasks": lambda j: list(j.tasks()),
        "result": lambda j: j.result(0),
        "results": lambda j: j.results(),
        "logs": lambda j: j.logs(0),
        "timeline": lambda j: j.timeline(),
        "replay": lambda j: j.replay(0),
        "kill": lambda j: j.kill(),
        "delete": lambda j: j.delete(),
    }
    for what, call in calls.items():
        for handle in (theirs, missing):
            with pytest.raises(NotFound) as caught:
                call(handle)
            error = caught.value
            assert (error.status, error.kind) == (404, "job_not_found"), what
            assert error.message == f"no job {handle.id}", what

    # Nothing b tried touched it: a still reads it, and deletes it.
    assert job.result(0) == b"hi"
    job.delete()
    with pytest.raises(NotFound):
        admin.job(job.id).info()


def test_a_submission_past_a_limit_is_quota_exceeded(as_b: Client, guests: Guests) -> None:
    with pytest.raises(QuotaExceeded) as caught:
        as_b.submit(guests.testkit, ["x"], args=["echo"], resources=Resources(memory_mb=128))
    error = caught.value
    assert (error.status, error.kind) == (429, "quota_exceeded")
    assert "max_task_memory_mb is 64" in error.message

    before = ids(as_b.jobs())
    live = as_b.submit(guests.testkit, [""], args=["sleep", "30000"], resources=SMALL)
    try:
        assert live.view is not None and not live.view.ended and live.view.tenant == "b"
        assert as_b.tenant_usage("b").live_jobs == 1
        with pytest.raises(QuotaExceeded) as caught:
            as_b.submit(guests.testkit, ["x"], args=["echo"], resources=SMALL)
        error = caught.value
        assert (error.status, error.kind) == (429, "quota_exceeded")
        assert "max_jobs is 1" in error.message
        # Nothing was stored: b has the live job more, and no other.
        assert ids(as_b.jobs()) == [live.id] + before
    finally:
        assert live.kill().state == "killed"
    # Killed, it is no longer live: b may submit again.
    assert as_b.tenant_usage("b").live_jobs == 0
    assert as_b.map(guests.testkit, ["y"], args=["echo"], resources=SMALL) == [b"y"]


def test_priority_is_capped_by_the_tenants_max_priority(as_a: Client, as_b: Client, guests: Guests) -> None:
    with pytest.raises(QuotaExceeded) as caught:
        as_b.submit(guests.testkit, ["x"], args=["echo"], resources=SMALL, priority=2)
    assert caught.value.kind == "quota_exceeded" and "max_priority is 1" in caught.value.message
    # A tenant's max_priority is 0 unless its entry gives one.
    with pytest.raises(QuotaExceeded) as caught:
        as_a.submit(guests.testkit, ["x"], args=["echo"], priority=1)
    assert "max_priority is 0" in caught.value.message

    job = as_b.submit(guests.testkit, ["x"], args=["echo"], resources=SMALL, priority=1, wait=60)
    view = job.wait(60)
    assert view.succeeded and view.tenant == "b" and view.priority == 1
    # A priority under the cap, negative ones included, is the tenant's to give.
    assert as_a.submit(guests.testkit, ["x"], args=["echo"], priority=-1, wait=60).wait(60).priority == -1


def test_network_is_judged_against_the_tenants_egress_allow_and_maxima(
    tenancy: Tenancy, as_a: Client, as_b: Client, guests: Guests
) -> None:
    origin = tenancy.driver.service
    assert origin is not None
    over = Resources(memory_mb=64, egress=EgressLimits(max_requests=6))
    with pytest.raises(QuotaExceeded) as caught:
        as_b.submit(guests.testkit, [""], args=["noop"], network=[origin], resources=over)
    assert (caught.value.status, caught.value.kind) == (429, "quota_exceeded")
    assert "max_egress_requests is 5" in caught.value.message
    # The operator allows the origin, but a lists no egress_allow: it may call nothing.
    with pytest.raises(InvalidSpec) as refused:
        as_a.submit(guests.testkit, [""], args=["noop"], network=[origin])
    assert refused.value.status == 422 and 'tenant "a" may call no origin' in refused.value.message


def test_a_live_job_is_listed_with_its_tenant_and_priority(as_a: Client, guests: Guests) -> None:
    live = as_a.submit(guests.testkit, [""], args=["sleep", "30000"], priority=-1)
    try:
        listed = next(v for v in as_a.jobs(limit=10) if v.id == live.id)
        assert (listed.tenant, listed.priority) == ("a", -1)
    finally:
        live.kill()


def test_listed_ended_jobs_carry_their_tenant(as_a: Client, guests: Guests) -> None:
    job = as_a.submit(guests.testkit, ["x"], args=["echo"], priority=-1, wait=60)
    assert job.wait(60).tenant == "a"
    # The driver lists a job it still holds in memory as GET /v1/jobs/{id} shows it
    # (with its usage), and one whose end it has stored from the stored summary
    # (usage None): the latter is the case this test is about, a moment after the end.
    deadline = time.monotonic() + 10
    while True:
        listed = next(v for v in as_a.jobs(limit=10) if v.id == job.id)
        if listed.usage is None or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert (listed.tenant, listed.priority) == ("a", -1)


def test_what_is_the_admins_is_forbidden_to_a_tenant(admin: Client, as_a: Client) -> None:
    with pytest.raises(Forbidden) as caught:
        as_a.metrics()
    assert (caught.value.status, caught.value.kind) == (403, "admin_only")
    assert "flint_" in admin.metrics()
    # The executors and workers show every tenant's load: the admin's alone.
    for call in (as_a.executors, as_a.workers):
        with pytest.raises(Forbidden) as caught:
            call()
        assert (caught.value.status, caught.value.kind) == (403, "admin_only")
    assert len(admin.executors()) == 1
    assert admin.workers() == []
    # The cluster's history is the whole cluster's to the admin, a tenant's own to it.
    assert admin.cluster_history().tenant is None
    mine = as_a.cluster_history()
    assert mine.tenant == "a"
    assert all(s.cores is None and s.executors is None for s in mine.samples)


def test_tenant_usage(admin: Client, as_a: Client, guests: Guests) -> None:
    assert as_a.map(guests.testkit, ["u"], args=["echo"]) == [b"u"]
    mine = as_a.tenant_usage("a")
    assert isinstance(mine, flint_client.TenantUsage) and mine.tenant == "a"
    assert mine.attempts >= 1 and mine.tasks_succeeded >= 1 and mine.output_bytes >= 1
    assert mine.storage_bytes > 0  # it uploaded the testkit
    assert isinstance(mine.cpu_seconds, float) and isinstance(mine.wall_seconds, float)
    assert mine.live_jobs == mine.pending_tasks == mine.running_tasks == mine.running_cores == 0
    # Another tenant's usage, or a tenant that does not exist, is not found alike.
    for name in ("b", "admin", "nobody"):
        with pytest.raises(NotFound) as caught:
            as_a.tenant_usage(name)
        assert (caught.value.status, caught.value.kind) == (404, "tenant_not_found"), name
    # The admin reads anyone's, and its own as "admin".
    assert admin.tenant_usage("a").attempts == as_a.tenant_usage("a").attempts
    assert admin.tenant_usage("b").tenant == "b"
    assert admin.tenant_usage("admin").tenant == "admin"
    with pytest.raises(NotFound):
        admin.tenant_usage("nobody")


def test_a_token_of_no_tenant_is_unauthorized(tenancy: Tenancy) -> None:
    with Client(tenancy.driver.url, token="no-tenant-has-this") as client:
        with pytest.raises(Unauthorized):
            list(client.jobs())


@pytest.mark.anyio
async def test_async_tenants(tenancy: Tenancy, guests: Guests) -> None:
    async with AsyncClient(tenancy.driver.url, token=tenancy.tokens["b"]) as client:
        assert (await client.tenant_usage("b")).tenant == "b"
        with pytest.raises(NotFound):
            await client.tenant_usage("a")
        with pytest.raises(Forbidden):
            await client.metrics()
        with pytest.raises(Forbidden):
            await client.executors()
        assert (await client.cluster_history()).tenant == "b"
        with pytest.raises(QuotaExceeded, match="max_task_memory_mb is 64"):
            await client.submit(guests.testkit, ["x"], args=["echo"], resources=Resources(memory_mb=128))
        job = await client.submit(guests.testkit, ["z"], args=["echo"], resources=SMALL, priority=1, wait=60)
        view = await job.wait(60)
        assert view.succeeded and view.tenant == "b" and view.priority == 1
        theirs = [v.id async for v in client.jobs(tenant="a")]
        assert job.id in theirs and theirs == [v.id async for v in client.jobs()]
    async with AsyncClient(tenancy.driver.url, token=tenancy.admin) as admin:
        listed = [v async for v in admin.jobs(tenant="b", limit=1)]
        assert [v.id for v in listed] == [job.id]
