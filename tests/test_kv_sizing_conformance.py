"""reference.kv_sizing against vLLM 0.11.0's own sizing functions, on CPU.

vLLM is reached only through ``harness.engines.vllm_kv_sizing``, which calls
get_kv_cache_configs / get_num_blocks / check_enough_kv_cache_memory /
estimate_max_model_len as vLLM's start-up does and answers in plain values.
It is imported inside the ``vl`` fixture so that collection works without vLLM.
Every bundled model (``fixtures/models``) is checked as ``make conformance``
checks it, through ``harness.checks.kv_sizing``.
"""

from __future__ import annotations

import itertools
import re

import pytest

from harness.checks import kv_sizing
from harness.formats.paths import MODELS_DIR
from reference.kv_sizing import (
    ModelShape,
    NotEnoughKVCacheMemory,
    check_enough_kv_cache_memory,
    dtype_bytes,
    estimate_max_model_len,
    kv_cache_layout,
    min_bytes_for_max_model_len,
    num_blocks_for_budget,
    resolve_kv_dtype,
)

pytestmark = [pytest.mark.conformance, pytest.mark.needs_vllm]

QWEN_DIR = MODELS_DIR / "qwen2.5-0.5b"
GiB = 1 << 30

# (model dtype, CacheConfig.cache_dtype): bf16 / fp16 / fp32 KV via "auto",
# the three fp8 spellings, and an explicit bfloat16 cache under an fp16 model.
DTYPES = [("bfloat16", "auto"), ("float16", "auto"), ("float32", "auto"),
          ("bfloat16", "fp8"), ("float16", "fp8_e4m3"), ("float32", "fp8_e5m2"),
          ("float16", "bfloat16")]
BLOCK_SIZES = [1, 16, 32, 64, 128]
LAYERS = [1, 2, 24, 32, 61]
HEADS = [(2, 64), (8, 128), (1, 256), (4, 80), (16, 96)]
MAX_LENS = [16, 100, 2048, 4096]


def _dtype_id(md: str, cd: str) -> str:
    return f"{md}" if cd == "auto" else f"{md}-kv{cd}"


@pytest.fixture(scope="module")
def vl(vllm_engine):  # vllm_engine: an undrivable vLLM stops the run in one line
    from harness.engines.vllm_kv_sizing import VllmKVSizing
    return VllmKVSizing(QWEN_DIR)


def _ref_shape(layers, heads, head_size, model_dtype, cache_dtype) -> ModelShape:
    return ModelShape(layers, heads, head_size, model_dtype).with_cache_dtype(cache_dtype)


# --- the fixture model and the seed numbers ----------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("model_dir", kv_sizing.model_dirs(), ids=lambda p: p.name)
def test_bundled_model_sizing_matches_vllm(vllm_engine, model_dir):
    """Shape, bytes per token, pages, one request's need and blocks per budget of each bundled
    model: the checks ``make conformance`` prints (harness.checks.kv_sizing)."""
    diffs = kv_sizing.differences([model_dir])
    assert not diffs, "\n".join(c.line() for c in diffs)


def test_fixture_shape_matches_model_config(vl):
    ref = ModelShape.load(QWEN_DIR)
    assert vl.model_shape("auto", 2048) == (
        ref.num_layers, ref.num_kv_heads, ref.head_size, ref.dtype)


def test_seed_numbers_in_vllm(vl):
    ref = ModelShape.load(QWEN_DIR)
    page = vl.page_size_bytes(16, ref.num_kv_heads, ref.head_size, "bfloat16", "auto")
    assert page == ref.page_size_bytes(16) == 8192
    assert page * ref.num_layers == ref.page_size_bytes_all_layers(16) == 192 * 1024
    _, need = vl.request_need(ref.num_layers, 16, ref.num_kv_heads, ref.head_size, "bfloat16",
                              "auto", 2048)
    assert need == min_bytes_for_max_model_len(ref, 16, 2048) == ref.contiguous_bytes(2048) == 24 << 20


# --- dtype resolution, page size, per-request need ---------------------------

@pytest.mark.parametrize("block_size", BLOCK_SIZES, ids=lambda b: f"bs{b}")
@pytest.mark.parametrize("model_dtype, cache_dtype", DTYPES,
                         ids=[_dtype_id(*d) for d in DTYPES])
def test_page_size_and_request_need(vl, model_dtype, cache_dtype, block_size):
    assert vl.kv_dtype_size(model_dtype, cache_dtype) == \
        dtype_bytes(resolve_kv_dtype(cache_dtype, model_dtype))
    for heads, head_size in HEADS:
        ref = _ref_shape(3, heads, head_size, model_dtype, cache_dtype)
        assert vl.page_size_bytes(block_size, heads, head_size, model_dtype, cache_dtype) == \
            ref.page_size_bytes(block_size)
        for mml in MAX_LENS:
            per_spec, total = vl.request_need(3, block_size, heads, head_size, model_dtype,
                                              cache_dtype, mml)
            assert per_spec == total == min_bytes_for_max_model_len(ref, block_size, mml)


@pytest.mark.parametrize("dcp", [2, 3, 4])
@pytest.mark.parametrize("block_size", [1, 16, 64])
def test_request_need_with_dcp(vl, dcp, block_size):
    ref = ModelShape(24, 2, 64, "bfloat16")
    for mml in (100, 2048, 2049, 4097):
        assert vl.request_need_with_dcp(block_size, 2, 64, mml, dcp) * 24 == \
            min_bytes_for_max_model_len(ref, block_size, mml, dcp_world_size=dcp)


# --- the full start-up sizing: get_kv_cache_configs --------------------------

def _layout_cases():
    cases = []
    for i, ((md, cd), bs) in enumerate(itertools.product(DTYPES, BLOCK_SIZES)):
        layers = LAYERS[i % len(LAYERS)]
        heads, head = HEADS[(i // len(LAYERS) + i) % len(HEADS)]
        mml = MAX_LENS[i % len(MAX_LENS)]
        # budget = the start-up minimum plus: nothing, a page short of one
        # more page, and something large and ragged
        for extra in ("0", "page-1", "big"):
            cases.append(pytest.param(
                md, cd, bs, layers, heads, head, mml, extra, None,
                id=f"{_dtype_id(md, cd)}-bs{bs}-L{layers}-h{heads}x{head}-mml{mml}-{extra}"))
    # num_gpu_blocks_override: below, above and at zero, whatever the budget
    for j, override in enumerate((1, 7, 100, 50_000, 0)):
        md, cd = DTYPES[j]
        cases.append(pytest.param(md, cd, 16, 24, 2, 64, 2048, "big", override,
                                  id=f"{_dtype_id(md, cd)}-bs16-L24-override{override}"))
    return cases


def _budget(ref: ModelShape, bs: int, mml: int, extra: str) -> int:
    need = min_bytes_for_max_model_len(ref, bs, mml)
    page_all = ref.page_size_bytes_all_layers(bs)
    return need + {"0": 0, "page-1": page_all - 1, "big": 37 * page_all + GiB + 12345}[extra]


@pytest.mark.parametrize("md, cd, bs, layers, heads, head, mml, extra, override", _layout_cases())
def test_kv_cache_config(vl, md, cd, bs, layers, heads, head, mml, extra, override):
    ref = _ref_shape(layers, heads, head, md, cd)
    budget = _budget(ref, bs, mml, extra)
    cfg = vl.kv_cache_config(md, cd, bs, layers, heads, head, mml, budget, override)
    lay = kv_cache_layout(ref, bs, budget, mml, num_gpu_blocks_override=override)

    assert cfg["get_num_blocks"] == num_blocks_for_budget(ref, bs, budget, override)
    assert cfg["num_blocks"] == lay.num_blocks
    if override is None:
        assert lay.total_bytes <= budget
        expected_min = {"0": lay.blocks_per_max_len_request,
                        "page-1": lay.blocks_per_max_len_request}.get(extra)
        if expected_min is not None:  # the minimum budget gives exactly one request's pages
            assert cfg["num_blocks"] == expected_min
    assert cfg["group_page_sizes"] == [lay.page_size_bytes]
    assert len(cfg["tensor_sizes"]) == lay.num_tensors == layers
    assert cfg["tensor_sizes"] == [lay.tensor_size_bytes] * layers
    assert cfg["tensor_shared_by"] == [[n] for n in cfg["layer_names"]]
    assert sum(cfg["tensor_sizes"]) == lay.total_bytes

    if lay.num_blocks:
        assert cfg["max_concurrency"] == lay.max_concurrency

    # The model runner's reshape: raw bytes -> KV dtype -> backend shape.
    assert cfg["runner_blocks"] == lay.num_blocks
    if bs % 16 == 0:
        assert cfg["tensor_shape"] == cfg["viewed_shape"] == lay.tensor_shape
    else:
        assert cfg["tensor_shape"] is None  # the backend refuses the block size

    # Block 0 is the null block: the pool hands out one fewer.
    if 0 < lay.num_blocks <= 20_000:
        assert vl.pool_free_blocks(lay.num_blocks) == lay.allocatable_blocks


# --- start-up check: budget too small for one max_model_len request ----------

def _too_small_cases():
    cases = []
    for i, ((md, cd), bs) in enumerate(itertools.product(DTYPES[:4], [1, 16, 128])):
        layers = LAYERS[i % len(LAYERS)]
        heads, head = HEADS[i % len(HEADS)]
        mml = [2048, 4096, 100][i % 3]
        for short in ("1B", "half", "sub-page", "zero", "negative"):
            cases.append(pytest.param(
                md, cd, bs, layers, heads, head, mml, short,
                id=f"{_dtype_id(md, cd)}-bs{bs}-L{layers}-h{heads}x{head}-mml{mml}-{short}"))
    return cases


@pytest.mark.parametrize("md, cd, bs, layers, heads, head, mml, short", _too_small_cases())
def test_too_small_budget_raises(vl, md, cd, bs, layers, heads, head, mml, short):
    ref = _ref_shape(layers, heads, head, md, cd)
    need = min_bytes_for_max_model_len(ref, bs, mml)
    budget = {"1B": need - 1, "half": need // 2,
              "sub-page": ref.page_size_bytes_all_layers(bs) - 1,
              "zero": 0, "negative": -4096}[short]
    msg = vl.startup_error(md, cd, bs, layers, heads, head, mml, budget)
    assert msg is not None
    with pytest.raises(NotEnoughKVCacheMemory) as rexc:
        kv_cache_layout(ref, bs, budget, mml)
    assert rexc.value.needed == need

    if budget <= 0:
        assert "No available memory" in msg
        assert "no memory available" in str(rexc.value)
        assert rexc.value.estimated_max_len == 0
        return
    m = re.search(r"estimated maximum model length is (\d+)", msg)
    vllm_est = int(m.group(1)) if m else 0
    assert vllm_est == rexc.value.estimated_max_len
    assert f"max seq len ({mml})" in msg


@pytest.mark.parametrize("block_size", BLOCK_SIZES, ids=lambda b: f"bs{b}")
def test_estimate_max_model_len(vl, block_size):
    ref = ModelShape(24, 2, 64, "bfloat16")
    mml = 4096
    page_all = ref.page_size_bytes_all_layers(block_size)
    budgets = [1, page_all - 1, page_all, page_all + 1, 3 * page_all - 1, 10 ** 7,
               min_bytes_for_max_model_len(ref, block_size, mml) - 1,
               min_bytes_for_max_model_len(ref, block_size, mml), GiB]
    for budget in budgets:
        vllm_estimate, vllm_ok = vl.estimate_max_model_len(block_size, 24, 2, 64, mml, budget)
        assert vllm_estimate == estimate_max_model_len(ref, block_size, mml, budget), budget
        fits = min_bytes_for_max_model_len(ref, block_size, mml) <= budget
        try:
            check_enough_kv_cache_memory(ref, block_size, mml, budget)
            ref_ok = True
        except NotEnoughKVCacheMemory:
            ref_ok = False
        assert vllm_ok == ref_ok == fits, budget


# --- hybrid models: sized as on a CUDA GPU -----------------------------------------------------

HYBRID = ["gemma-3-1b", "llama-4-scout", "granite-4.0-h-tiny"]


@pytest.mark.parametrize("name", HYBRID)
def test_hybrid_model_is_sized_as_hybrid(vllm_engine, name):
    """Both sides size the bundled hybrid models by their groups (not as full attention), and
    the scheduler's groups of the default setting agree (the full check is above)."""
    from harness.engines import vllm_sizing
    from reference.kv_sizing_hybrid import HybridModel, hybrid_layout, hybrid_manager_on
    vl = vllm_sizing(MODELS_DIR / name)
    assert vl.is_hybrid()
    model = HybridModel.load(MODELS_DIR / name)
    for bs, mml, batched in [(16, 2048, 2048), (64, 16384, 8192), (512, 100, 2048)]:
        row = vl.hybrid_sizing(bs, mml, batched, [4 * GiB])["budgets"][4 * GiB]
        lay = hybrid_layout(model.layer_specs(bs, mml), 4 * GiB, mml, batched,
                            hybrid_manager=hybrid_manager_on(model.cfg))
        assert row["num blocks"] == lay.num_blocks
        assert [g[:5] for g in row["groups"]] == [
            (s.kind, s.block_size, s.sliding_window, s.attention_chunk_size,
             s.num_speculative_blocks) for s in lay.scheduler_groups()]


# --- a stream's pool: each engine sizes its own ----------------------------------------------

def _memory_stream(memory: int):
    from harness.formats.stream import parse_stream
    return parse_stream({"config": {"block_size": 16, "max_model_len": 64,
                                    "max_num_batched_tokens": 64,
                                    "kv_cache_memory_bytes": memory},
                         "requests": [{"id": "a", "prompt": [1, 2, 3], "output": [4, 5]}]})


def test_a_memory_too_small_is_refused_by_both_start_ups_alike():
    """A memory one byte short of one max_model_len request (4 pages of Qwen2.5-0.5B) is a
    valid stream: vLLM's start-up refuses it, and so does the reference's, at step 0."""
    from harness.checks.diff import first_divergence
    from harness.engines import get_engine
    from harness.loop.runner import run
    page = 24 * 512 * 16
    stream = _memory_stream(4 * page - 1)
    vllm = run(get_engine("vllm"), stream).to_json()
    ref = run(get_engine("reference"), stream).to_json()
    assert (vllm["verdict"], vllm["failure"]["step"]) == ("engine_failure", 0)
    assert "ValueError" in vllm["failure"]["message"]
    assert first_divergence(vllm, ref) is None
    assert first_divergence(run(get_engine("vllm"), _memory_stream(4 * page)).to_json(),
                            run(get_engine("reference"), _memory_stream(4 * page)).to_json()) \
        is None


def test_a_sizing_mutant_is_a_divergence_not_an_invalid_stream():
    """The reference sizes its pool inside its own start-up, so a wrong rule of the cut
    (here: a partial page counted) shows in the trace's pool, not in stream validation."""
    from harness.checks.diff import first_divergence
    from harness.engines import get_engine
    from harness.checks.mutants import REFERENCE_MUTANTS as MUTANTS
    from harness.loop.runner import run
    (mutant,) = [m for m in MUTANTS if m.name == "pool_pages_rounded_up"]
    stream = _memory_stream(10 * 24 * 512 * 16 + 5)
    vllm = run(get_engine("vllm"), stream).to_json()
    with mutant.patch():
        ref = run(get_engine("reference"), stream).to_json()
    found = first_divergence(vllm, ref)
    assert found is not None and found.field == "kv_cache"
    assert (found.left["num_blocks"], found.right["num_blocks"]) == (10, 11)
