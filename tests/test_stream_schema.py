"""The JSON Schema (harness/formats/schemas/stream.schema.json) agrees with the parser and the dataclasses."""

from __future__ import annotations

import copy
import json
from dataclasses import MISSING, fields

import pytest

from harness.formats.paths import STREAM_SCHEMA, STREAMS_DIR
from harness.formats.stream import Config, RequestSpec, Stream, StreamError, load_stream, parse_stream
from stream_builders import MINIMAL, req, stream

SCHEMA_PATH = STREAM_SCHEMA
FIXTURE_STREAMS = sorted(STREAMS_DIR.glob("*.json"))


# ---------------------------------------------------------------------------
# JSON Schema (harness/formats/schemas/stream.schema.json)
# ---------------------------------------------------------------------------

VALID_STREAMS = [
    MINIMAL,
    stream(),
    stream(name="full", description="every field set", reset_prefix_cache_steps=[0, 3],
           config={"enable_chunked_prefill": False, "max_num_batched_tokens": 32,
                   "enable_prefix_caching": False, "long_prefill_token_threshold": 8,
                   "policy": "priority", "num_speculative_tokens": 3,
                   "speculative_method": "eagle", "model": "qwen2.5-0.5b", "max_steps": 50},
           requests=[req(arrival_step=1, max_tokens=2, eos_token_id=5, stop_token_ids=[9],
                         ignore_eos=True, priority=-2, abort_step=4, cache_salt="salt",
                         prompt_logprobs=1, drafts=[[4, 5, 6], []]),
                     req("b", max_tokens=None, eos_token_id=None, abort_step=None,
                         cache_salt=None, prompt_logprobs=None)]),
]

# Shape errors: both the schema and parse_stream must refuse these.
SHAPE_ERRORS = [
    {"config": {}},
    {"requests": []},
    {"requests": [req()], "extra": 1},
    stream(config={"blocksize": 4}),
    stream(requests=[req(extra=1)]),
    stream(config={"block_size": "4"}),
    stream(config={"block_size": True}),
    stream(config={"block_size": 0}),
    stream(config={"num_gpu_blocks": 1, "max_model_len": 4}),
    stream(config={"max_steps": -1}),
    stream(config={"num_speculative_tokens": -1}),
    stream(config={"enable_prefix_caching": "yes"}),
    stream(config={"policy": "lifo"}),
    stream(config={"speculative_method": "medusa"}),
    stream(config={"model": "../models/qwen2.5-0.5b"}),
    stream(requests=[{"id": "a", "prompt": [1]}]),
    stream(requests=[req(id="")]),
    stream(requests=[req(prompt=[])]),
    stream(requests=[req(output=[-1])]),
    stream(requests=[req(max_tokens=0)]),
    stream(requests=[req(arrival_step=-1)]),
    stream(requests=[req(ignore_eos=1)]),
    stream(requests=[req(cache_salt=5)]),
    stream(requests=[req(drafts=[5])]),
    stream(name=None),
    stream(reset_prefix_cache_steps=[-1]),
]


@pytest.fixture(scope="module")
def validator():
    jsonschema = pytest.importorskip(
        "jsonschema", reason="jsonschema is not installed: the schema checks need it")
    schema = json.loads(SCHEMA_PATH.read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def test_schema_is_valid_draft_2020_12(validator):
    assert validator.schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"


@pytest.mark.parametrize("path", FIXTURE_STREAMS, ids=[p.name for p in FIXTURE_STREAMS])
def test_fixture_streams_match_schema(validator, path):
    data = json.loads(path.read_text())
    errors = [e.message for e in validator.iter_errors(data)]
    assert not errors, f"{path.name}: {errors[:3]}"
    load_stream(path)


@pytest.mark.parametrize("data", VALID_STREAMS)
def test_valid_streams_match_schema(validator, data):
    assert not [e.message for e in validator.iter_errors(data)]
    parse_stream(copy.deepcopy(data))


@pytest.mark.parametrize("data", SHAPE_ERRORS)
def test_shape_errors_refused_by_schema_and_parser(validator, data):
    assert not validator.is_valid(data)
    with pytest.raises(StreamError):
        parse_stream(copy.deepcopy(data))


def _plain(value):
    """A dataclass default as JSON: tuples become lists."""
    return list(value) if isinstance(value, tuple) else value


def test_schema_fields_and_defaults_match_dataclasses(validator):
    schema = validator.schema
    assert schema["additionalProperties"] is False
    assert set(schema["properties"]) == {f.name for f in fields(Stream)}
    assert schema["required"] == ["requests"]

    config = schema["$defs"]["config"]
    assert config["additionalProperties"] is False
    assert set(config["properties"]) == {f.name for f in fields(Config)}
    for f in fields(Config):
        prop = config["properties"][f.name]
        default = list(f.default) if isinstance(f.default, tuple) else f.default
        assert prop["default"] == default, f.name
        assert prop.get("description"), f.name
    assert config["properties"]["policy"]["enum"] == ["fcfs", "priority"]
    assert config["properties"]["speculative_method"]["enum"] == ["ngram", "eagle"]

    request = schema["$defs"]["request"]
    assert request["additionalProperties"] is False
    assert set(request["properties"]) == {f.name for f in fields(RequestSpec)}
    required = [f.name for f in fields(RequestSpec) if f.default is MISSING]
    assert request["required"] == required
    for f in fields(RequestSpec):
        prop = request["properties"][f.name]
        assert prop.get("description"), f.name
        if f.default is not MISSING:
            assert prop["default"] == _plain(f.default), f.name
