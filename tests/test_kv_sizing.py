"""Unit tests for reference.kv_sizing, by hand-computed numbers (no vLLM needed)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from reference.arith import cdiv
from reference.kv_sizing import (
    DTYPE_BYTES,
    KVCacheLayout,
    ModelShape,
    NotEnoughKVCacheMemory,
    check_enough_kv_cache_memory,
    dtype_bytes,
    estimate_max_model_len,
    flash_attention_shape,
    kv_cache_layout,
    kv_cache_tensor_shape,
    min_bytes_for_max_model_len,
    num_blocks_for_budget,
    resolve_kv_dtype,
)

ROOT = Path(__file__).resolve().parent.parent
QWEN_DIR = ROOT / "fixtures" / "models" / "qwen2.5-0.5b"
KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30


@pytest.fixture(scope="module")
def qwen() -> ModelShape:
    return ModelShape.load(QWEN_DIR)


# --- the seed's arithmetic ---------------------------------------------------

def test_seed_shape_from_fixture(qwen):
    assert qwen == ModelShape(num_layers=24, num_kv_heads=2, head_size=64, dtype="bfloat16")


def test_seed_bytes_per_token(qwen):
    assert qwen.bytes_per_token_per_layer == 2 * 2 * 64 * 2 == 512
    assert qwen.bytes_per_token == 12 * KiB == 12288


def test_seed_page(qwen):
    assert qwen.page_size_bytes(16) == 16 * 512 == 8192
    assert qwen.page_size_bytes_all_layers(16) == 192 * KiB == 196608


def test_seed_contiguous_2048(qwen):
    assert qwen.contiguous_bytes(2048) == 24 * MiB
    # 2048 is a whole number of 16-token pages, so vLLM's start-up need for a
    # 2048-token request is the same 24 MB.
    assert min_bytes_for_max_model_len(qwen, 16, 2048) == 24 * MiB


# --- other models and dtypes -------------------------------------------------

LLAMA3_8B = {"num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
             "hidden_size": 4096, "torch_dtype": "bfloat16"}
LLAMA2_7B = {"num_hidden_layers": 32, "num_attention_heads": 32, "hidden_size": 4096,
             "torch_dtype": "float16"}  # MHA: no num_key_value_heads
QWEN3_06B = {"num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8,
             "hidden_size": 1024, "head_dim": 128, "torch_dtype": "bfloat16"}


@pytest.mark.parametrize("cfg, dtype, per_layer, per_token, page16_all", [
    # 2 * 8 kv heads * 128 * 2 B = 4096; x32 layers = 128 KiB; x16 = 2 MiB
    (LLAMA3_8B, None, 4096, 128 * KiB, 2 * MiB),
    (LLAMA3_8B, "fp8", 2048, 64 * KiB, 1 * MiB),
    (LLAMA3_8B, "float32", 8192, 256 * KiB, 4 * MiB),
    # MHA: kv heads default to attention heads: 2 * 32 * 128 * 2 = 16 KiB
    (LLAMA2_7B, None, 16 * KiB, 512 * KiB, 8 * MiB),
    # head_dim given explicitly (1024 / 16 would be 64): 2 * 8 * 128 * 2
    (QWEN3_06B, None, 4096, 28 * 4096, 28 * 4096 * 16),
    (QWEN3_06B, "fp8_e5m2", 2048, 28 * 2048, 28 * 2048 * 16),
], ids=["llama3-bf16", "llama3-fp8", "llama3-fp32", "llama2-fp16", "qwen3-bf16",
        "qwen3-fp8e5m2"])
def test_other_models(cfg, dtype, per_layer, per_token, page16_all):
    shape = ModelShape.from_hf_config(cfg, dtype)
    assert shape.bytes_per_token_per_layer == per_layer
    assert shape.bytes_per_token == per_token
    assert shape.page_size_bytes(16) == per_layer * 16
    assert shape.page_size_bytes_all_layers(16) == page16_all


@pytest.mark.parametrize("block_size, page_layer, page_all", [
    (1, 512, 12288), (16, 8192, 196608), (32, 16384, 393216),
    (64, 32768, 786432), (128, 65536, 1572864),
])
def test_seed_block_sizes(qwen, block_size, page_layer, page_all):
    assert qwen.page_size_bytes(block_size) == page_layer
    assert qwen.page_size_bytes_all_layers(block_size) == page_all


def test_dtype_names():
    assert dtype_bytes("torch.bfloat16") == 2
    assert dtype_bytes("FLOAT32") == 4
    assert dtype_bytes("half") == 2
    for fp8 in ("fp8", "fp8_e4m3", "fp8_e5m2"):
        assert DTYPE_BYTES[fp8] == 1
    with pytest.raises(ValueError):
        dtype_bytes("float64")


def test_cache_dtype_resolution(qwen):
    assert resolve_kv_dtype("auto", "float16") == "float16"
    assert resolve_kv_dtype("fp8", "bfloat16") == "fp8"
    assert qwen.with_cache_dtype("auto") == qwen
    assert qwen.with_cache_dtype("fp8").bytes_per_token == 6 * KiB
    assert qwen.with_layers(2).bytes_per_token == 1024


# --- number of blocks for a budget -------------------------------------------

@pytest.mark.parametrize("block_size, budget, expected", [
    (16, GiB, 5461),          # 2^30 // 8192 = 131072; // 24 = 5461 (5461.33)
    (16, 10 ** 8, 508),       # 10^8 // 8192 = 12207; // 24 = 508
    (1, 10 ** 8, 8138),       # 10^8 // 512 = 195312; // 24 = 8138
    (128, GiB, 682),          # 2^30 // 65536 = 16384; // 24 = 682
    (16, 196607, 0),          # one byte short of one page over all layers
    (16, 196608, 1),
    (16, 0, 0),
    (16, -5, 0),              # never negative
])
def test_num_blocks(qwen, block_size, budget, expected):
    assert num_blocks_for_budget(qwen, block_size, budget) == expected


def test_num_blocks_override(qwen):
    assert num_blocks_for_budget(qwen, 16, 10 ** 8, num_gpu_blocks_override=100) == 100
    # the override is not bounded by the budget, and 0 is an override too
    assert num_blocks_for_budget(qwen, 16, 10 ** 8, num_gpu_blocks_override=10_000) == 10_000
    assert num_blocks_for_budget(qwen, 16, 10 ** 8, num_gpu_blocks_override=0) == 0


@given(layers=st.integers(1, 100), heads=st.integers(1, 64), head=st.sampled_from([64, 80, 128, 256]),
       dtype=st.sampled_from(["float32", "bfloat16", "fp8"]),
       block=st.sampled_from([1, 8, 16, 32, 64, 128]), budget=st.integers(0, 1 << 40))
def test_num_blocks_is_whole_pages_of_all_layers(layers, heads, head, dtype, block, budget):
    shape = ModelShape(layers, heads, head, dtype)
    n = num_blocks_for_budget(shape, block, budget)
    assert n == budget // shape.page_size_bytes_all_layers(block)
    assert n * shape.page_size_bytes_all_layers(block) <= budget


# --- the full layout ---------------------------------------------------------

def test_layout_seed_one_gib(qwen):
    lay = kv_cache_layout(qwen, 16, GiB, max_model_len=2048)
    assert isinstance(lay, KVCacheLayout)
    assert lay.num_blocks == 5461
    assert lay.page_size_bytes == 8192
    assert lay.num_tensors == 24
    assert lay.tensor_size_bytes == 5461 * 8192 == 44736512
    assert lay.tensor_shape == (2, 5461, 16, 2, 64)
    assert lay.total_bytes == 44736512 * 24 == 1073676288 <= GiB
    assert lay.num_tokens == 5461 * 16 == 87376
    assert lay.allocatable_blocks == 5460
    assert lay.blocks_per_max_len_request == 128
    assert lay.max_concurrency == pytest.approx(5461 / 128)


def test_tensor_shape_matches_size(qwen):
    for dtype in ("bfloat16", "float32", "fp8"):
        s = qwen.with_cache_dtype(dtype)
        lay = kv_cache_layout(s, 32, 50 * MiB, max_model_len=512)
        elems = 1
        for d in lay.tensor_shape:
            elems *= d
        assert elems * s.dtype_bytes == lay.tensor_size_bytes
    assert kv_cache_tensor_shape(7, 16, 8, 128) == (2, 7, 16, 8, 128)


def test_layout_override_grows_past_budget(qwen):
    lay = kv_cache_layout(qwen, 16, 25 * MiB, max_model_len=2048, num_gpu_blocks_override=1000)
    assert lay.num_blocks == 1000
    assert lay.tensor_size_bytes == 1000 * 8192
    assert lay.total_bytes > 25 * MiB


# --- start-up check: one max_model_len request must fit -----------------------

@pytest.mark.parametrize("block_size, max_model_len, need", [
    (16, 2048, 128 * 196608),      # 24 MiB
    (16, 100, 7 * 196608),         # 100 tokens round up to 7 pages
    (1, 100, 100 * 12288),
    (128, 2048, 16 * 1572864),     # 24 MiB again
    (128, 129, 2 * 1572864),
])
def test_min_bytes_for_max_model_len(qwen, block_size, max_model_len, need):
    assert min_bytes_for_max_model_len(qwen, block_size, max_model_len) == need


def test_min_bytes_dcp(qwen):
    # each of 2 decode-context-parallel ranks keeps 1024 of the 2048 tokens
    assert min_bytes_for_max_model_len(qwen, 16, 2048, dcp_world_size=2) == 12 * MiB
    assert min_bytes_for_max_model_len(qwen, 16, 2049, dcp_world_size=2) == 65 * 196608


def test_check_exact_fit_passes(qwen):
    check_enough_kv_cache_memory(qwen, 16, 2048, 24 * MiB)
    assert kv_cache_layout(qwen, 16, 24 * MiB, 2048).num_blocks == 128


def test_check_one_byte_short(qwen):
    with pytest.raises(NotEnoughKVCacheMemory) as exc:
        check_enough_kv_cache_memory(qwen, 16, 2048, 24 * MiB - 1)
    assert isinstance(exc.value, ValueError)
    assert exc.value.needed == 24 * MiB
    # 127 whole pages fit -> 127 * 16 tokens
    assert exc.value.estimated_max_len == 2032


@pytest.mark.parametrize("budget", [0, -1])
def test_check_no_memory(qwen, budget):
    with pytest.raises(NotEnoughKVCacheMemory):
        kv_cache_layout(qwen, 16, budget, 16)


@pytest.mark.parametrize("block_size, max_model_len, budget, expected", [
    (16, 2048, 24 * MiB - 1, 2032),
    (16, 2048, 100_000, 0),            # not even one page
    (16, 2048, GiB, 2048),             # fits: capped at max_model_len
    (1, 2048, 12288 * 1000 + 5, 1000),
    (128, 4096, 3 * 1572864, 384),
])
def test_estimate_max_model_len(qwen, block_size, max_model_len, budget, expected):
    assert estimate_max_model_len(qwen, block_size, max_model_len, budget) == expected


def test_null_page_held_back_from_the_check(qwen):
    """From 0.29.0 (startup_check_holds_back_null_page) the check plans without the null
    page: 2 pages and a bit are enough for one 32-token request under 0.11.0's rule, not
    under 0.29.0's; 3 pages are enough for both, and the pool is cut from the whole budget."""
    page = 16 * 12288
    kv_cache_layout(qwen, 16, 2 * page + 6784, 32)
    with pytest.raises(NotEnoughKVCacheMemory) as exc:
        kv_cache_layout(qwen, 16, 2 * page + 6784, 32, null_page_held_back=True)
    assert (exc.value.available, exc.value.estimated_max_len) == (page + 6784, 16)
    assert kv_cache_layout(qwen, 16, 3 * page, 32, null_page_held_back=True).num_blocks == 3
    with pytest.raises(NotEnoughKVCacheMemory) as exc:  # nothing left once the page is held
        kv_cache_layout(qwen, 16, page, 16, null_page_held_back=True)
    assert exc.value.estimated_max_len == 0


def test_no_layers_never_checked():
    check_enough_kv_cache_memory(ModelShape(0, 2, 64), 16, 2048, 0)


def test_cdiv():
    assert [cdiv(n, 16) for n in (0, 1, 15, 16, 17, 32)] == [0, 1, 1, 1, 2, 2]


# --- hybrid models (reference.kv_sizing_hybrid), by hand-computed numbers -------------------

from reference import kv_sizing_hybrid as H  # noqa: E402

MODELS = ROOT / "fixtures" / "models"


def _groups(layout):
    return [(g.spec.kind, g.spec.block_size, g.spec.sliding_window, g.spec.attention_chunk_size,
             len(g.layer_names)) for g in layout.groups]


def test_gemma3_layers_and_groups():
    m = H.HybridModel.load(MODELS / "gemma-3-1b")
    specs = m.layer_specs(16, 2048)
    kinds = [s.kind for s in specs.values()]
    assert kinds.count(H.SLIDING_WINDOW) == 22 and kinds.count(H.FULL) == 4
    assert [n for n, s in specs.items() if s.kind == H.FULL] == \
        [f"model.layers.{i}.self_attn.attn" for i in (5, 11, 17, 23)]
    assert {s.page_size_bytes for s in specs.values()} == {2 * 1 * 256 * 2 * 16}  # 16 KiB
    lay = H.hybrid_layout(specs, GiB, 2048, 2048)
    # smallest kind: 4 full layers; 22 sliding layers -> 6 groups (2 padding slots)
    assert _groups(lay) == [("sliding_window", 16, 512, None, n) for n in (4, 4, 4, 4, 3, 3)] + \
        [("full", 16, None, None, 4)]
    assert lay.groups[0].layer_names[:3] == ("model.layers.0.self_attn.attn",
                                             "model.layers.7.self_attn.attn",
                                             "model.layers.14.self_attn.attn")
    assert lay.num_blocks == GiB // (16 * KiB) // 4 == 16384
    assert [len(t.shared_by) for t in lay.tensors] == [7, 7, 7, 5]
    assert {t.size for t in lay.tensors} == {16384 * 16 * KiB}


def test_gemma3_need_and_manager_off():
    m = H.HybridModel.load(MODELS / "gemma-3-1b")
    specs = m.layer_specs(16, 16384)
    page = 16 * KiB
    # full: 16384 / 16 pages; sliding: min(511 + 2048, 16384) = 2559 tokens -> 160 pages + 1
    assert H.request_need(specs, 16384, 2048) == 4 * 1024 * page + 22 * 161 * page
    off = H.hybrid_layout(specs, GiB, 16384, 2048, hybrid_manager=False)
    assert _groups(off) == [("full", 16, 512, None, 26)]  # one group: windows sized as full
    assert off.num_blocks == GiB // page // 26 and len(off.tensors) == 26
    with pytest.raises(NotEnoughKVCacheMemory) as exc:
        H.hybrid_layout(specs, 64 * MiB, 16384, 2048)
    assert exc.value.estimated_max_len == H.estimate_max_model_len(specs, 16384, 2048, 64 * MiB)
    assert H.request_need(specs, exc.value.estimated_max_len, 2048) <= 64 * MiB
    assert H.request_need(specs, exc.value.estimated_max_len + 1, 2048) > 64 * MiB


def test_llama4_chunked_local_and_manager_setting():
    m = H.HybridModel.load(MODELS / "llama-4-scout")
    specs = m.layer_specs(16, 2048)
    full = [n for n, s in specs.items() if s.kind == H.FULL]
    assert full == [f"language_model.model.layers.{i}.self_attn.attn" for i in range(3, 48, 4)]
    assert not H.hybrid_manager_on(m.cfg)  # chunked local: off unless allowed
    assert H.hybrid_manager_on(m.cfg, allow_chunked_local_with_hybrid=True)
    off = H.hybrid_layout(specs, GiB, 2048, 2048, hybrid_manager=False)
    assert _groups(off) == [("full", 16, None, 8192, 48)]
    on = H.hybrid_layout(specs, GiB, 2048, 2048, hybrid_manager=True)
    assert _groups(on) == [("chunked_local", 16, None, 8192, 12)] * 3 + [("full", 16, None, None, 12)]
    page = 2 * 8 * 128 * 2 * 16
    assert on.num_blocks == GiB // page // 12 == 1365
    # chunked: min(8192 + 2048, 16384) tokens
    assert H.request_need(m.layer_specs(16, 16384), 16384, 2048) == \
        12 * 1024 * page + 36 * 640 * page


def test_granite_mamba_block_size_and_padding():
    m = H.HybridModel.load(MODELS / "granite-4.0-h-tiny")
    state = (3 * (2 * 1536 + 2 * 128) + 48 * 64 * 128) * 2
    assert state == 806400
    assert m.attention_block_size(16) == 16 * -(-state // (16 * 2048)) == 400
    assert m.attention_block_size(512) == 512
    specs = m.layer_specs(16, 2048)
    assert {(s.kind, s.block_size, s.page_size_bytes) for s in specs.values()} == \
        {("full", 400, 819200), ("mamba", 2048, 819200)}
    assert list(specs)[:4] == [f"model.layers.{i}.self_attn.attn" for i in (5, 15, 25, 35)]
    lay = H.hybrid_layout(specs, GiB, 2048, 2048)
    assert _groups(lay) == [("full", 400, None, None, 4)] + [("mamba", 2048, None, None, 4)] * 9
    assert lay.num_blocks == GiB // 819200 // 4 == 327
    assert H.request_need(specs, 2048, 2048) == 4 * 6 * 819200 + 36 * 819200
    with pytest.raises(H.CannotUnifyKVCacheSpecs):
        H.hybrid_layout(specs, GiB, 2048, 2048, hybrid_manager=False)


def test_full_attention_models_are_not_hybrid():
    for name in ("qwen2.5-0.5b", "qwen3-0.6b", "opt-125m"):
        assert not H.is_hybrid_config(H.HybridModel.load(MODELS / name).cfg)
    qwen = H.HybridModel.load(QWEN_DIR)
    lay = H.hybrid_layout(qwen.layer_specs(16, 2048), GiB, 2048, 2048)
    ref = kv_cache_layout(ModelShape.load(QWEN_DIR), 16, GiB, 2048)
    assert lay.num_blocks == ref.num_blocks and len(lay.tensors) == ref.num_tensors


def test_flash_tensor_packs_k_and_v_in_the_last_axis_from_0_26_0():
    """kv_packed_in_last_dim: no K/V axis; the heads before the tokens; same elements."""
    import json

    from harness.engines.reference_engine import ReferenceEngine
    from harness.formats.paths import STREAMS_DIR
    from harness.formats.stream import parse_stream
    stream = parse_stream(json.loads((STREAMS_DIR / "kv_pool_from_memory.json").read_text()))
    shapes = {}
    for release in ("0.25.1", "0.26.0"):
        engine = ReferenceEngine(release)
        engine.start(stream)
        shapes[release] = engine.kv_cache_header()["tensor_shape"]
    assert shapes == {"0.25.1": [8, 2, 16, 2, 64], "0.26.0": [8, 2, 16, 128]}
    assert flash_attention_shape(8, 8, 2, 64, kv_in_last_dim=True) is None  # 16s only
