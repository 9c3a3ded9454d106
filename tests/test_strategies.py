"""The stream strategies of harness/checks/strategies.py: always valid, and able to reach every rule.

Two kinds of tests, as Hypothesis tests its own strategies:

* validity -- many examples of every strategy parse with ``parse_stream``,
  are plain JSON, and no health check fires;
* quality -- each strategy *can* produce a stream that makes the scheduler
  preempt, evict, hit the prefix cache after a preemption, reject drafts,
  abort requests in every state, chunk a prefill and stop by every rule.
  Whether a rule was reached is read off a run of the clean-room reference
  (fast, no vLLM); these tests do not judge whether the reference is right.

Nothing here needs vLLM.
"""

from __future__ import annotations

import json
import re
from typing import Any, Callable

import pytest
import hypothesis
from hypothesis import Phase, find, given, seed, settings
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

from harness.checks import strategies as S
from harness.engines import get_engine
from harness.checks.properties import PROPERTIES
from harness.loop.runner import run
from harness.formats.stream import (OPTIONAL_CONFIG_FIELDS, Config, Stream, parse_drawn_stream,
                            parse_stream)

pytestmark = pytest.mark.selftest
from harness.formats.trace import Trace

# Every property's strategy (harness.checks.properties), plus the general one.
STRATEGIES: dict[str, Callable[[], st.SearchStrategy]] = {
    "streams": S.streams, **{p.strategy.__name__: p.strategy for p in PROPERTIES}}

# Explicit settings: the conftest profiles suppress some health checks; these
# tests must show that the strategies pass all of them.
VALIDITY = settings(max_examples=80, deadline=None, database=None, suppress_health_check=())
# Quality: generate only (no shrinking of the stream found), stop at the first hit.
QUALITY = settings(max_examples=1500, deadline=None, database=None, phases=[Phase.generate])


# ---------------------------------------------------------------------------
# Validity
# ---------------------------------------------------------------------------

def check_stream_dict(data: dict[str, Any], real: bool = False) -> Stream:
    """Every property a generated stream dict must have; returns the parsed stream.
    ``real``: a window of a real trace, whose tokens, arrivals and step limit come from
    the trace (harness.checks.strategies.real_workloads.real_workload_streams), so only validity is checked."""
    assert json.loads(json.dumps(data)) == data, "not plain JSON"
    stream = parse_stream(data)
    # The conformance tests, campaigns and rule report parse drawn streams without the
    # schema's walk: the whole parse must give the same stream.
    assert parse_drawn_stream(data) == stream
    ids = [r["id"] for r in data["requests"]]
    assert len(set(ids)) == len(ids) and all(re.fullmatch(r"r\d{1,3}", i) for i in ids)
    if real:
        return stream
    arrivals = [r.arrival_step for r in stream.requests]
    # An async or pipeline stream's follow-up request arrives after the others are likely done.
    queued = stream.config.async_scheduling or stream.config.pipeline_parallel_size > 1
    last = arrivals[-2] if queued and len(arrivals) > 1 else arrivals[-1]
    assert arrivals == sorted(arrivals) and last <= 10 and arrivals[-1] <= 80
    for r in stream.requests:
        tokens = [*r.prompt, *r.output, *r.stop_token_ids, *(t for d in r.drafts for t in d)]
        assert all(0 <= t < S.DEFAULT_VOCAB_SIZE for t in tokens)
        if r.eos_token_id is not None:
            assert r.eos_token_id < S.DEFAULT_VOCAB_SIZE
    assert stream.config.max_steps in (S.DEFAULT_MAX_STEPS, 1000)
    # 1: priority_victim_window_streams, where pages of one token let a short grant
    # leave a page behind the window.
    assert stream.config.block_size in (1, 2, 4, 8, 16)
    return stream


@pytest.mark.parametrize("name", sorted(STRATEGIES))
@VALIDITY
@given(data=st.data())
def test_strategy_generates_valid_streams(name, data):
    check_stream_dict(data.draw(STRATEGIES[name](), label=name),
                      real=name == "real_workload_streams")


@VALIDITY
@given(config=S.configs())
def test_configs_are_valid(config):
    parse_stream({"config": config, "requests": [{"id": "a", "prompt": [1], "output": [2],
                                                  "max_tokens": 1}]})
    # Every field but the optional features' (groups, LoRA, the encoder), drawn only when
    # asked; one config in eight gives its pool as memory instead of num_gpu_blocks.
    fields = set(Config.__dataclass_fields__) - set(OPTIONAL_CONFIG_FIELDS)
    if "kv_cache_memory_bytes" in config:
        fields = fields - {"num_gpu_blocks"} | {"kv_cache_memory_bytes"}
    assert set(config) == fields


@VALIDITY
@given(config=S.configs(hybrid=True))
def test_hybrid_configs_are_valid(config):
    parse_stream({"config": config, "requests": [{"id": "a", "prompt": [1], "output": [2],
                                                  "max_tokens": 1}]})
    assert set(config) == set(Config.__dataclass_fields__) - set(OPTIONAL_CONFIG_FIELDS) | {
        "kv_cache_groups"}
    assert 1 <= len(config["kv_cache_groups"]) <= 5


@settings(VALIDITY, max_examples=30)
@given(config=S.configs(block_size=8, policy="priority", max_model_len=st.integers(40, 48),
                        enable_chunked_prefill=False))
def test_config_overrides_are_used_as_given(config):
    assert config["block_size"] == 8 and config["policy"] == "priority"
    assert 40 <= config["max_model_len"] <= 48
    assert config["max_num_batched_tokens"] >= config["max_model_len"]  # chunked off
    pool = parse_stream({"config": config, "requests": [
        {"id": "a", "prompt": [1], "output": [2], "max_tokens": 1}]}).config.num_gpu_blocks
    assert pool >= -(-config["max_model_len"] // 8)  # given, or computed from memory


def test_contradictory_config_overrides_are_rejected():
    @settings(max_examples=5, database=None)
    @given(S.configs(enable_chunked_prefill=False, max_model_len=32, max_num_batched_tokens=8))
    def draw_one(config):
        pass

    with pytest.raises(InvalidArgument, match="max_num_batched_tokens"):
        draw_one()
    # A pinned field outside the schema's bounds (the schema's walk covers pinned fields).
    with pytest.raises(InvalidArgument, match=r"config\.enable_prefix_caching: .*true or false"):
        given(S.configs(enable_prefix_caching="yes"))(lambda c: None)()
    with pytest.raises(InvalidArgument, match="unknown field"):
        given(S.configs(blocksize=4))(lambda c: None)()


@settings(VALIDITY, max_examples=40)
@given(data=S.streams(config=S.configs(num_speculative_tokens=2), shared_prefixes=False,
                      stop_modes=("script_end",), aborts=False, priorities=False,
                      cache_salts=False, prompt_logprobs=False, resets=False, drafts=False,
                      stats=False, kv_events=False, kv_connector=False))
def test_knobs_switch_features_off(data):
    check_stream_dict(data)
    assert "reset_prefix_cache_steps" not in data
    assert not {"log_stats", "kv_cache_events", "kv_role"} & set(data["config"])
    for r in data["requests"]:
        assert set(r) <= {"id", "prompt", "output", "arrival_step", "eos_token_id",
                          "stop_token_ids"}


@settings(VALIDITY, max_examples=40)
@given(data=S.spec_decode_streams())
def test_drafts_fit_num_speculative_tokens(data):
    stream = check_stream_dict(data)
    k = stream.config.num_speculative_tokens
    assert 1 <= k <= 4
    assert all(len(d) <= k for r in stream.requests for d in r.drafts)


# ---------------------------------------------------------------------------
# Quality: which rules a stream reaches, read off a reference run
# ---------------------------------------------------------------------------

def reference_trace(data: dict[str, Any]) -> tuple[Stream, Trace]:
    stream = parse_stream(data)
    return stream, run(get_engine("reference"), stream)


def rules_reached(data: dict[str, Any]) -> set[str]:
    """Names of the scheduler rules that the reference's run of ``data`` reached."""
    stream, trace = reference_trace(data)
    config, by_id = stream.config, {r.id: r for r in stream.requests}
    reached: set[str] = set()
    preempted_at: dict[str, int] = {}  # first step each request was preempted
    final: dict[str, str] = {}
    records = {rec["step"]: rec for rec in trace.steps}
    for rec in trace.steps:
        step = rec["step"]
        if rec["preempted"]:
            reached.add(f"preempt_{config.policy}")
        if rec["evicted"]:
            reached.add("evict")
        for rid, hit in rec["prefix_hit_tokens"].items():
            if hit > 0 and preempted_at.get(rid, step) < step:
                reached.add("prefix_hit_after_preemption")
        for rid, drafts in rec["spec_tokens"].items():
            emitted = rec["emitted"].get(rid)
            # A rejection: fewer than all drafts + 1 bonus token, and a mismatch.
            if drafts and emitted is not None and len(emitted) <= len(drafts) \
                    and emitted != drafts[:len(emitted)]:
                reached.add("draft_rejection")
        for rid, n in rec["scheduled"]:
            if rid not in preempted_at and rec["computed_before"][rid] + n < len(by_id[rid].prompt):
                reached.add("chunked_prefill")
        for rid, groups in rec["new_block_ids"].items():
            if len(groups) > 1 and rec["prefix_hit_tokens"].get(rid, 0) > 0 \
                    and any(0 in g for g in groups):
                reached.add("hybrid_hit_with_null_pages")
        for rid in rec.get("set_aside", ()):
            if by_id[rid].lora is not None and config.enable_chunked_prefill \
                    and rec["status"].get(rid) != "WAITING_FOR_FSM":
                reached.add("lora_set_aside")
        if "WAITING_FOR_FSM" in rec["status"].values():
            reached.add("grammar_wait")
        for rid, n in rec["scheduled"]:
            r = by_id[rid]
            start = rec["computed_before"][rid]
            if any(start < m.offset == start + n for m in r.mm_inputs):
                reached.add("encoder_cut")
            if r.pooling and start > 0 and start + n == len(r.prompt) \
                    and rec["status"].get(rid) == "FINISHED_STOPPED":
                reached.add("pooled_after_chunks")
        rows = [rid for rid, _ in rec.get("bitmask_rows", ())]
        if any(rows.count(rid) > 1 for rid in rows):
            reached.add("grammar_draft_rows")
        for rid in rec["preempted"]:
            preempted_at.setdefault(rid, step)
        final.update(rec["status"])
    if trace.verdict == "engine_failure" and "LoRA adapters scheduled" in trace.failure["message"]:
        reached.add("lora_overfill")
    for r in stream.requests:
        if r.abort_step is not None:
            before, at = records.get(r.abort_step - 1), records.get(r.abort_step)
            if before and at and r.id in before["status"] \
                    and at["status"].get(r.id) == "FINISHED_ABORTED":
                reached.add(f"abort_{before['status'][r.id].lower()}")
        if r.pooling:
            continue  # no output, no stop rule
        stop = r.output[r.stop_index(config.max_model_len)]
        if final.get(r.id) == "FINISHED_STOPPED":
            if not r.ignore_eos and stop == r.eos_token_id and stop not in r.stop_token_ids:
                reached.add("eos_stop")
            if stop in r.stop_token_ids and (r.ignore_eos or stop != r.eos_token_id):
                reached.add("stop_token_stop")
        if final.get(r.id) == "FINISHED_LENGTH_CAPPED":
            room = config.max_model_len - len(r.prompt)
            if r.effective_max_tokens > room and r.stop_index(config.max_model_len) == room - 1:
                reached.add("max_model_len_stop")
    return reached


# (rule, strategy that is meant to reach it), from the property registry.
QUALITY_CASES = [(rule, p.strategy.__name__) for p in PROPERTIES for rule in p.rules]
ALL_RULES = {rule for rule, _ in QUALITY_CASES}


@pytest.mark.parametrize("rule,name", QUALITY_CASES, ids=[r for r, _ in QUALITY_CASES])
def test_strategy_reaches_rule(rule, name):
    found = find(STRATEGIES[name](), lambda data: rule in rules_reached(data), settings=QUALITY)
    check_stream_dict(found)


def test_any_stream_reaches_every_rule():
    seen: set[str] = set()

    def all_seen(data: dict[str, Any]) -> bool:
        seen.update(rules_reached(data))
        return ALL_RULES <= seen

    try:
        find(S.any_stream(), all_seen, settings=settings(QUALITY, max_examples=4000))
    except Exception:
        pytest.fail(f"any_stream never reached: {sorted(ALL_RULES - seen)}")


def test_prefix_streams_share_first_pages_often():
    """Prefix streams are built from shared prefixes: many share a whole first page."""
    shared: list[bool] = []

    @seed(0)  # see test_request_ids_are_independent_of_arrival_order
    @settings(VALIDITY, max_examples=100)
    @given(data=S.prefix_cache_streams())
    def collect(data):
        stream = check_stream_dict(data)
        assert stream.config.enable_prefix_caching
        bs = stream.config.block_size
        firsts = [r.prompt[:bs] for r in stream.requests if len(r.prompt) >= bs]
        shared.append(len(firsts) > len(set(firsts)))

    collect()
    assert sum(shared) >= len(shared) // 3, f"{sum(shared)} of {len(shared)} share a first page"


def test_request_ids_are_independent_of_arrival_order():
    """Ids are not the arrival order in disguise: their string order, their numeric
    order and the arrival order disagree in most streams of several requests."""
    disagree: list[bool] = []

    # A fixed seed: a share of 100 examples (many of them mutations of one another)
    # varies between seeds by more than the margin -- 90% on average, but 73% on 3 of 30
    # seeds -- so an unseeded run (the dev profile) failed now and then.
    @seed(0)
    @settings(VALIDITY, max_examples=100)
    @given(data=S.any_stream())
    def collect(data):
        ids = [r["id"] for r in data["requests"]]
        if len(ids) >= 3:
            numeric = sorted(ids, key=lambda i: int(i[1:]))
            disagree.append(ids != sorted(ids) and ids != numeric)

    collect()
    assert sum(disagree) >= 3 * len(disagree) // 4, f"{sum(disagree)} of {len(disagree)}"


@settings(VALIDITY, max_examples=20)
@given(data=S.crowd_streams())
def test_crowds_reach_64_requests(data):
    check_stream_dict(data)


def test_crowds_have_64_or_more_requests_sometimes():
    found = find(S.crowd_streams(), lambda d: len(d["requests"]) >= 64, settings=QUALITY)
    assert len({r.get("arrival_step", 0) for r in found["requests"]}) <= 3


# -- strategies built once per argument list (harness.checks.strategies._memoized) ------------------

def test_memoized_constructors_hand_back_the_strategy_built_before():
    assert S.st.integers(1, 5) is S.st.integers(1, 5)
    assert S.st.lists(S.st.integers(0, 3), min_size=2, max_size=2) is S.st.lists(
        S.st.integers(0, 3), min_size=2, max_size=2)
    assert S.st.integers(1, 5) is not S.st.integers(1, 6)
    # What hypothesis itself builds for the same arguments carries the same label, so the
    # spans of a draw (and the streams a seed draws) do not change.
    assert S.st.integers(1, 5).label == st.integers(1, 5).label
    assert S.st.sampled_from(["a", "b"]).label == st.sampled_from(["a", "b"]).label


def test_memo_keys_tell_equal_values_of_other_types_apart():
    # 1 == True and hash(1) == hash(True): keyed by value alone, sampled_from([True, False])
    # would hand back the strategy of [1, 0] and draw ints where bools were asked for.
    ints, bools = S.st.sampled_from([1, 0]), S.st.sampled_from([True, False])
    assert ints is not bools
    assert type(find(bools, lambda v: True)) is bool
    assert type(find(ints, lambda v: True)) is int


def test_unhashable_arguments_build_a_fresh_strategy():
    earlier = [{"prompt": [1]}]
    assert S.st.sampled_from(earlier) is not S.st.sampled_from(earlier)
    assert S._memo_key({"a": 1}) is None and S._memo_key([1, [2, {}]]) is None


# -- the cheaper draw inside the strategies (harness.checks.strategies.draws.composite) ------------

def _with_draw(cheap: bool, run: Callable[[], Any]) -> Any:
    """``run()`` with the strategies drawing through the cheaper draw, or hypothesis's own."""
    from harness.checks.strategies import draws
    before = draws.cheap_draws
    draws.cheap_draws = cheap and before
    try:
        return run()
    finally:
        draws.cheap_draws = before


@pytest.mark.parametrize("prop", ["whole_space", "async_scheduling", "structured_outputs",
                                  "real_workloads"])
def test_cheaper_draw_draws_what_hypothesis_draws(prop):
    """The same streams from a seed, mutations included (they follow the spans' labels)."""
    from harness.jobs.chunks import given_campaign

    def streams() -> list[dict]:
        drawn: list[dict] = []

        def body(data):
            drawn.append(data)
        given_campaign(body, 60, 3, settings(), prop)()
        return drawn
    assert _with_draw(True, streams) == _with_draw(False, streams)


def test_cheaper_draw_shrinks_as_hypothesis_shrinks():
    """The same values tried while shrinking: the spans, labels and recorded values that
    the shrinker works on agree."""
    from random import Random

    def tried() -> list[dict]:
        seen: list[dict] = []

        def wanted(config: dict) -> bool:
            seen.append(config)
            return (config["max_num_seqs"] >= 3 and config["num_speculative_tokens"] >= 2
                    and config["policy"] == "priority")
        find(S.configs(), wanted, settings=settings(database=None, max_examples=200),
             random=Random(7))
        return seen
    assert _with_draw(True, tried) == _with_draw(False, tried)


def test_cheaper_draw_follows_the_pinned_hypothesis():
    """A new hypothesis pin needs its ConjectureData.draw read again (and its release added
    to draws._FOLLOWED) before the strategies draw with less bookkeeping under it."""
    from harness.checks.strategies import draws
    from harness.formats.paths import ROOT
    pin = re.search(r"^hypothesis==(\S+)", (ROOT / "constraints.txt").read_text(), re.M)
    assert pin and (hypothesis.__version__ != pin.group(1) or draws.cheap_draws)


def test_composite_labels_are_hypothesis_labels():
    """A span keeps the label hypothesis's own composite gives it."""
    for ours in (S.streams(), S.configs(), S.set_aside_streams(), S.mm_streams()):
        built = ours.wrapped_strategy
        theirs = st.composite(built.definition)(*built.args, **built.kwargs)
        assert ours.label == theirs.label
    assert repr(S.streams(max_requests=3)) == "streams(max_requests=3)"


# -- rules of later releases that the whole-space streams never decide ----------------------

#: (strategy, rule, the fewest of 200 streams from seed 0 that must decide it): about
#: half of what was measured on 2026-12-04 (134, 31, 121, 113, 54 and 23).
LATER_RULES = [("repeated_image_streams", "items_taken_per_request", 60),
               ("repeated_image_streams", "held_to_last_occurrence", 12),
               ("encoder_handoff_streams", "encoder_frees_wait_for_outputs", 50),
               ("encoder_handoff_streams", "placeholder_tokens_hold_encoder_outputs", 45),
               ("connector_idle_streams", "sending_requests_keep_the_engine_stepping", 25),
               ("passed_over_victim_streams", "passed_over_victim_keeps_the_pass", 12)]


@pytest.mark.parametrize("strategy, rule, fewest", LATER_RULES,
                         ids=[f"{s}-{r}" for s, r, _ in LATER_RULES])
def test_later_release_rules_are_decided(strategy, rule, fewest):
    """The reference of the release that brought ``rule`` gives another trace without it on
    a fair share of the strategy's streams, so that ``pytest -k conformance`` on that
    release or a later one holds vLLM to it (and a reference that ignored the rule would
    decide none)."""
    from harness.checks.diff import first_divergence
    from harness.engines.reference_engine import ReferenceEngine
    from reference import releases

    since = next(c.since for c in releases.CHANGES if c.name == rule)
    with_rule = ReferenceEngine(since)
    without = ReferenceEngine(since, with_rule.rules - {rule})
    decided = []

    @hypothesis.seed(0)
    @settings(max_examples=200, database=None, deadline=None, phases=[Phase.generate])
    @given(getattr(S, strategy)())
    def check(data):
        stream = parse_drawn_stream(data)
        decided.append(first_divergence(run(with_rule, stream).to_json(),
                                        run(without, stream).to_json()) is not None)

    check()
    assert len(decided) == 200 and sum(decided) >= fewest, f"{sum(decided)} of {len(decided)}"


#: Draws streams of the whole space from seed 0 with hypothesis's own settings (not the
#: project's profiles), as a user's own ``@given`` over the strategies does; prints their
#: digest.  argv[1]: a folder whose module ``local_literals`` is imported first, or "".
_DRAW_WITH_OWN_SETTINGS = """
import hashlib, sys
if sys.argv[1]:
    sys.path.insert(0, sys.argv[1])
    import local_literals  # noqa: F401  (a user's module, literals and all)
from hypothesis import HealthCheck, Phase, given, seed, settings
from harness.checks.strategies import any_stream
drawn = []
@seed(0)
@settings(max_examples=40, database=None, deadline=None, phases=[Phase.generate],
          suppress_health_check=list(HealthCheck))
@given(any_stream())
def draw(data):
    drawn.append(repr(data))
draw()
print(hashlib.sha256("".join(drawn).encode()).hexdigest())
"""


def test_a_seed_draws_the_same_streams_whatever_local_code_is_loaded(tmp_path):
    """Hypothesis now and then draws a literal found in any "local" module loaded (one
    outside site-packages).  The strategies keep that pool empty wherever they are used,
    so a user's own code (a simulator, a test helper) cannot change which streams a seed
    draws; without that, this module's literals change the digest."""
    import subprocess
    import sys
    (tmp_path / "local_literals.py").write_text(
        "def sizes():\n    return [" + ", ".join(str(n) for n in range(3, 400, 7)) + "]\n")
    digests = [subprocess.run([sys.executable, "-c", _DRAW_WITH_OWN_SETTINGS, folder],
                              capture_output=True, text=True, check=True).stdout.strip()
               for folder in ("", str(tmp_path))]
    assert digests[0] and digests[0] == digests[1]
