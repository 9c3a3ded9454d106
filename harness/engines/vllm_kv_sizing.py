"""vLLM's own start-up KV sizing, called on the CPU and answered in plain values.

The reference's ``reference.kv_sizing`` is compared with these answers
(``tests/test_kv_sizing_conformance.py``, ``harness.kv_sizing_check`` in ``make
conformance``), and the seed table of a vLLM run takes its KB figures from
them.  vLLM's objects are built offline: one ``FullAttentionSpec`` per layer,
a ``VllmConfig`` from a bundled model config (only ``max_model_len`` and the
model dtype matter to the sizing code), and then ``get_kv_cache_configs``,
``get_num_blocks``, ``check_enough_kv_cache_memory`` and
``estimate_max_model_len`` are called as vLLM's engine calls them at start-up.
Nothing here returns a vLLM or torch object: every answer is an int, a string,
a tuple or a dict of those.
"""

from __future__ import annotations

import types
from pathlib import Path
from typing import Any

from harness.engines import vllm_env  # before vLLM is imported
import torch  # noqa: E402
from vllm.config import CacheConfig, DeviceConfig, ModelConfig, VllmConfig  # noqa: E402
try:
    from vllm.utils import get_dtype_size, get_kv_cache_torch_dtype  # noqa: E402
except ImportError:  # 0.11.1 and later
    from vllm.utils.torch_utils import get_dtype_size, get_kv_cache_torch_dtype  # noqa: E402
from vllm.v1 import kv_cache_interface as kvi  # noqa: E402
from vllm.v1.attention.backends.flash_attn import FlashAttentionBackend  # noqa: E402
from vllm.v1.core import kv_cache_utils as ku  # noqa: E402
from vllm.v1.core.block_pool import BlockPool  # noqa: E402

from harness.engines import vllm_compat as compat  # noqa: E402

vllm_env.quiet_vllm_logs()


class VllmKVSizing:
    """vLLM's sizing functions for a model config folder, with configs cached per key."""

    def __init__(self, model_dir: Path):
        self.model_dir = model_dir
        self._model_configs: dict = {}
        self._vllm_configs: dict = {}

    # -- configs ------------------------------------------------------------------------

    def _model_config(self, model_dtype: str, max_model_len: int) -> ModelConfig:
        key = (model_dtype, max_model_len)
        if key not in self._model_configs:
            self._model_configs[key] = ModelConfig(
                model=str(self.model_dir), skip_tokenizer_init=True, max_model_len=max_model_len,
                dtype=model_dtype)
        mc = self._model_configs[key]
        # estimate_max_model_len rewrites max_model_len in place; undo any leftovers.
        mc.max_model_len = max_model_len
        return mc

    def _vllm_config(self, model_dtype: str, cache_dtype: str, block_size: int,
                     max_model_len: int, override: int | None = None) -> VllmConfig:
        key = (model_dtype, cache_dtype, block_size, max_model_len, override)
        mc = self._model_config(model_dtype, max_model_len)
        if key not in self._vllm_configs:
            cc = CacheConfig(block_size=block_size, cache_dtype=cache_dtype,
                             num_gpu_blocks_override=override)
            vc = VllmConfig(model_config=mc, cache_config=cc, device_config=DeviceConfig("cpu"))
            if (vc.cache_config.block_size, vc.model_config.max_model_len) != (block_size, max_model_len):
                raise RuntimeError("vLLM changed the block size or max_model_len it was given")
            self._vllm_configs[key] = vc
        return self._vllm_configs[key]

    def _kv_dtype(self, model_dtype: str, cache_dtype: str) -> torch.dtype:
        """The torch dtype the model runner stores this KV cache in."""
        return get_kv_cache_torch_dtype(cache_dtype, getattr(torch, model_dtype))

    def _specs(self, num_layers: int, block_size: int, heads: int, head_size: int,
               model_dtype: str, cache_dtype: str) -> dict[str, Any]:
        spec = kvi.FullAttentionSpec(block_size=block_size, num_kv_heads=heads, head_size=head_size,
                                     dtype=self._kv_dtype(model_dtype, cache_dtype))
        return {f"model.layers.{i}.self_attn.attn": spec for i in range(num_layers)}

    # -- the model ------------------------------------------------------------------------

    def model_shape(self, model_dtype: str, max_model_len: int) -> tuple[int, int, int, str]:
        """(layers, KV heads, head size, dtype name) as vLLM reads the bundled config
        (``model_dtype`` "auto": the dtype vLLM picks from the config)."""
        vc = self._vllm_config(model_dtype, "auto", 16, max_model_len)
        mc, pc = vc.model_config, vc.parallel_config
        return (mc.get_num_layers(pc), mc.get_num_kv_heads(pc), mc.get_head_size(),
                str(mc.dtype).removeprefix("torch."))

    def model_kv_sizes(self, block_size: int, max_model_len: int) -> tuple[int, int]:
        """(bytes per token, bytes per ``block_size``-token page), both over all layers.

        The model is read as vLLM's ModelConfig reads it (dtype "auto", KV cache "auto"); the
        sizes are its FullAttentionSpec's ``page_size_bytes`` (a one-token page for the
        first) times its layers.  Nothing is cached: a patched spec is seen at once.
        """
        layers, heads, head_size, dtype = self.model_shape("auto", max_model_len)
        per_token = self.page_size_bytes(1, heads, head_size, dtype, "auto")
        page = self.page_size_bytes(block_size, heads, head_size, dtype, "auto")
        return per_token * layers, page * layers

    def kv_dtype_size(self, model_dtype: str, cache_dtype: str) -> int:
        return get_dtype_size(self._kv_dtype(model_dtype, cache_dtype))

    # -- pages and the need of one request --------------------------------------------------

    def page_size_bytes(self, block_size: int, heads: int, head_size: int, model_dtype: str,
                        cache_dtype: str) -> int:
        """One layer's page."""
        spec = next(iter(self._specs(1, block_size, heads, head_size, model_dtype,
                                     cache_dtype).values()))
        return spec.page_size_bytes

    def request_need(self, num_layers: int, block_size: int, heads: int, head_size: int,
                     model_dtype: str, cache_dtype: str, max_model_len: int) -> tuple[int, int]:
        """(one layer's spec answer x layers, kv_cache_utils' answer over all layers)."""
        specs = self._specs(num_layers, block_size, heads, head_size, model_dtype, cache_dtype)
        vc = self._vllm_config(model_dtype, cache_dtype, block_size, max_model_len)
        spec = next(iter(specs.values()))
        return (spec.max_memory_usage_bytes(vc) * num_layers,
                ku.max_memory_usage_bytes(vc, specs.values()))

    def request_need_with_dcp(self, block_size: int, heads: int, head_size: int,
                              max_model_len: int, dcp: int) -> int:
        """One bf16 layer's need under decode context parallelism of ``dcp``."""
        spec = next(iter(self._specs(1, block_size, heads, head_size, "bfloat16",
                                     "auto").values()))
        # only these two fields are read by FullAttentionSpec.max_memory_usage_bytes
        cfg = types.SimpleNamespace(
            model_config=types.SimpleNamespace(max_model_len=max_model_len),
            parallel_config=types.SimpleNamespace(decode_context_parallel_size=dcp,
                                                  prefill_context_parallel_size=1))  # 0.12.0
        return spec.max_memory_usage_bytes(cfg)

    # -- the start-up sizing ---------------------------------------------------------------

    def kv_cache_config(self, model_dtype: str, cache_dtype: str, block_size: int,
                        num_layers: int, heads: int, head_size: int, max_model_len: int,
                        budget: int, override: int | None = None) -> dict[str, Any]:
        """What ``get_kv_cache_configs`` makes of ``budget`` bytes, and what follows from it."""
        vc = self._vllm_config(model_dtype, cache_dtype, block_size, max_model_len, override)
        specs = self._specs(num_layers, block_size, heads, head_size, model_dtype, cache_dtype)
        (cfg,) = ku.get_kv_cache_configs(vc, [specs], [budget])
        page = next(iter(specs.values())).page_size_bytes
        out = {
            "num_blocks": cfg.num_blocks,
            "get_num_blocks": ku.get_num_blocks(vc, num_layers, budget, page),
            "group_page_sizes": [g.kv_cache_spec.page_size_bytes for g in cfg.kv_cache_groups],
            "tensor_sizes": [t.size for t in cfg.kv_cache_tensors],
            "tensor_shared_by": [list(t.shared_by) for t in cfg.kv_cache_tensors],
            "layer_names": list(specs),
            "runner_blocks": cfg.kv_cache_tensors[0].size // page,
            "max_concurrency": (ku.get_max_concurrency_for_kv_cache_config(vc, cfg)
                                if cfg.num_blocks else None),
            "tensor_shape": None,
            "viewed_shape": None,
        }
        try:
            shape = tuple(FlashAttentionBackend.get_kv_cache_shape(
                cfg.num_blocks, block_size, heads, head_size))
        except ValueError:
            return out  # the backend refuses this block size
        raw = torch.empty(cfg.kv_cache_tensors[0].size, dtype=torch.int8, device="meta")
        out["tensor_shape"] = shape
        out["viewed_shape"] = tuple(raw.view(self._kv_dtype(model_dtype, cache_dtype)).view(shape).shape)
        return out

    def startup_error(self, model_dtype: str, cache_dtype: str, block_size: int, num_layers: int,
                      heads: int, head_size: int, max_model_len: int, budget: int) -> str | None:
        """The message of the ValueError vLLM raises at start-up for ``budget``, or None."""
        vc = self._vllm_config(model_dtype, cache_dtype, block_size, max_model_len)
        specs = self._specs(num_layers, block_size, heads, head_size, model_dtype, cache_dtype)
        try:
            ku.get_kv_cache_configs(vc, [specs], [budget])
        except ValueError as exc:
            return str(exc)
        finally:
            vc.model_config.max_model_len = max_model_len  # vLLM's bisection leaves it changed
        return None

    def estimate_max_model_len(self, block_size: int, num_layers: int, heads: int, head_size: int,
                               max_model_len: int, budget: int) -> tuple[int, bool]:
        """(vLLM's estimate for ``budget``, whether its start-up check accepts ``budget``), bf16."""
        vc = self._vllm_config("bfloat16", "auto", block_size, max_model_len)
        specs = self._specs(num_layers, block_size, heads, head_size, "bfloat16", "auto")
        try:
            estimate = ku.estimate_max_model_len(vc, specs, budget)
            vc.model_config.max_model_len = max_model_len
            try:
                ku.check_enough_kv_cache_memory(vc, specs, budget)
                fits = True
            except ValueError:
                fits = False
        finally:
            vc.model_config.max_model_len = max_model_len
        return estimate, fits

    def pool_free_blocks(self, num_blocks: int) -> int:
        """Free pages of a fresh vLLM BlockPool of ``num_blocks`` pages."""
        return BlockPool(num_blocks, enable_caching=True,
                         **compat.block_pool_kwargs(16)).get_num_free_blocks()
