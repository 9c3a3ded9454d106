"""Stream validation: every rule a stream can break gives one StreamError whose
single-line message starts with the field path and states the rule.

These tests never import vLLM: they must pass where vLLM is not installed.
"""

from __future__ import annotations

import json

import pytest

from harness.formats.stream import Stream, StreamError, load_stream, parse_stream
from stream_builders import SMALL, rejects, req, stream


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
    rejects(stream(config={"blocksize": 16}), r"^config\.blocksize: unknown field \(allowed: async_ready_steps, "
                                                r"async_scheduling, block_size, ")


def test_unknown_request_field():
    rejects(stream(requests=[req(prio=1)]), r"^requests\[0\] \(a\)\.prio: unknown field \(allowed: ")


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
    label = "" if key == "id" else r" \(a\)"  # a request with an id is named by it
    rejects(stream(requests=[r]), rf"^requests\[0\]{label}\.{key}: required field is missing$")


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

SIZES = ["block_size", "max_num_batched_tokens", "max_num_seqs", "max_model_len", "max_steps"]


@pytest.mark.parametrize("value", [0, -1])
@pytest.mark.parametrize("key", SIZES)
def test_sizes_must_be_positive(key, value):
    rejects(stream(config={key: value}), rf"^config\.{key}: must be > 0$")


@pytest.mark.parametrize("key", ["long_prefill_token_threshold", "num_speculative_tokens"])
def test_counts_must_not_be_negative(key):
    rejects(stream(config={key: -1}), rf"^config\.{key}: must be >= 0$")


@pytest.mark.parametrize("value", [1, 0, -1])
def test_num_gpu_blocks_at_least_two(value):
    # max_model_len 4 fits one block, so only the null-block rule applies.
    data = stream(config={"num_gpu_blocks": value, "max_model_len": 4}, requests=[req(prompt=[1])])
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


def test_lora_needs_max_loras():
    rejects(stream(requests=[req(lora="sql")]),
            r"^requests\[0\] \(a\)\.lora: needs config\.max_loras \(vLLM refuses LoRA requests "
            r"when LoRA is not enabled\)$")


def test_max_loras_at_least_one():
    rejects(stream(config={"max_loras": 0}),
            r"^config\.max_loras: must be >= 1 \(vLLM LoRAConfig\)$")


def test_grammar_ready_before_arrival():
    rejects(stream(requests=[req(arrival_step=3, structured_output={"ready_step": 2})]),
            r"^requests\[0\] \(a\)\.structured_output\.ready_step: must be >= arrival_step")


def test_output_holds_a_token_the_grammar_rejects():
    rejects(stream(requests=[req(output=[5, 6, 7], structured_output={"rejected_tokens": [6]})]),
            r"^requests\[0\] \(a\)\.output: holds token\(s\) \[6\] that structured_output rejects")


def test_structured_output_unknown_field():
    rejects(stream(requests=[req(structured_output={"grammar": "json"})]),
            r"^requests\[0\] \(a\)\.structured_output\.grammar: unknown field")


MM = {"encoder_compute_budget": 4, "encoder_cache_size": 6}


def test_mm_inputs_need_an_encoder():
    rejects(stream(requests=[req(mm_inputs=[{"offset": 0, "length": 2, "hash": "cat"}])]),
            r"^requests\[0\] \(a\)\.mm_inputs: needs a model with an encoder")


def test_mm_input_outside_the_prompt():
    rejects(stream(config=MM, requests=[req(mm_inputs=[{"offset": 2, "length": 2, "hash": "c"}])]),
            r"^requests\[0\] \(a\)\.mm_inputs\[0\]: the placeholder must lie inside the prompt")


def test_mm_inputs_out_of_order():
    items = [{"offset": 1, "length": 2, "hash": "c"}, {"offset": 0, "length": 1, "hash": "d"}]
    rejects(stream(config=MM, requests=[req(prompt=[1, 2, 3, 4], mm_inputs=items)]),
            r"^requests\[0\] \(a\)\.mm_inputs\[1\]\.offset: placeholders must be in prompt order")


def test_mm_input_longer_than_the_models_largest_item():
    rejects(stream(config={**MM, "max_tokens_per_mm_item": 4}, requests=[req(
        prompt=[0] * 6, mm_inputs=[{"offset": 0, "length": 5, "hash": "c"}])]),
            r"^requests\[0\] \(a\)\.mm_inputs\[0\]\.length: must be <= "
            r"config\.max_tokens_per_mm_item \(4, the model's largest item\)$")


def test_mm_input_longer_than_the_configured_encoder_budget_is_taken():
    """vLLM raises the budget and the cache to the largest item: a longer item is fine."""
    parse_stream(stream(config=MM, requests=[req(prompt=[0] * 8, mm_inputs=[
        {"offset": 0, "length": 8, "hash": "c"}])]))


def test_any_encoder_size_makes_a_model_with_an_encoder():
    for field in ("max_tokens_per_mm_item", "encoder_compute_budget", "encoder_cache_size"):
        parse_stream(stream(config={field: 2}, requests=[req(mm_inputs=[
            {"offset": 0, "length": 2, "hash": "c"}])]))


def test_largest_item_longer_than_the_token_budget_without_chunking():
    data = stream(config={"max_tokens_per_mm_item": 40, "disable_chunked_mm_input": True})
    data["config"]["max_num_batched_tokens"] = 32
    rejects(data, r"^config\.max_tokens_per_mm_item: must be <= max_num_batched_tokens when "
                  r"disable_chunked_mm_input is true")


def test_mm_input_longer_than_the_token_budget_without_chunking():
    config = {**MM, "encoder_compute_budget": 64, "encoder_cache_size": 64,
              "disable_chunked_mm_input": True, "max_num_batched_tokens": 64}
    data = stream(config=config, requests=[req(prompt=[0] * 70, mm_inputs=[
        {"offset": 0, "length": 64, "hash": "c"}])])
    data["config"]["max_num_batched_tokens"] = 64
    data["config"]["max_model_len"] = 128
    data["config"]["num_gpu_blocks"] = 128
    parse_stream(data)  # 64 fits a 64-token budget
    data["config"]["max_num_batched_tokens"] = 32
    data["config"]["enable_chunked_prefill"] = True
    rejects(data, r"mm_inputs\[0\]\.length: must be <= max_num_batched_tokens when "
                  r"disable_chunked_mm_input is true")


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
# Every error of a stream at once
# ---------------------------------------------------------------------------


def test_every_error_is_reported_at_once():
    data = stream(config={"block_size": "16", "policy": "lifo", "max_steps": 0},
                  requests=[req(prompt=[1, -2]), req("b", output="x", extra=1), {"id": "c"}])
    with pytest.raises(StreamError) as info:
        parse_stream(data)
    assert info.value.errors == [
        "config.block_size: must be an integer",
        "config.max_steps: must be > 0",
        'config.policy: must be "fcfs" or "priority"',
        "requests[0] (a).prompt: token ids must be >= 0",
        "requests[1] (b).extra: unknown field (allowed: abort_step, arrival_step, cache_salt, "
        "drafts, eos_token_id, id, ignore_eos, kv_transfer, lora, max_tokens, mm_inputs, "
        "output, pooling, priority, prompt, prompt_logprobs, stop_token_ids, "
        "structured_output)",
        "requests[1] (b).output: must be a list of integers",
        "requests[2] (c).output: required field is missing",
        "requests[2] (c).prompt: required field is missing",
    ]
    assert str(info.value).count("\n") == len(info.value.errors) - 1


def test_cross_field_errors_are_reported_together():
    data = stream(config={"max_num_batched_tokens": 3, "max_num_seqs": 4},
                  requests=[req(), req(), req("b", abort_step=1, arrival_step=2)])
    with pytest.raises(StreamError) as info:
        parse_stream(data)
    assert [e.split(":")[0] for e in info.value.errors] == [
        "config.max_num_batched_tokens", "requests[1] (a).id", "requests[2] (b).abort_step"]


def test_duplicated_json_keys_are_an_error(tmp_path):
    path = tmp_path / "dup.json"
    path.write_text('{"requests": [{"id": "a", "prompt": [1], "output": [2], "prompt": [3]}]}')
    with pytest.raises(StreamError, match=r"^.*dup\.json: not valid JSON: key 'prompt' appears "
                                          r"twice in one object$"):
        load_stream(path)


# ---------------------------------------------------------------------------
# Bounds: every size has an upper limit, from the schema
# ---------------------------------------------------------------------------

M = 1 << 20

BOUNDS = [  # (stream, field, rule)
    (stream(config={"num_gpu_blocks": M + 1}), "config.num_gpu_blocks", f"must be <= {M:,}"),
    (stream(config={"block_size": 1025}), "config.block_size", "must be <= 1,024"),
    (stream(config={"max_num_batched_tokens": M + 1}), "config.max_num_batched_tokens",
     f"must be <= {M:,}"),
    (stream(config={"max_num_seqs": 1025}), "config.max_num_seqs", "must be <= 1,024"),
    (stream(config={"max_model_len": M + 1}), "config.max_model_len", f"must be <= {M:,}"),
    (stream(config={"long_prefill_token_threshold": M + 1}),
     "config.long_prefill_token_threshold", f"must be <= {M:,}"),
    (stream(config={"num_speculative_tokens": 65}), "config.num_speculative_tokens",
     "must be <= 64"),
    (stream(config={"max_steps": 10 ** 12}), "config.max_steps", "must be <= 100,000"),
    (stream(config={"model": "m" * 129}), "config.model", "must be at most 128 characters"),
    (stream(requests=[req(str(i)) for i in range(4097)]), "requests",
     "must hold at most 4,096 item(s)"),
    (stream(requests=[req(prompt=[2 ** 31])]), "requests[0] (a).prompt",
     "token ids must be < 2**31"),
    (stream(requests=[req(output=[1] * (M + 1))]), "requests[0] (a).output",
     f"must hold at most {M:,} item(s)"),
    (stream(requests=[req(arrival_step=100_001)]), "requests[0] (a).arrival_step",
     "must be <= 100,000"),
    (stream(requests=[req(abort_step=10 ** 9)]), "requests[0] (a).abort_step", "must be <= 100,000"),
    (stream(requests=[req(max_tokens=M + 1)]), "requests[0] (a).max_tokens", f"must be <= {M:,}"),
    (stream(requests=[req(priority=2 ** 31)]), "requests[0] (a).priority",
     "must be <= 2,147,483,647"),
    (stream(requests=[req(priority=-2 ** 31 - 1)]), "requests[0] (a).priority",
     "must be >= -2147483648"),
    (stream(requests=[req(stop_token_ids=list(range(257)))]), "requests[0] (a).stop_token_ids",
     "must hold at most 256 item(s)"),
    (stream(requests=[req(id="x" * 257)]), "requests[0]", None),  # id too long: named by index
    (stream(requests=[req(cache_salt="s" * 1025)]), "requests[0] (a).cache_salt",
     "must be at most 1,024 characters"),
    (stream(requests=[req(prompt_logprobs=21)]), "requests[0] (a).prompt_logprobs",
     "must be <= 20"),
    (stream(reset_prefix_cache_steps=list(range(10_001))), "reset_prefix_cache_steps",
     "must hold at most 10,000 item(s)"),
    (stream(description="d" * 10_001), "description", "must be at most 10,000 characters"),
]


@pytest.mark.parametrize("data, field, rule", BOUNDS, ids=[f"{b[1]}" for b in BOUNDS])
def test_every_size_is_bounded(data, field, rule):
    with pytest.raises(StreamError) as info:
        parse_stream(data)
    (line,) = info.value.errors
    assert line.startswith(field)
    if rule:
        assert line.endswith(f": {rule}")


def test_total_tokens_are_bounded():
    big = [1] * 30_000
    data = stream(config={"max_model_len": 32_768, "num_gpu_blocks": 9000},
                  requests=[req(str(i), prompt=big, output=big) for i in range(70)])
    rejects(data, r"^requests: 4,200,000 tokens in all \(prompts, outputs, drafts\); "
                  r"at most 4,000,000$")


def test_file_size_is_bounded(tmp_path):
    path = tmp_path / "huge.json"
    with path.open("wb") as f:
        f.truncate((64 << 20) + 1)  # sparse: nothing is written
    with pytest.raises(StreamError, match=r"huge\.json: file is larger than 64 MiB$"):
        load_stream(path)


# ---------------------------------------------------------------------------
# Names: they become file names
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["../../escape", "a/b", "..", ".hidden", "-x", "a b", "x" * 129,
                                  "C:\\\\evil", "é"])
def test_name_cannot_leave_a_folder(name):
    rejects(stream(name=name), r"^name: must be 1-128 characters of letters, digits")


def test_default_name_comes_from_the_file_name_made_safe(tmp_path):
    path = tmp_path / "my stream (v2).json"
    path.write_text(json.dumps(stream()))
    assert load_stream(path).name == "my_stream__v2_"
    dot = tmp_path / ".json"  # a dot file: its stem is ".json"
    dot.write_text(json.dumps(stream()))
    assert load_stream(dot).name == "_json"


# ---------------------------------------------------------------------------
# KV cache groups (hybrid models)
# ---------------------------------------------------------------------------

SW = {"type": "sliding_window", "sliding_window": 8}
CL = {"type": "chunked_local", "attention_chunk_size": 8}
FULL = {"type": "full"}
MAMBA = {"type": "mamba"}


def groups(*gs, **config) -> dict:
    return stream({**SMALL, "num_gpu_blocks": 64, "kv_cache_groups": list(gs), **config})


def test_hybrid_groups_parse():
    s = parse_stream(groups(FULL, SW, SW))
    assert [g.type for g in s.config.groups] == ["full", "sliding_window", "sliding_window"]


@pytest.mark.parametrize("data,match", [
    (groups({"type": "sliding_window"}),
     r"^config\.kv_cache_groups\[0\]\.sliding_window: required for type sliding_window$"),
    (groups({"type": "chunked_local"}),
     r"^config\.kv_cache_groups\[0\]\.attention_chunk_size: required for type chunked_local$"),
    (groups({"type": "full", "sliding_window": 4}),
     r"^config\.kv_cache_groups\[0\]\.sliding_window: only for type sliding_window$"),
    (groups({"type": "mamba", "attention_chunk_size": 4}, enable_prefix_caching=False),
     r"^config\.kv_cache_groups\[0\]\.attention_chunk_size: only for type chunked_local$"),
    (groups({"type": "linear"}), r"^config\.kv_cache_groups\[0\]\.type: must be \"full\" or"),
    (groups({"type": "sliding_window", "sliding_window": 0}),
     r"^config\.kv_cache_groups\[0\]\.sliding_window: must be > 0$"),
    (groups(), r"^config\.kv_cache_groups: must hold at least 1 item"),
    (groups(FULL, MAMBA), r"^config\.enable_prefix_caching: must be false with a mamba group"),
    (groups(FULL, CL, num_speculative_tokens=2, speculative_method="eagle"),
     r"^config\.speculative_method: eagle cannot be used with a chunked_local group"),
    (groups(FULL, SW, FULL), r"^config\.kv_cache_groups: with prefix caching on, the "
                             r"full-attention groups must all come before or all after"),
    (groups(FULL, SW, CL), r"^config\.kv_cache_groups: with prefix caching on, the groups that "
                           r"are not full attention must all have the same type and parameter"),
    (groups(FULL, SW, {"type": "sliding_window", "sliding_window": 9}),
     r"the groups that are not full attention must all have the same type"),
    (groups(SW, SW), r"^config\.kv_cache_groups: with prefix caching on, several groups must be "
                     r"full attention plus one other type"),
    (groups(FULL, FULL), r"several groups must be full attention plus one other type"),
    (groups(FULL, SW, num_gpu_blocks=14),
     r"^config\.num_gpu_blocks: must be >= 15, the pages one max_model_len request can hold in "
     r"all KV cache groups together"),
])
def test_bad_kv_cache_groups(data, match):
    rejects(data, match)


@pytest.mark.parametrize("gs", [(FULL, SW, FULL), (SW, SW), (FULL, SW, CL, MAMBA), (MAMBA,)])
def test_any_mix_of_groups_without_prefix_caching(gs):
    parse_stream(groups(*gs, enable_prefix_caching=False))


def test_pool_of_every_group_type():
    # max_model_len 32, pages of 4, budget 16: full 8; window 8: ceil(min(7 + 16, 32) / 4) + 1
    # = 7; chunk 8: ceil(min(8 + 16, 32) / 4) = 6; mamba 1.
    parse_stream(groups(FULL, SW, CL, MAMBA, enable_prefix_caching=False, num_gpu_blocks=22))
    rejects(groups(FULL, SW, CL, MAMBA, enable_prefix_caching=False, num_gpu_blocks=21),
            r"^config\.num_gpu_blocks: must be >= 22,")


# ---------------------------------------------------------------------------
# Pooling requests
# ---------------------------------------------------------------------------


def test_pooling_requests_valid():
    data = stream(requests=[req(output=[], pooling=True), req("b", output=[], pooling=True)])
    assert [r.pooling for r in parse_stream(data).requests] == [True, True]


def test_pooling_request_with_output():
    rejects(stream(requests=[req(output=[4], pooling=True)]),
            r"^requests\[0\] \(a\)\.output: must be empty for a pooling request")


@pytest.mark.parametrize("field,value", [("max_tokens", 2), ("eos_token_id", 3),
                                         ("stop_token_ids", [3]), ("ignore_eos", True),
                                         ("prompt_logprobs", 1),
                                         ("structured_output", {"ready_step": 0})])
def test_pooling_request_with_a_sampling_parameter(field, value):
    rejects(stream(requests=[req(output=[], pooling=True, **{field: value})]),
            rf"^requests\[0\] \(a\)\.{field}: a pooling request has no sampling parameters$")


def test_pooling_and_generating_requests_do_not_mix():
    rejects(stream(requests=[req(output=[], pooling=True), req("b")]),
            r"^requests\[1\] \(b\)\.pooling: every request of a stream must pool or none")


def test_pooling_without_drafts():
    rejects(stream(config={"num_speculative_tokens": 1},
                   requests=[req(output=[], pooling=True)]),
            r"^config\.num_speculative_tokens: must be 0 for pooling requests")


# -- KV cache events and the KV connector ---------------------------------------------------

HYBRID = [{"type": "full"}, {"type": "sliding_window", "sliding_window": 8}]


def test_kv_events_and_connector_need_a_single_group():
    rejects(stream(config={"kv_cache_events": True, "kv_cache_groups": HYBRID}),
            r"^config\.kv_cache_events: needs a single KV cache group")
    rejects(stream(config={"kv_role": "kv_both", "kv_cache_groups": HYBRID}),
            r"^config\.kv_role: a KV connector needs a single KV cache group")
    rejects(stream(config={"kv_role": "kv_sender"}), r"^config\.kv_role: ")


def test_kv_transfer_rules():
    rejects(stream(requests=[req(kv_transfer={"external_tokens": 1})]),
            r"^requests\[0\] \(a\)\.kv_transfer: needs config\.kv_role")
    rejects(stream(config={"kv_role": "kv_producer"},
                   requests=[req(kv_transfer={"external_tokens": 1})]),
            r"\.kv_transfer\.external_tokens: a kv_producer loads nothing")
    rejects(stream(config={"kv_role": "kv_consumer"},
                   requests=[req(kv_transfer={"send_steps": 1})]),
            r"\.kv_transfer\.send_steps: a kv_consumer sends nothing")
    rejects(stream(config={"kv_role": "kv_both"},
                   requests=[req(prompt=[1, 2], kv_transfer={"external_tokens": 3})]),
            r"\.kv_transfer\.external_tokens: must be <= the prompt's length \(2\)")
    rejects(stream(config={"kv_role": "kv_both"},
                   requests=[req(kv_transfer={"send_steps": 0})]),
            r"\.kv_transfer\.send_steps: ")
    parse_stream(stream(config={"kv_role": "kv_both"}, requests=[req(kv_transfer={
        "external_tokens": 1, "load_async": True, "load_steps": 2, "unknown_lookups": 1,
        "send_steps": 3})]))


# -- async scheduling ------------------------------------------------------------------------

def test_async_scheduling_rules():
    rejects(stream(config={"async_scheduling": True, "num_speculative_tokens": 2}),
            r"^config\.async_scheduling: not with speculative decoding \(vLLM 0\.11\.0 refuses")
    rejects(stream(config={"async_scheduling": True, "kv_role": "kv_both"}),
            r"^config\.async_scheduling: not with a KV connector")
    rejects(stream(config={"async_ready_steps": [1]}),
            r"^config\.async_ready_steps: needs async_scheduling or pipeline_parallel_size > 1$")
    rejects(stream(config={"async_scheduling": True, "async_ready_steps": [-1]}),
            r"^config\.async_ready_steps: must be a list of integers >= 0")
    ok = parse_stream(stream(config={"async_scheduling": True, "async_ready_steps": [3, 1, 3]}))
    assert ok.config.async_ready_steps == (1, 3)
    assert ok.to_json()["config"]["async_ready_steps"] == [1, 3]


def test_pipeline_parallel_rules():
    rejects(stream(config={"pipeline_parallel_size": 2, "async_scheduling": True}),
            r"^config\.pipeline_parallel_size: not with async_scheduling \(vLLM 0\.11\.0 refuses")
    rejects(stream(config={"pipeline_parallel_size": 2, "num_speculative_tokens": 1}),
            r"^config\.pipeline_parallel_size: not with speculative decoding nor a KV connector")
    memory = stream(config={"pipeline_parallel_size": 2, "kv_cache_memory_bytes": 10 ** 8})
    del memory["config"]["num_gpu_blocks"]
    rejects(memory, r"^config\.pipeline_parallel_size: not with kv_cache_memory_bytes")
    rejects(stream(config={"pipeline_parallel_size": 0}),
            r"^config\.pipeline_parallel_size: must be an integer from 1 to 8$")
    ok = parse_stream(stream(config={"pipeline_parallel_size": 3, "async_ready_steps": [2]}))
    assert ok.config.pipeline_parallel_size == 3 and ok.config.async_ready_steps == (2,)
    assert ok.to_json()["config"]["pipeline_parallel_size"] == 3
    assert "pipeline_parallel_size" not in parse_stream(stream()).to_json()["config"]


# -- the pool from memory ----------------------------------------------------------------------

#: Qwen2.5-0.5B (the default model): 24 layers x 512 B per token and layer, 16-token pages.
PAGE_16 = 24 * 512 * 16


def test_pool_from_memory_is_what_start_up_makes_of_it():
    base = {k: v for k, v in SMALL.items() if k != "num_gpu_blocks"}
    s = parse_stream({"config": {**base, "block_size": 16, "max_model_len": 64,
                                 "kv_cache_memory_bytes": 10 * PAGE_16 + 5}, "requests": [req()]})
    assert s.config.num_gpu_blocks == 10
    assert "num_gpu_blocks" not in s.to_json()["config"]
    assert parse_stream(s.to_json()).config.num_gpu_blocks == 10  # the canonical form re-parses


def test_pool_from_memory_rules():
    base = {k: v for k, v in SMALL.items() if k != "num_gpu_blocks"}
    data = {"config": {**base, "block_size": 16, "max_model_len": 64}, "requests": [req()]}
    rejects({**data, "config": {**data["config"], "kv_cache_memory_bytes": 4 * PAGE_16,
                                "num_gpu_blocks": 4}},
            r"^config\.num_gpu_blocks: not with kv_cache_memory_bytes")
    rejects({**data, "config": {**data["config"], "kv_cache_memory_bytes": 0}},
            r"^config\.kv_cache_memory_bytes: must be >= 1 byte")
    rejects({**data, "config": {**data["config"], "kv_cache_memory_bytes": PAGE_16 << 22}},
            r"^config\.kv_cache_memory_bytes: makes 4194304 pages, more than the 1048576")
    rejects({**data, "config": {**data["config"], "kv_cache_memory_bytes": 8 * PAGE_16,
                                "kv_cache_groups": [{"type": "full"}]}},
            r"^config\.kv_cache_memory_bytes: not with kv_cache_groups")


def test_a_memory_too_small_for_one_request_is_left_to_the_engines_start_up():
    """Whether the memory holds one max_model_len request is vLLM's start-up check, which
    each engine applies with its own sizing (tests/test_kv_sizing_conformance.py runs
    both); validation does not ask the reference's sizing."""
    base = {k: v for k, v in SMALL.items() if k != "num_gpu_blocks"}
    s = parse_stream({"config": {**base, "block_size": 16, "max_model_len": 64,
                                 "kv_cache_memory_bytes": 4 * PAGE_16 - 1},
                      "requests": [req()]})
    assert s.config.kv_cache_memory_bytes == 4 * PAGE_16 - 1
    assert s.config.num_gpu_blocks == 3  # an estimate for reading; the engines size their own


def test_a_drawn_stream_is_held_to_every_cross_field_rule():
    """parse_drawn_stream (the strategies' data) skips only the schema's walk."""
    from harness.formats.stream import parse_drawn_stream
    with pytest.raises(StreamError, match=r"prompt: length 32 must be < max_model_len \(32\)"):
        parse_drawn_stream(stream(requests=[req(prompt=list(range(32)))]))
    data = stream(requests=[req(prompt=list(range(31)), output=[1])])
    assert parse_drawn_stream(data) == parse_stream(data)
