"""Stream format: validation rules, defaults, canonical form, schema, CLI exit 2.

Every bad-input rule must give one StreamError whose single-line message
starts with the field path and states the rule.  These tests never import
vLLM: they must pass where vLLM is not installed.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import subprocess
import sys
from dataclasses import MISSING, fields
from pathlib import Path

import pytest

from harness.stream import (Config, RequestSpec, Stream, StreamError, canonical_json,
                            load_stream, parse_stream)
from harness.trace import STEP_FIELDS

ROOT = Path(__file__).resolve().parent.parent
SCHEMA_PATH = ROOT / "docs" / "stream.schema.json"
FIXTURE_STREAMS = sorted((ROOT / "fixtures" / "streams").glob("*.json"))

# A small valid config: 4-token blocks, 16 blocks, 32-token model length.
SMALL = {"block_size": 4, "num_gpu_blocks": 16, "max_num_batched_tokens": 16,
         "max_num_seqs": 4, "max_model_len": 32}


def req(id: str = "a", **kw) -> dict:
    """A valid request dict; keyword arguments override or add fields."""
    r = {"id": id, "prompt": [1, 2, 3], "output": [4, 5]}
    r.update(kw)
    return r


def stream(config: dict | None = None, requests: list | None = None, **top) -> dict:
    """A valid stream dict built on SMALL; ``config`` entries override SMALL's."""
    data = {"config": {**SMALL, **(config or {})}, "requests": requests or [req()]}
    data.update(top)
    return data


def rejects(data, match: str) -> str:
    """Assert parse_stream rejects ``data`` with a one-line message matching ``match``."""
    with pytest.raises(StreamError, match=match) as info:
        parse_stream(copy.deepcopy(data))
    message = str(info.value)
    assert "\n" not in message and "\r" not in message
    return message


def test_valid_base_stream_parses():
    s = parse_stream(stream())
    assert isinstance(s, Stream)
    assert s.config.block_size == 4
    assert [r.id for r in s.requests] == ["a"]


# ---------------------------------------------------------------------------
# Unknown fields
# ---------------------------------------------------------------------------


def test_unknown_top_level_field():
    msg = rejects(stream(confg={}), r"^confg: unknown field")
    assert "allowed:" in msg


def test_unknown_config_field():
    rejects(stream(config={"blocksize": 16}), r"^config\.blocksize: unknown field$")


def test_unknown_request_field():
    rejects(stream(requests=[req(prio=1)]), r"^requests\[0\]\.prio: unknown field$")


# ---------------------------------------------------------------------------
# Wrong types
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("key, value, rule", [
    ("block_size", "16", "must be an integer"),
    ("block_size", 16.0, "must be an integer"),
    ("num_gpu_blocks", True, "must be an integer"),
    ("max_num_seqs", None, "must be an integer"),
    ("max_steps", [10], "must be an integer"),
    ("enable_chunked_prefill", 1, "must be true or false"),
    ("enable_prefix_caching", "true", "must be true or false"),
    ("policy", 1, "must be a string"),
    ("speculative_method", None, "must be a string"),
    ("model", ["qwen2.5-0.5b"], "must be a string"),
])
def test_config_wrong_type(key, value, rule):
    rejects(stream(config={key: value}), rf"^config\.{key}: {rule}$")


def test_config_not_an_object():
    rejects({"config": [], "requests": [req()]}, r"^config: must be a JSON object$")


@pytest.mark.parametrize("key, value, rule", [
    ("prompt", "1 2 3", "must be a list of integers"),
    ("prompt", [1, "2"], "must be a list of integers"),
    ("prompt", [1, True], "must be a list of integers"),
    ("prompt", [1.0], "must be a list of integers"),
    ("output", {"0": 4}, "must be a list of integers"),
    ("stop_token_ids", 3, "must be a list of integers"),
    ("arrival_step", "0", "must be an integer"),
    ("arrival_step", False, "must be an integer"),
    ("priority", 1.5, "must be an integer"),
    ("max_tokens", "2", "must be an integer or null"),
    ("eos_token_id", True, "must be an integer or null"),
    ("abort_step", 2.0, "must be an integer or null"),
    ("prompt_logprobs", "1", "must be an integer or null"),
    ("ignore_eos", "yes", "must be true or false"),
    ("ignore_eos", 0, "must be true or false"),
    ("cache_salt", 7, "must be a string or null"),
    ("drafts", "12", "must be a list of token lists"),
])
def test_request_wrong_type(key, value, rule):
    rejects(stream(requests=[req(**{key: value})]), rf"^requests\[0\] \(a\)\.{key}: {rule}$")


def test_draft_entry_wrong_type():
    data = stream(config={"num_speculative_tokens": 2}, requests=[req(drafts=[[4], 5])])
    rejects(data, r"^requests\[0\] \(a\)\.drafts\[1\]: must be a list of integers$")


@pytest.mark.parametrize("value", [5, "", None])
def test_request_id_must_be_non_empty_string(value):
    rejects(stream(requests=[req(id=value)]), r"^requests\[0\]\.id: must be a non-empty string$")


@pytest.mark.parametrize("key", ["id", "prompt", "output"])
def test_request_required_field_missing(key):
    r = req()
    del r[key]
    rejects(stream(requests=[r]), rf"^requests\[0\]\.{key}: required field is missing$")


def test_request_not_an_object():
    rejects(stream(requests=[["a", [1], [2]]]), r"^requests\[0\]: must be a JSON object$")


@pytest.mark.parametrize("key, value", [("name", 3), ("name", None), ("description", ["x"])])
def test_top_level_strings(key, value):
    rejects(stream(**{key: value}), rf"^{key}: must be a string$")


@pytest.mark.parametrize("value", ["3", [-1], [1, True], [1.0], {"0": 1}])
def test_reset_prefix_cache_steps_type(value):
    rejects(stream(reset_prefix_cache_steps=value),
            r"^reset_prefix_cache_steps: must be a list of integers >= 0$")


@pytest.mark.parametrize("data", [[], "stream", 3, None])
def test_stream_not_an_object(data):
    rejects(data, r"^stream: must be a JSON object$")


def test_requests_missing():
    rejects({"config": SMALL}, r"^requests: required field is missing$")


def test_requests_not_a_list():
    rejects(stream(requests={"a": req()}), r"^requests: must be a list$")


def test_requests_empty():
    rejects({"config": SMALL, "requests": []}, r"^requests: must hold at least one request$")


# ---------------------------------------------------------------------------
# Values out of range
# ---------------------------------------------------------------------------

SIZES = ["block_size", "num_gpu_blocks", "max_num_batched_tokens", "max_num_seqs",
         "max_model_len", "max_steps"]


@pytest.mark.parametrize("value", [0, -1])
@pytest.mark.parametrize("key", SIZES)
def test_sizes_must_be_positive(key, value):
    rejects(stream(config={key: value}), rf"^config\.{key}: must be > 0$")


@pytest.mark.parametrize("key", ["long_prefill_token_threshold", "num_speculative_tokens"])
def test_counts_must_not_be_negative(key):
    rejects(stream(config={key: -1}), rf"^config\.{key}: must be >= 0$")


def test_num_gpu_blocks_at_least_two():
    # max_model_len 4 fits one block, so only the null-block rule applies.
    data = stream(config={"num_gpu_blocks": 1, "max_model_len": 4}, requests=[req(prompt=[1])])
    rejects(data, r"^config\.num_gpu_blocks: must be >= 2 \(block 0 is the null block\)$")
    data["config"]["num_gpu_blocks"] = 2
    parse_stream(data)


def test_bad_policy():
    rejects(stream(config={"policy": "lifo"}), r'^config\.policy: must be "fcfs" or "priority"$')


def test_bad_speculative_method():
    rejects(stream(config={"speculative_method": "medusa"}),
            r'^config\.speculative_method: must be "ngram" or "eagle"$')


@pytest.mark.parametrize("model", ["no-such-model", "", "../models/qwen2.5-0.5b", "qwen2.5-0.5b/",
                                   "."])
def test_bad_model(model):
    rejects(stream(config={"model": model}), r"^config\.model: no model config at fixtures/models/")


@pytest.mark.parametrize("key, value, rule", [
    ("prompt", [], "must hold at least 1 token"),
    ("output", [], "must hold at least 1 token"),
    ("prompt", [1, -2], "token ids must be >= 0"),
    ("output", [-1], "token ids must be >= 0"),
    ("stop_token_ids", [-5], "token ids must be >= 0"),
    ("arrival_step", -1, "must be >= 0"),
    ("max_tokens", 0, "must be > 0"),
    ("max_tokens", -3, "must be > 0"),
    ("eos_token_id", -1, "must be >= 0"),
    ("prompt_logprobs", -1, "must be >= 0"),
])
def test_request_values_out_of_range(key, value, rule):
    rejects(stream(requests=[req(**{key: value})]), rf"^requests\[0\] \(a\)\.{key}: {rule}")


def test_duplicate_ids():
    data = stream(requests=[req("a"), req("b"), req("a")])
    rejects(data, r"^requests\[2\] \(a\)\.id: duplicate request id$")


# ---------------------------------------------------------------------------
# The output script must reach the point where the request stops
# ---------------------------------------------------------------------------

RUNS_OUT = r"^requests\[0\] \(a\)\.output: script has {have} token\(s\) but the request can only stop after {need} "


def test_script_runs_out_before_max_tokens():
    rejects(stream(requests=[req(output=[4, 5], max_tokens=5)]), RUNS_OUT.format(have=2, need=5))
    parse_stream(stream(requests=[req(output=[4, 5, 6, 7, 8], max_tokens=5)]))


def test_script_longer_than_max_tokens_is_fine():
    s = parse_stream(stream(requests=[req(output=[4, 5, 6, 7], max_tokens=2)]))
    assert s.requests[0].stop_index(32) == 1


def test_script_runs_out_eos_never_reached():
    data = stream(requests=[req(output=[4, 5, 6], max_tokens=10, eos_token_id=9)])
    rejects(data, RUNS_OUT.format(have=3, need=10))


def test_eos_in_script_stops_the_request():
    parse_stream(stream(requests=[req(output=[4, 9], max_tokens=10, eos_token_id=9)]))


def test_eos_ignored_script_runs_out():
    data = stream(requests=[req(output=[4, 9], max_tokens=10, eos_token_id=9, ignore_eos=True)])
    rejects(data, RUNS_OUT.format(have=2, need=10))


def test_stop_token_in_script_stops_the_request():
    parse_stream(stream(requests=[req(output=[4, 8, 6], max_tokens=10, stop_token_ids=[8])]))
    # Stop tokens apply even with ignore_eos.
    parse_stream(stream(requests=[req(output=[4, 8], max_tokens=10, stop_token_ids=[8],
                                      ignore_eos=True)]))


def test_script_runs_out_stop_token_never_reached():
    data = stream(requests=[req(output=[4, 5], max_tokens=10, stop_token_ids=[99])])
    rejects(data, RUNS_OUT.format(have=2, need=10))


def test_script_runs_out_before_max_model_len():
    # 30 prompt tokens, max_model_len 32: the request stops after 2 outputs.
    prompt = list(range(30))
    rejects(stream(requests=[req(prompt=prompt, output=[1], max_tokens=10)]),
            RUNS_OUT.format(have=1, need=2))
    parse_stream(stream(requests=[req(prompt=prompt, output=[1, 2], max_tokens=10)]))


def test_prompt_must_be_shorter_than_max_model_len():
    rejects(stream(requests=[req(prompt=list(range(32)))]),
            r"^requests\[0\] \(a\)\.prompt: length 32 must be < max_model_len \(32\)$")
    rejects(stream(requests=[req(prompt=list(range(40)))]),
            r"^requests\[0\] \(a\)\.prompt: length 40 must be < max_model_len \(32\)$")
    parse_stream(stream(requests=[req(prompt=list(range(31)), output=[1])]))


# ---------------------------------------------------------------------------
# Configs vLLM 0.11.0 refuses at start-up
# ---------------------------------------------------------------------------


def test_batched_tokens_below_max_num_seqs():
    rejects(stream(config={"max_num_batched_tokens": 3, "max_num_seqs": 4}),
            r"^config\.max_num_batched_tokens: must be >= max_num_seqs")
    parse_stream(stream(config={"max_num_batched_tokens": 4, "max_num_seqs": 4}))


def test_no_chunked_prefill_needs_max_model_len_budget():
    rejects(stream(config={"enable_chunked_prefill": False, "max_num_batched_tokens": 31}),
            r"^config\.max_num_batched_tokens: must be >= max_model_len when "
            r"enable_chunked_prefill is false")
    parse_stream(stream(config={"enable_chunked_prefill": False, "max_num_batched_tokens": 32}))
    # With chunked prefill on, a small budget is fine.
    parse_stream(stream(config={"enable_chunked_prefill": True, "max_num_batched_tokens": 4}))


@pytest.mark.parametrize("max_model_len, needed", [(32, 8), (30, 8), (29, 8), (28, 7)])
def test_pool_must_hold_one_max_model_len_request(max_model_len, needed):
    config = {"max_model_len": max_model_len, "num_gpu_blocks": needed - 1}
    rejects(stream(config=config),
            rf"^config\.num_gpu_blocks: must be >= ceil\(max_model_len / block_size\) = {needed},")
    parse_stream(stream(config={"max_model_len": max_model_len, "num_gpu_blocks": needed}))


# ---------------------------------------------------------------------------
# Aborts and drafts
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("arrival, abort", [(0, 0), (3, 3), (3, 1), (0, -1)])
def test_abort_step_after_arrival(arrival, abort):
    rejects(stream(requests=[req(arrival_step=arrival, abort_step=abort)]),
            r"^requests\[0\] \(a\)\.abort_step: must be > arrival_step$")


def test_abort_step_valid():
    s = parse_stream(stream(requests=[req(arrival_step=3, abort_step=4)]))
    assert s.requests[0].abort_step == 4


def test_drafts_need_speculative_decoding():
    rejects(stream(requests=[req(drafts=[[4]])]),
            r"^requests\[0\] \(a\)\.drafts: needs config\.num_speculative_tokens > 0$")


def test_draft_longer_than_num_speculative_tokens():
    data = stream(config={"num_speculative_tokens": 2}, requests=[req(drafts=[[4, 5], [1, 2, 3]])])
    rejects(data, r"^requests\[0\] \(a\)\.drafts\[1\]: at most num_speculative_tokens \(2\) tokens$")


def test_drafts_valid():
    data = stream(config={"num_speculative_tokens": 2}, requests=[req(drafts=[[4, 5], [], [7]])])
    assert parse_stream(data).requests[0].drafts == ((4, 5), (), (7,))


# ---------------------------------------------------------------------------
# Messages stay on one line
# ---------------------------------------------------------------------------


def test_id_with_newline_gives_one_line():
    data = stream(requests=[req(id="a\nb", output=[4], max_tokens=3)])
    msg = rejects(data, r"^requests\[0\] \(a\\nb\)\.output: script has 1 token")
    assert "a\\nb" in msg


def test_unknown_key_with_line_break_gives_one_line():
    rejects(stream(**{"x\r\ny": 1}), r"^x\\r\\ny: unknown field")


# ---------------------------------------------------------------------------
# Files
# ---------------------------------------------------------------------------


def test_load_stream_valid_file_name_defaults_to_stem(tmp_path):
    path = tmp_path / "my-stream.json"
    path.write_text(json.dumps(stream()))
    assert load_stream(path).name == "my-stream"
    path.write_text(json.dumps(stream(name="given")))
    assert load_stream(path).name == "given"


def test_load_stream_prefixes_the_path(tmp_path):
    path = tmp_path / "s.json"
    path.write_text(json.dumps(stream(config={"policy": "lifo"})))
    with pytest.raises(StreamError, match=r"s\.json: config\.policy: must be") as info:
        load_stream(path)
    assert str(info.value).startswith(str(path))


def test_invalid_json_file(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text('{"requests": [}\n')
    with pytest.raises(StreamError, match=r"bad\.json: not valid JSON: .* at line 1$"):
        load_stream(path)


def test_non_utf8_file(tmp_path):
    path = tmp_path / "bad.json"
    path.write_bytes(b'\xff\xfe{"requests": []}')
    with pytest.raises(StreamError, match=r"bad\.json: not valid JSON: not UTF-8"):
        load_stream(path)


def test_deeply_nested_json_file(tmp_path):
    path = tmp_path / "deep.json"
    path.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(StreamError, match=r"deep\.json: not valid JSON: nested too deeply$"):
        load_stream(path)


def test_missing_file(tmp_path):
    with pytest.raises(StreamError, match=r"nope\.json: cannot read: No such file"):
        load_stream(tmp_path / "nope.json")


def test_folder_is_not_a_stream_file(tmp_path):
    with pytest.raises(StreamError, match=r": cannot read: "):
        load_stream(tmp_path)


# ---------------------------------------------------------------------------
# Defaults, canonical form, hashing
# ---------------------------------------------------------------------------

MINIMAL = {"requests": [{"id": "a", "prompt": [1, 2], "output": [3, 4, 5]}]}


def test_defaults():
    s = parse_stream(copy.deepcopy(MINIMAL))
    assert s.config == Config()
    assert s.name == "" and s.description == "" and s.reset_prefix_cache_steps == ()
    r = s.requests[0]
    assert r.max_tokens is None and r.effective_max_tokens == 3
    assert r.eos_token_id is None and r.ignore_eos is False
    assert r.arrival_step == 0 and r.abort_step is None and r.priority == 0
    assert r.stop_token_ids == () and r.drafts == () and r.cache_salt is None
    assert r.prompt_logprobs is None
    assert not s.speculative


def test_to_json_makes_every_default_explicit():
    out = parse_stream(copy.deepcopy(MINIMAL)).to_json()
    assert set(out) == {"config", "requests"}
    assert out["config"] == {f.name: f.default for f in fields(Config)}
    assert set(out["requests"][0]) == {f.name for f in fields(RequestSpec)}
    assert out["requests"][0]["max_tokens"] is None
    assert out["requests"][0]["eos_token_id"] is None


def test_round_trip_is_identity():
    data = stream(config={"num_speculative_tokens": 2}, name="n", description="d",
                  reset_prefix_cache_steps=[5, 2, 5],
                  requests=[req(drafts=[[4, 5]], stop_token_ids=[9], cache_salt="s"),
                            req("b", arrival_step=1, abort_step=2, priority=-1)])
    s = parse_stream(data)
    assert s.reset_prefix_cache_steps == (2, 5)
    again = parse_stream(s.to_json())
    assert again == s
    assert again.canonical_bytes() == s.canonical_bytes()


def test_canonical_json_sorted_and_compact():
    assert canonical_json({"b": [1, 2], "a": {"d": 1, "c": None}}) == '{"a":{"c":null,"d":1},"b":[1,2]}'


def test_canonical_bytes_ignore_key_order_and_explicit_defaults():
    a = parse_stream({"requests": [{"id": "a", "prompt": [1], "output": [2]}],
                      "config": {"block_size": 16}})
    b = parse_stream({"config": {}, "requests": [{"output": [2], "prompt": [1], "id": "a",
                                                  "max_tokens": None, "priority": 0}]})
    assert a.canonical_bytes() == b.canonical_bytes()
    assert a.sha256() == b.sha256()


def test_sha256_is_hash_of_canonical_bytes():
    s = parse_stream(stream())
    assert s.sha256() == hashlib.sha256(s.canonical_bytes()).hexdigest()
    assert s.canonical_bytes() == canonical_json(s.to_json()).encode()


# Changing this value means the canonical form changed: every recorded trace's
# stream_sha256 changes with it, so re-record the golden traces.
MINIMAL_SHA256 = "d00e3a6126279cfc120b44f168bcff39e9a9b0ad5d9f4ef5cc2ffba2ea9c8ac5"


def test_sha256_stable_across_processes():
    code = ("import json,sys; from harness.stream import parse_stream; "
            "print(parse_stream(json.loads(sys.argv[1])).sha256())")
    here = parse_stream(copy.deepcopy(MINIMAL)).sha256()
    for seed in ("0", "12345"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        out = subprocess.run([sys.executable, "-c", code, json.dumps(MINIMAL)], env=env,
                             capture_output=True, text=True, check=True, cwd=ROOT)
        assert out.stdout.strip() == here


def test_sha256_pinned():
    assert parse_stream(copy.deepcopy(MINIMAL)).sha256() == MINIMAL_SHA256


# ---------------------------------------------------------------------------
# RequestSpec.stop_index
# ---------------------------------------------------------------------------


def spec(**kw) -> RequestSpec:
    kw.setdefault("id", "a")
    kw.setdefault("prompt", (1, 2, 3))
    kw.setdefault("output", (4, 5, 6, 7))
    return RequestSpec(**kw)


@pytest.mark.parametrize("kw, max_model_len, index", [
    ({}, 100, 3),                                           # max_tokens = len(output)
    ({"max_tokens": 2}, 100, 1),                            # max_tokens
    ({"max_tokens": 10}, 5, 1),                             # 3 prompt + 2 outputs = max_model_len
    ({"eos_token_id": 5}, 100, 1),                          # EOS
    ({"eos_token_id": 5, "ignore_eos": True}, 100, 3),      # EOS ignored
    ({"stop_token_ids": (6,)}, 100, 2),                     # stop token
    ({"stop_token_ids": (6,), "ignore_eos": True}, 100, 2), # stop token despite ignore_eos
    ({"stop_token_ids": (6,), "eos_token_id": 5}, 100, 1),  # the first one wins
    ({"stop_token_ids": (4,)}, 100, 0),                     # the first output token
    ({"eos_token_id": 7, "max_tokens": 2}, 100, 1),         # EOS past max_tokens: no effect
    ({"eos_token_id": 6}, 5, 1),                            # EOS past max_model_len: no effect
    ({"eos_token_id": 99, "max_tokens": 6}, 100, 5),        # past the script's end
])
def test_stop_index(kw, max_model_len, index):
    assert spec(**kw).stop_index(max_model_len) == index


# ---------------------------------------------------------------------------
# JSON Schema (docs/stream.schema.json)
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
        assert prop["default"] == f.default, f.name
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


# ---------------------------------------------------------------------------
# The CLI: bad input is exit 2, one line on stderr, nothing written
# ---------------------------------------------------------------------------

BAD_FILES = {
    "invalid-json": "{not json",
    "unknown-field": json.dumps(stream(confg={})),
    "bad-config": json.dumps(stream(config={"num_gpu_blocks": 3})),
    "runs-out": json.dumps(stream(requests=[req(max_tokens=9)])),
    "empty-requests": json.dumps({"requests": []}),
    "newline-id": json.dumps(stream(requests=[req(id="x\ny", drafts=[[1]])])),
}


def run_cli(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=120)


def assert_bad_input(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: ")
    assert "Traceback" not in proc.stderr
    assert proc.stdout == ""
    return lines[0]


@pytest.mark.parametrize("name", sorted(BAD_FILES))
def test_cli_trace_bad_stream(tmp_path, name):
    bad = tmp_path / f"{name}.json"
    bad.write_text(BAD_FILES[name])
    out = tmp_path / "out"
    line = assert_bad_input(run_cli(["trace", "--engine", "reference", str(bad), "-o", str(out)],
                                    cwd=tmp_path))
    assert f"{name}.json" in line
    assert not out.exists() or not any(out.iterdir())
    assert sorted(p.name for p in tmp_path.iterdir()) == [bad.name]


def test_cli_trace_missing_file(tmp_path):
    out = tmp_path / "out"
    line = assert_bad_input(run_cli(["trace", "--engine", "reference", "nope.json", "-o",
                                     str(out)], cwd=tmp_path))
    assert "nope.json" in line
    assert not out.exists()


def test_cli_one_bad_stream_stops_all(tmp_path):
    """A good stream before a bad one: nothing is traced, nothing written."""
    good = tmp_path / "a-good.json"
    good.write_text(json.dumps(stream()))
    bad = tmp_path / "b-bad.json"
    bad.write_text(BAD_FILES["bad-config"])
    out = tmp_path / "out"
    line = assert_bad_input(run_cli(["trace", "--engine", "reference", str(good), str(bad),
                                     "-o", str(out)], cwd=tmp_path))
    assert "b-bad.json: config.num_gpu_blocks" in line
    assert not out.exists() or not any(out.iterdir())


def test_cli_check_bad_stream(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(BAD_FILES["runs-out"])
    assert_bad_input(run_cli(["check", str(bad)], cwd=tmp_path))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.json"]


def test_bad_input_never_imports_vllm(tmp_path):
    """Validation, and the CLI's bad-input path, run without importing vLLM."""
    bad = tmp_path / "bad.json"
    bad.write_text(BAD_FILES["unknown-field"])
    code = ("import sys; from harness.cli import main; "
            "rc = main(['trace', '--engine', 'vllm', sys.argv[1]]); "
            "assert rc == 2, rc; assert 'vllm' not in sys.modules, 'vllm imported'")
    proc = subprocess.run([sys.executable, "-c", code, str(bad)], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.startswith("error: ")


# ---------------------------------------------------------------------------
# The examples in the docs are valid
# ---------------------------------------------------------------------------


def _json_blocks_after(doc: Path, heading: str) -> list:
    """The ```json code blocks of ``doc`` that come after ``heading``, parsed."""
    text = doc.read_text().split(heading, 1)[1]
    return [json.loads(block.split("```", 1)[0]) for block in text.split("```json\n")[1:]]


def test_stream_format_examples_are_valid():
    examples = _json_blocks_after(ROOT / "docs" / "stream-format.md", "\n## Example\n")
    assert len(examples) == 2
    for data in examples:
        parse_stream(data)


def test_trace_format_example_matches_its_stream():
    stream_data, trace = _json_blocks_after(ROOT / "docs" / "trace-format.md", "\n## Example\n")
    s = parse_stream(stream_data)
    assert trace["stream"] == s.to_json()
    assert trace["stream_sha256"] == s.sha256()
    assert [step["step"] for step in trace["steps"]] == list(range(len(trace["steps"])))
    for step in trace["steps"]:
        assert set(step) == {"step", *STEP_FIELDS}
