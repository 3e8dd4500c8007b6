"""A driver with an API token: no token or a wrong one is Unauthorized, the right one works."""

from __future__ import annotations

import pytest

import flint_client
from flint_client import Client, Unauthorized

from .conftest import Driver, Guests


def test_no_token_is_unauthorized(secured_driver: Driver, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FLINT_TOKEN", raising=False)
    with Client(secured_driver.url) as client:
        assert client.health()  # open: liveness needs no token
        with pytest.raises(Unauthorized) as caught:
            list(client.jobs())
        assert caught.value.status == 401 and caught.value.kind == "unauthorized"
        assert "FLINT_TOKEN" in str(caught.value)


def test_a_wrong_token_is_unauthorized(secured_driver: Driver, guests: Guests) -> None:
    with Client(secured_driver.url, token="not-the-token") as client:
        with pytest.raises(Unauthorized):
            client.executors()
        with pytest.raises(Unauthorized):
            client.upload_module(guests.testkit)


def test_the_right_token_works(secured_driver: Driver, guests: Guests, monkeypatch: pytest.MonkeyPatch) -> None:
    assert secured_driver.token
    with Client(secured_driver.url, token=secured_driver.token) as client:
        assert client.map(guests.testkit, ["a", "b"], args=["echo"], decode="text") == ["a", "b"]
    monkeypatch.setenv("FLINT_URL", secured_driver.url)
    monkeypatch.setenv("FLINT_TOKEN", secured_driver.token)
    with Client() as client:
        job = client.submit(guests.testkit, ["c"], args=["echo"])
        assert job.wait(60, progress=True).succeeded
        assert [type(e) for e in job.events()] == [flint_client.EndEvent]
        assert job.result(0) == b"c"


@pytest.mark.anyio
async def test_async_auth(secured_driver: Driver) -> None:
    async with flint_client.AsyncClient(secured_driver.url, token="wrong") as client:
        with pytest.raises(Unauthorized):
            await client.executors()
    async with flint_client.AsyncClient(secured_driver.url, token=secured_driver.token) as client:
        assert len(await client.executors()) == 1
