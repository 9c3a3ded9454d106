"""Stream format: defaults, the canonical form and its hash, and where a request stops."""

from __future__ import annotations

import copy
import hashlib
import json
import os
import subprocess
import sys
from dataclasses import fields

import pytest

from harness.formats.paths import ROOT
from harness.formats.stream import OPTIONAL_CONFIG_FIELDS, OPTIONAL_REQUEST_FIELDS, Config, RequestSpec, canonical_json, parse_stream
from stream_builders import MINIMAL, req, stream


# ---------------------------------------------------------------------------
# Defaults, canonical form, hashing
# ---------------------------------------------------------------------------


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
    # Every field but the optional features' fields, which are written only when given
    # (old streams keep their bytes and hashes).
    assert out["config"] == {f.name: f.default for f in fields(Config)
                             if f.name not in OPTIONAL_CONFIG_FIELDS}
    assert set(out["requests"][0]) == {f.name for f in fields(RequestSpec)} - set(
        OPTIONAL_REQUEST_FIELDS)
    assert set(OPTIONAL_CONFIG_FIELDS) == {"kv_cache_groups", "max_loras", "encoder_compute_budget",
                                           "encoder_cache_size", "max_tokens_per_mm_item",
                                           "disable_chunked_mm_input", "log_stats",
                                           "kv_cache_events", "kv_role", "async_scheduling",
                                           "async_ready_steps", "kv_cache_memory_bytes",
                                           "pipeline_parallel_size"}
    assert out["requests"][0]["max_tokens"] is None
    assert out["requests"][0]["eos_token_id"] is None


def test_optional_features_are_written_when_given():
    data = copy.deepcopy(MINIMAL)
    data["config"] = {"max_loras": 2}
    data["config"].update(encoder_compute_budget=4, encoder_cache_size=4,
                          disable_chunked_mm_input=True)
    data["requests"][0].update(lora="sql", structured_output={"rejected_tokens": [9]},
                               mm_inputs=[{"offset": 0, "length": 2, "hash": "cat"}])
    out = parse_stream(data).to_json()
    assert out["config"]["disable_chunked_mm_input"] is True
    assert out["requests"][0]["mm_inputs"] == [{"offset": 0, "length": 2, "hash": "cat"}]
    assert out["config"]["max_loras"] == 2
    assert out["requests"][0]["lora"] == "sql"
    # ready_step defaults to the arrival step, written explicitly.
    assert out["requests"][0]["structured_output"] == {"ready_step": 0, "rejected_tokens": [9]}
    assert parse_stream(out).to_json() == out


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
    code = ("import json,sys; from harness.formats.stream import parse_stream; "
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


def test_kv_cache_groups_are_written_when_given_with_their_parameter_only():
    data = copy.deepcopy(MINIMAL)
    data["config"] = {"kv_cache_groups": [{"type": "full"},
                                          {"type": "sliding_window", "sliding_window": 8}]}
    out = parse_stream(data).to_json()
    assert out["config"]["kv_cache_groups"] == [{"type": "full"},
                                                {"type": "sliding_window", "sliding_window": 8}]
    assert parse_stream(out).to_json() == out
    assert parse_stream(copy.deepcopy(MINIMAL)).sha256() != parse_stream(data).sha256()
