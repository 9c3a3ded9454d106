"""vLLM's own engine loop (engine ``vllm-core``: the real EngineCore over a scripted executor)
against the real vLLM scheduler driven by the harness's step loop.

The two engines share vLLM's scheduler and KV cache manager and the scripted model; they
differ in who steps them: the harness's ``runner`` or vLLM's ``EngineCore`` (start-up
sizing, ``preprocess_add_request``, ``abort_requests``, ``step``/``post_step``).  Equal
traces on every stream mean the harness's loop calls the scheduler as vLLM's engine does.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings

from harness.checks import strategies as st
from harness.checks.diff import first_divergence
from harness.checks.golden import read_trace
from harness.formats.paths import golden_dir
from harness.loop.runner import run
from harness.formats.stream import load_stream, parse_stream
from tests.stream_builders import stream as stream_dict

pytestmark = [pytest.mark.needs_vllm]

STREAMS = Path(__file__).resolve().parent.parent / "fixtures" / "streams"
STREAM_FILES = sorted(STREAMS.glob("*.json"))


@pytest.fixture(scope="session")
def core_engine(vllm_engine):
    from harness.engines import get_engine
    return get_engine("vllm-core")


@pytest.mark.parametrize("path", STREAM_FILES, ids=[p.stem for p in STREAM_FILES])
def test_vllm_core_gives_the_recorded_trace(core_engine, path):
    """Each bundled stream vllm-core takes: EngineCore's trace is the one recorded from the
    real vLLM (its steps, verdict and failure)."""
    stream = load_stream(path)
    why = core_engine.refuses(stream)
    if why is not None:
        pytest.skip(f"vllm-core does not take this stream: {why}")
    recorded = read_trace(golden_dir(core_engine.version()) / f"{path.stem}.json")
    trace = run(core_engine, stream).to_json()
    assert first_divergence(recorded, trace) is None
    assert (trace["verdict"], trace["failure"]) == (recorded["verdict"], recorded["failure"])


@settings(max_examples=settings().max_examples // 4, deadline=None,
          suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow])
@given(st.any_stream())
def test_vllm_core_equals_the_step_loop(core_engine, vllm_engine, data):
    """Generated streams (those vllm-core takes; a quarter of the profile's examples, as
    each runs vLLM twice): EngineCore's loop and the harness's give the same trace."""
    stream = parse_stream(data)
    assume(core_engine.refuses(stream) is None)
    ours, theirs = run(vllm_engine, stream).to_json(), run(core_engine, stream).to_json()
    assert first_divergence(ours, theirs) is None
    assert (ours["verdict"], ours["failure"]) == (theirs["verdict"], theirs["failure"])


@settings(max_examples=settings().max_examples // 4, deadline=None,
          suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow])
@given(st.pipeline_streams())
def test_vllm_core_pipeline_equals_the_step_loop(core_engine, vllm_engine, data):
    """Pipeline parallelism: EngineCore's batch queue of one batch per stage over vLLM's
    synchronous Scheduler applies each batch in the step the step loop's imitation does."""
    stream = parse_stream(data)
    assume(core_engine.refuses(stream) is None)
    ours, theirs = run(vllm_engine, stream).to_json(), run(core_engine, stream).to_json()
    assert first_divergence(ours, theirs) is None
    assert (ours["verdict"], ours["failure"]) == (theirs["verdict"], theirs["failure"])


@settings(max_examples=settings().max_examples // 4, deadline=None,
          suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow])
@given(st.async_streams())
def test_vllm_core_async_equals_the_step_loop(core_engine, vllm_engine, data):
    """Async scheduling: EngineCore's ``step_with_batch_queue`` over vLLM's AsyncScheduler
    applies each batch in the step the step loop's imitation does, and both give the
    same trace."""
    stream = parse_stream(data)
    assume(core_engine.refuses(stream) is None)
    ours, theirs = run(vllm_engine, stream).to_json(), run(core_engine, stream).to_json()
    assert first_divergence(ours, theirs) is None
    assert (ours["verdict"], ours["failure"]) == (theirs["verdict"], theirs["failure"])


def test_a_step_loop_that_applies_batches_early_is_caught(core_engine, vllm_engine, monkeypatch):
    """The comparison can fail: a step loop that applies every batch in the step that
    scheduled it (the synchronous loop) is stopped by EngineCore, which waits a step."""
    stream = parse_stream(stream_dict({"async_scheduling": True}))
    monkeypatch.setattr(type(core_engine), "applies_oldest_now",
                        lambda self, in_flight, runs_work, worker_done: True)
    trace = run(core_engine, stream)
    assert trace.verdict == "engine_failure"
    assert "applies a batch EngineCore does not apply" in trace.failure["message"]


def test_a_step_loop_that_reports_transfers_late_is_caught(core_engine, monkeypatch):
    """The executor's transfer reports are compared with the step loop's: an executor
    that reports every transfer a step late is stopped at the first report."""
    import harness.engines.vllm_core as vllm_core
    from harness.formats.steps import TransferReports

    class Late(TransferReports):
        def due(self, step):
            return super().due(step - 1)

    monkeypatch.setattr(vllm_core, "TransferReports", Late)
    trace = run(core_engine, load_stream(STREAMS / "kv_connector_async_load.json"))
    assert trace.verdict == "engine_failure"
    assert "worker reports transfers" in trace.failure["message"]


def test_streams_vllm_core_does_not_take_are_refused_with_the_reason(core_engine):
    apart = parse_stream(stream_dict({"num_gpu_blocks": 40, "enable_prefix_caching": False,
                                      "kv_cache_groups": [
        {"type": "sliding_window", "sliding_window": 8}, {"type": "full"},
        {"type": "sliding_window", "sliding_window": 8}]}))
    assert "KV cache groups of one kind apart" in core_engine.refuses(apart)
    with pytest.raises(ValueError, match="vllm-core engine does not take this stream: KV"):
        core_engine.start(apart)
    together = parse_stream(stream_dict({"num_gpu_blocks": 40, "kv_cache_groups": [
        {"type": "full"}, {"type": "sliding_window", "sliding_window": 8},
        {"type": "sliding_window", "sliding_window": 8}]}))
    assert core_engine.refuses(together) is None
    doubled = parse_stream(stream_dict({"num_gpu_blocks": 40, "kv_cache_groups": [
        {"type": "full"}, {"type": "full"}, {"type": "sliding_window", "sliding_window": 8},
        {"type": "sliding_window", "sliding_window": 8}]}))
    assert "every kind of KV cache group more than once" in core_engine.refuses(doubled)
    assert core_engine.refuses(parse_stream(stream_dict())) is None
    hybrid = parse_stream(stream_dict({"kv_cache_groups": [
        {"type": "full"}, {"type": "sliding_window", "sliding_window": 8}]}))
    assert core_engine.refuses(hybrid) is None


def test_engine_core_groups_the_layers_of_a_hybrid_stream(core_engine):
    """EngineCore makes the stream's groups itself from the layers' specs, in order, with
    the stream's pool."""
    stream = parse_stream(stream_dict({"num_gpu_blocks": 30, "enable_prefix_caching": False,
                                       "kv_cache_groups": [
        {"type": "full"}, {"type": "sliding_window", "sliding_window": 8},
        {"type": "chunked_local", "attention_chunk_size": 8}]}))
    core_engine.start(stream)
    config = core_engine.core.scheduler.kv_cache_config
    kinds = [type(g.kv_cache_spec).__name__ for g in config.kv_cache_groups]
    assert kinds == ["FullAttentionSpec", "SlidingWindowSpec", "ChunkedLocalAttentionSpec"]
    assert config.num_blocks == 30
    core_engine.shutdown()


def test_engine_core_keeps_the_hybrid_manager_off_for_a_kv_connector(core_engine):
    """Start-up turns the hybrid KV cache manager off for a KV connector on any device;
    the engine turns it on, as a GPU has it, only for streams without one.  Later vLLM
    refuses a connector without hybrid support while the manager is on (0.14.0 does)."""
    stream = load_stream(STREAMS / "kv_connector_finish_sees_window_nulls.json")
    core_engine.start(stream)
    assert core_engine.core.vllm_config.scheduler_config.disable_hybrid_kv_cache_manager is True
    core_engine.shutdown()
    core_engine.start(parse_stream(stream_dict({"kv_cache_groups": [
        {"type": "full"}, {"type": "sliding_window", "sliding_window": 8}]})))
    assert core_engine.core.vllm_config.scheduler_config.disable_hybrid_kv_cache_manager is False
    core_engine.shutdown()


def test_engine_core_sizes_the_pool_of_the_stream(core_engine):
    """EngineCore's own start-up sizing, from the memory the executor reports, gives the
    stream's pool, down to the smallest vLLM starts with (one max_model_len request; from
    0.29.0 one page more, the null page held back)."""
    for blocks in (12, 13, 40):
        stream = parse_stream(stream_dict({"num_gpu_blocks": blocks, "max_model_len": 48}))
        if blocks == 12 and core_engine.refuses(stream) is not None:
            assert core_engine.version() != "0.11.0"
            continue
        core_engine.start(stream)
        pool = core_engine.core.scheduler.kv_cache_manager.block_pool
        assert pool.num_gpu_blocks == blocks
        assert core_engine.core.vllm_config.cache_config.num_gpu_blocks == blocks
        core_engine.shutdown()


def stand_in_on_0_11_0(core_engine) -> None:
    """The start-up refusals are shown on vLLM 0.11.0 through stand-ins for later releases'
    start-up, written on 0.11.0's internals; a later vLLM shows its own refusals in
    test_vllm_core_gives_the_recorded_trace's skips."""
    if core_engine.version() != "0.11.0":
        pytest.skip(f"a stand-in on vLLM 0.11.0's start-up; this is {core_engine.version()}")


def test_a_pool_engine_core_refuses_at_start_is_refused_with_vllms_reason(core_engine):
    """A pool EngineCore's start-up refuses is refused with vLLM's own message, on one
    line; one page more and it is taken."""
    stand_in_on_0_11_0(core_engine)
    from harness.engines.vllm_mutants import start_up_holds_back_a_page
    exact = parse_stream(stream_dict({"num_gpu_blocks": 12, "max_model_len": 48}))
    roomier = parse_stream(stream_dict({"num_gpu_blocks": 13, "max_model_len": 48}))
    with start_up_holds_back_a_page():
        why = core_engine.refuses(exact)
        assert core_engine.refuses(roomier) is None
    assert why.startswith("vLLM's start-up refuses this pool: To serve at least one request")
    assert "max seq len (48)" in why and "estimated maximum model length is 44." in why
    assert "\n" not in why and " Try " not in why  # one line, without the operator's advice


def test_other_start_up_failures_are_run_and_compared_not_refused(core_engine):
    """Only vLLM's sizing refuses a pool; a ValueError from elsewhere in start-up is the
    run's failure, compared with the reference's."""
    stand_in_on_0_11_0(core_engine)
    from harness.engines.vllm_mutants import start_up_check_fails
    stream = parse_stream(stream_dict())
    with start_up_check_fails("not the sizing's"):
        assert core_engine.refuses(stream) is None
        with pytest.raises(ValueError, match="not the sizing's") as raised:
            core_engine.start(stream)
    assert "refuses" not in str(raised.value)


def test_a_start_up_that_changes_the_block_size_is_refused(core_engine):
    """0.34.0's EngineCore sets the block size to the groups' smallest page (a lone Mamba
    group's page holds max_model_len tokens); the stream's block size is then not the one
    vLLM runs.  Stand-in: 0.11.0's start-up, then that block size."""
    stand_in_on_0_11_0(core_engine)
    from harness.engines.vllm_mutants import start_up_sets_block_size
    with start_up_sets_block_size(16):
        why = core_engine.refuses(parse_stream(stream_dict()))
    assert why == (
        "EngineCore's start-up sets the block size to 16 tokens (its smallest KV cache "
        "group page), not the stream's block_size 4")
