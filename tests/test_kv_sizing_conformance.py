"""reference.kv_sizing against vLLM 0.11.0's own sizing functions, on CPU.

vLLM's objects are built offline: FullAttentionSpec per layer, a VllmConfig
from the Qwen2.5-0.5B fixture (only max_model_len and the model dtype matter
to the sizing code), and then get_kv_cache_configs / get_num_blocks /
check_enough_kv_cache_memory / estimate_max_model_len are called directly.
vLLM is imported inside the ``vl`` fixture so that collection works without it.
"""

from __future__ import annotations

import itertools
import os
import re
import types
from pathlib import Path

import pytest

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

ROOT = Path(__file__).resolve().parent.parent
QWEN_DIR = ROOT / "fixtures" / "models" / "qwen2.5-0.5b"
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


class _Vllm:
    """vLLM handles plus cached config builders for one test module."""

    def __init__(self):
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        import torch
        from vllm.config import CacheConfig, DeviceConfig, ModelConfig, VllmConfig
        from vllm.utils import get_dtype_size, get_kv_cache_torch_dtype
        from vllm.v1 import kv_cache_interface as kvi
        from vllm.v1.core import kv_cache_utils as ku
        from vllm.v1.core.block_pool import BlockPool
        from vllm.v1.attention.backends.flash_attn import FlashAttentionBackend

        self.torch, self.kvi, self.ku = torch, kvi, ku
        self.get_dtype_size, self.get_kv_cache_torch_dtype = get_dtype_size, get_kv_cache_torch_dtype
        self.BlockPool, self.FlashAttentionBackend = BlockPool, FlashAttentionBackend
        self._classes = (CacheConfig, DeviceConfig, ModelConfig, VllmConfig)
        self._model_configs: dict = {}
        self._vllm_configs: dict = {}

    def model_config(self, model_dtype: str, max_model_len: int):
        key = (model_dtype, max_model_len)
        if key not in self._model_configs:
            ModelConfig = self._classes[2]
            self._model_configs[key] = ModelConfig(
                model=str(QWEN_DIR), skip_tokenizer_init=True, max_model_len=max_model_len,
                dtype=model_dtype)
        mc = self._model_configs[key]
        # estimate_max_model_len rewrites max_model_len in place; undo any leftovers.
        mc.max_model_len = max_model_len
        return mc

    def vllm_config(self, model_dtype: str, cache_dtype: str, block_size: int,
                    max_model_len: int, override: int | None = None):
        key = (model_dtype, cache_dtype, block_size, max_model_len, override)
        mc = self.model_config(model_dtype, max_model_len)
        if key not in self._vllm_configs:
            CacheConfig, DeviceConfig, _, VllmConfig = self._classes
            cc = CacheConfig(block_size=block_size, cache_dtype=cache_dtype,
                             num_gpu_blocks_override=override)
            vc = VllmConfig(model_config=mc, cache_config=cc, device_config=DeviceConfig("cpu"))
            assert vc.cache_config.block_size == block_size
            assert vc.model_config.max_model_len == max_model_len
            self._vllm_configs[key] = vc
        return self._vllm_configs[key]

    def kv_dtype(self, model_dtype: str, cache_dtype: str):
        """The torch dtype the model runner stores this KV cache in."""
        mc_dtype = getattr(self.torch, model_dtype)
        return self.get_kv_cache_torch_dtype(cache_dtype, mc_dtype)

    def specs(self, num_layers: int, block_size: int, heads: int, head_size: int, dtype):
        spec = self.kvi.FullAttentionSpec(block_size=block_size, num_kv_heads=heads,
                                          head_size=head_size, dtype=dtype)
        return {f"model.layers.{i}.self_attn.attn": spec for i in range(num_layers)}


@pytest.fixture(scope="module")
def vl() -> _Vllm:
    return _Vllm()


def _ref_shape(layers, heads, head_size, model_dtype, cache_dtype) -> ModelShape:
    return ModelShape(layers, heads, head_size, model_dtype).with_cache_dtype(cache_dtype)


# --- the fixture model and the seed numbers ----------------------------------

def test_fixture_shape_matches_model_config(vl):
    vc = vl.vllm_config("bfloat16", "auto", 16, 2048)
    mc, pc = vc.model_config, vc.parallel_config
    ref = ModelShape.load(QWEN_DIR)
    assert (ref.num_layers, ref.num_kv_heads, ref.head_size) == (
        mc.get_num_layers(pc), mc.get_num_kv_heads(pc), mc.get_head_size())
    assert mc.dtype == getattr(vl.torch, ref.dtype)


def test_seed_numbers_in_vllm(vl):
    ref = ModelShape.load(QWEN_DIR)
    specs = vl.specs(ref.num_layers, 16, ref.num_kv_heads, ref.head_size, vl.torch.bfloat16)
    spec = next(iter(specs.values()))
    vc = vl.vllm_config("bfloat16", "auto", 16, 2048)
    assert spec.page_size_bytes == ref.page_size_bytes(16) == 8192
    assert spec.page_size_bytes * ref.num_layers == ref.page_size_bytes_all_layers(16) == 192 * 1024
    need = vl.ku.max_memory_usage_bytes(vc, specs.values())
    assert need == min_bytes_for_max_model_len(ref, 16, 2048) == ref.contiguous_bytes(2048) == 24 << 20


# --- dtype resolution, page size, per-request need ---------------------------

@pytest.mark.parametrize("block_size", BLOCK_SIZES, ids=lambda b: f"bs{b}")
@pytest.mark.parametrize("model_dtype, cache_dtype", DTYPES,
                         ids=[_dtype_id(*d) for d in DTYPES])
def test_page_size_and_request_need(vl, model_dtype, cache_dtype, block_size):
    torch_dtype = vl.kv_dtype(model_dtype, cache_dtype)
    assert vl.get_dtype_size(torch_dtype) == dtype_bytes(resolve_kv_dtype(cache_dtype, model_dtype))
    for heads, head_size in HEADS:
        ref = _ref_shape(3, heads, head_size, model_dtype, cache_dtype)
        specs = vl.specs(3, block_size, heads, head_size, torch_dtype)
        spec = next(iter(specs.values()))
        assert spec.page_size_bytes == ref.page_size_bytes(block_size)
        for mml in MAX_LENS:
            vc = vl.vllm_config(model_dtype, cache_dtype, block_size, mml)
            assert spec.max_memory_usage_bytes(vc) * 3 == \
                vl.ku.max_memory_usage_bytes(vc, specs.values()) == \
                min_bytes_for_max_model_len(ref, block_size, mml)


@pytest.mark.parametrize("dcp", [2, 3, 4])
@pytest.mark.parametrize("block_size", [1, 16, 64])
def test_request_need_with_dcp(vl, dcp, block_size):
    ref = ModelShape(24, 2, 64, "bfloat16")
    spec = next(iter(vl.specs(1, block_size, 2, 64, vl.torch.bfloat16).values()))
    for mml in (100, 2048, 2049, 4097):
        # only these two fields are read by FullAttentionSpec.max_memory_usage_bytes
        cfg = types.SimpleNamespace(
            model_config=types.SimpleNamespace(max_model_len=mml),
            parallel_config=types.SimpleNamespace(decode_context_parallel_size=dcp))
        assert spec.max_memory_usage_bytes(cfg) * 24 == \
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
    torch = vl.torch
    ref = _ref_shape(layers, heads, head, md, cd)
    budget = _budget(ref, bs, mml, extra)
    vc = vl.vllm_config(md, cd, bs, mml, override)
    kv_dtype = vl.kv_dtype(md, cd)
    specs = vl.specs(layers, bs, heads, head, kv_dtype)

    (cfg,) = vl.ku.get_kv_cache_configs(vc, [specs], [budget])
    lay = kv_cache_layout(ref, bs, budget, mml, num_gpu_blocks_override=override)

    page = next(iter(specs.values())).page_size_bytes
    assert vl.ku.get_num_blocks(vc, layers, budget, page) == \
        num_blocks_for_budget(ref, bs, budget, override)
    assert cfg.num_blocks == lay.num_blocks
    if override is None:
        assert lay.total_bytes <= budget
        expected_min = {"0": lay.blocks_per_max_len_request,
                        "page-1": lay.blocks_per_max_len_request}.get(extra)
        if expected_min is not None:  # the minimum budget gives exactly one request's pages
            assert cfg.num_blocks == expected_min
    assert len(cfg.kv_cache_groups) == 1
    assert cfg.kv_cache_groups[0].kv_cache_spec.page_size_bytes == lay.page_size_bytes
    assert len(cfg.kv_cache_tensors) == lay.num_tensors == layers
    assert [t.size for t in cfg.kv_cache_tensors] == [lay.tensor_size_bytes] * layers
    assert [t.shared_by for t in cfg.kv_cache_tensors] == [[n] for n in specs]
    assert sum(t.size for t in cfg.kv_cache_tensors) == lay.total_bytes

    if lay.num_blocks:
        assert vl.ku.get_max_concurrency_for_kv_cache_config(vc, cfg) == lay.max_concurrency

    # The model runner's reshape: raw bytes -> KV dtype -> backend shape.
    runner_blocks = cfg.kv_cache_tensors[0].size // page
    assert runner_blocks == lay.num_blocks
    if bs % 16 == 0:
        shape = vl.FlashAttentionBackend.get_kv_cache_shape(lay.num_blocks, bs, heads, head)
        assert tuple(shape) == lay.tensor_shape
        raw = torch.empty(cfg.kv_cache_tensors[0].size, dtype=torch.int8, device="meta")
        assert tuple(raw.view(kv_dtype).view(shape).shape) == lay.tensor_shape
    else:
        with pytest.raises(ValueError):
            vl.FlashAttentionBackend.get_kv_cache_shape(lay.num_blocks, bs, heads, head)

    # Block 0 is the null block: the pool hands out one fewer.
    if 0 < lay.num_blocks <= 20_000:
        pool = vl.BlockPool(lay.num_blocks, enable_caching=True)
        assert pool.get_num_free_blocks() == lay.allocatable_blocks


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
    vc = vl.vllm_config(md, cd, bs, mml)
    specs = vl.specs(layers, bs, heads, head, vl.kv_dtype(md, cd))
    try:
        with pytest.raises(ValueError) as vexc:
            vl.ku.get_kv_cache_configs(vc, [specs], [budget])
    finally:
        vc.model_config.max_model_len = mml  # vLLM's bisection leaves it changed
    with pytest.raises(NotEnoughKVCacheMemory) as rexc:
        kv_cache_layout(ref, bs, budget, mml)
    assert rexc.value.needed == need

    msg = str(vexc.value)
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
    vc = vl.vllm_config("bfloat16", "auto", block_size, mml)
    specs = vl.specs(24, block_size, 2, 64, vl.torch.bfloat16)
    page_all = ref.page_size_bytes_all_layers(block_size)
    budgets = [1, page_all - 1, page_all, page_all + 1, 3 * page_all - 1, 10 ** 7,
               min_bytes_for_max_model_len(ref, block_size, mml) - 1,
               min_bytes_for_max_model_len(ref, block_size, mml), GiB]
    try:
        for budget in budgets:
            vc.model_config.max_model_len = mml
            assert vl.ku.estimate_max_model_len(vc, specs, budget) == \
                estimate_max_model_len(ref, block_size, mml, budget), budget
            vc.model_config.max_model_len = mml
            fits = min_bytes_for_max_model_len(ref, block_size, mml) <= budget
            try:
                vl.ku.check_enough_kv_cache_memory(vc, specs, budget)
                vllm_ok = True
            except ValueError:
                vllm_ok = False
            try:
                check_enough_kv_cache_memory(ref, block_size, mml, budget)
                ref_ok = True
            except NotEnoughKVCacheMemory:
                ref_ok = False
            assert vllm_ok == ref_ok == fits, budget
    finally:
        vc.model_config.max_model_len = mml
