"""The models match the live driver's OpenAPI document: every schema property is a field
of its model and every field a property (a drift either way fails); the variants of an
untagged union are its models'."""

from __future__ import annotations

import dataclasses
import re
import typing
from typing import Any, Dict, Set

import httpx
import pytest

from flint_client import _core as core
from flint_client import errors
from flint_client import specs
from flint_client.models import ROUTE_SCHEMAS, SCHEMAS, InlinePart, ReplayInputPart, ReplaySource, json_name

from .conftest import Driver


@pytest.fixture(scope="module")
def document(driver: Driver) -> Dict[str, Any]:
    """The driver's ``/v1/openapi.json`` (open: no token needed)."""
    response = httpx.get(f"{driver.url}/v1/openapi.json", timeout=30)
    response.raise_for_status()
    body = response.json()
    assert body["openapi"].startswith("3.1")
    return body


def resolve(doc: Dict[str, Any], schema: Dict[str, Any]) -> Dict[str, Any]:
    """Follows ``$ref``s and unwraps a ``oneOf``/``anyOf``/``allOf`` of one schema
    (and ``null``), as utoipa writes optional and nested types."""
    for _ in range(20):
        if "$ref" in schema:
            name = schema["$ref"].rsplit("/", 1)[-1]
            schema = doc["components"]["schemas"][name]
            continue
        for key in ("oneOf", "anyOf", "allOf"):
            options = [s for s in schema.get(key, []) if s.get("type") != "null"]
            if len(options) == 1:
                schema = options[0]
                break
        else:
            return schema
    raise AssertionError(f"cannot resolve {schema}")


def properties(doc: Dict[str, Any], schema: Dict[str, Any]) -> Set[str]:
    schema = resolve(doc, schema)
    assert "properties" in schema, f"not an object schema: {schema}"
    return set(schema["properties"])


def fields(cls: type) -> Set[str]:
    """A model's fields by their JSON names (``GraphEdge.from_`` is ``from``)."""
    return {json_name(f) for f in dataclasses.fields(cls)}


@pytest.mark.parametrize("model", list(SCHEMAS), ids=lambda m: m.__name__)
def test_models_match_their_schemas(document: Dict[str, Any], model: type) -> None:
    name = SCHEMAS[model]
    schemas = document["components"]["schemas"]
    assert name in schemas, f"{model.__name__}: no schema {name} in the driver's document"
    assert fields(model) == properties(document, schemas[name]), (
        f"{model.__name__} drifted from schema {name}: "
        f"only in the model {sorted(fields(model) - properties(document, schemas[name]))}, "
        f"only in the schema {sorted(properties(document, schemas[name]) - fields(model))}"
    )


@pytest.mark.parametrize("model", list(ROUTE_SCHEMAS), ids=lambda m: m.__name__)
def test_models_of_routes_match_their_answers(document: Dict[str, Any], model: type) -> None:
    path, chain = ROUTE_SCHEMAS[model]
    assert path in document["paths"], f"{model.__name__}: the driver's document has no route {path}"
    answer = document["paths"][path]["get"]["responses"]["200"]
    schema = answer["content"]["application/json"]["schema"]
    for step in chain:
        schema = resolve(document, schema)
        schema = schema["items"] if step == "[]" else schema["properties"][step]
    have = properties(document, schema)
    assert fields(model) == have, (
        f"{model.__name__} drifted from the answer of GET {path}: "
        f"only in the model {sorted(fields(model) - have)}, only in the schema {sorted(have - fields(model))}"
    )


@pytest.mark.parametrize("cls", list(specs.SCHEMAS), ids=lambda m: m.__name__)
def test_spec_types_match_their_schemas(document: Dict[str, Any], cls: type) -> None:
    name = specs.SCHEMAS[cls]
    have = properties(document, document["components"]["schemas"][name])
    assert fields(cls) == have, f"{cls.__name__} drifted from schema {name}: {sorted(fields(cls) ^ have)}"


def test_submit_knows_every_job_spec_field(document: Dict[str, Any]) -> None:
    have = properties(document, document["components"]["schemas"]["JobSpec"])
    assert set(core.JOB_SPEC_FIELDS) == have, f"JobSpec drifted: {sorted(set(core.JOB_SPEC_FIELDS) ^ have)}"


def test_a_graph_is_jobs_by_name(document: Dict[str, Any]) -> None:
    schemas = document["components"]["schemas"]
    graph = schemas["GraphSpec"]
    assert set(core.GRAPH_SPEC_FIELDS) == properties(document, graph)
    # Each job of a graph is a JobSpec, which submit's arguments make (checked above).
    assert graph["properties"]["jobs"]["additionalProperties"] == {"$ref": "#/components/schemas/JobSpec"}
    # What a graph's job may be given: every JobSpec field (a module's digest and
    # timestamp through a Url).
    assert set(core.SPEC_OPTIONS) == set(core.JOB_SPEC_FIELDS) - {"module_sha256", "module_timestamp_ms"}
    view = schemas["GraphView"]["properties"]["jobs"]["additionalProperties"]
    assert view == {"$ref": "#/components/schemas/GraphJobView"}


def test_the_graph_routes_the_client_calls_exist(document: Dict[str, Any]) -> None:
    paths = document["paths"]
    assert "202" in paths["/v1/graphs"]["post"]["responses"]
    assert {"get", "delete"} <= set(paths["/v1/graphs/{id}"])
    assert "202" in paths["/v1/graphs/{id}/kill"]["post"]["responses"]
    counts = properties(document, document["components"]["schemas"]["TaskCounts"])
    assert "waiting" in counts


def test_every_input_kind_is_known(document: Dict[str, Any]) -> None:
    have = properties(document, document["components"]["schemas"]["InputSpec"])
    assert set(specs.INPUT_KEYS) == have, f"InputSpec drifted: {sorted(set(specs.INPUT_KEYS) ^ have)}"


def test_replay_input_parts_are_the_schemas_variants(document: Dict[str, Any]) -> None:
    # An untagged enum: utoipa writes a oneOf of the inline object and ReplaySource,
    # which ReplayInputPart mirrors as Union[InlinePart, ReplaySource], in that order
    # (serde tries the inline variant first, and so does the client).
    schema = document["components"]["schemas"]["ReplayInputPart"]
    variants = [properties(document, option) for option in schema["oneOf"]]
    assert variants == [fields(InlinePart), fields(ReplaySource)]
    assert typing.get_args(ReplayInputPart) == (InlinePart, ReplaySource)
    bundle = document["components"]["schemas"]["ReplayBundle"]
    assert bundle["properties"]["input"]["items"] == {"$ref": "#/components/schemas/ReplayInputPart"}


def test_every_error_kind_is_known(document: Dict[str, Any]) -> None:
    """The driver's error kinds (its ``ErrorCode`` schema) are the kinds the client maps to
    its exceptions: a kind the client lacks would be raised by its status alone."""
    kinds = set(document["components"]["schemas"]["ErrorCode"]["enum"])
    assert kinds == set(errors._BY_KIND), (kinds - set(errors._BY_KIND), set(errors._BY_KIND) - kinds)


def test_network_is_an_allow_list_and_egress_a_resource(document: Dict[str, Any]) -> None:
    # submit(network=[...]) sends {"allow": [...]}: the schema has nothing else to give.
    schemas = document["components"]["schemas"]
    assert properties(document, schemas["NetworkSpec"]) == {"allow"}
    assert resolve(document, schemas["JobSpec"]["properties"]["network"]) == schemas["NetworkSpec"]
    egress = schemas["ResourcesSpec"]["properties"]["egress"]
    assert resolve(document, egress) == schemas["EgressSpec"]


def test_every_event_of_a_job_stream_is_known(document: Dict[str, Any]) -> None:
    """The events the driver's stream route names (its description: "events `job` and
    `end` carry a JobView, ...") are the ones the client parses into models: one it
    lacks would reach callers as an UnknownEvent."""
    answer = document["paths"]["/v1/jobs/{id}/events"]["get"]["responses"]["200"]
    named = set(re.findall(r"`([a-z_]+)`", answer["description"]))
    assert named == set(core.EVENTS), (named - set(core.EVENTS), set(core.EVENTS) - named)
