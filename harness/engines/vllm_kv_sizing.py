"""vLLM's own start-up KV sizing, called on the CPU and answered in plain values.

The reference's ``reference.kv_sizing`` is compared with these answers
(``tests/test_kv_sizing_conformance.py``, ``harness.checks.kv_sizing`` in ``make
conformance``), and the seed table of a vLLM run takes its KB figures from
them.  vLLM's objects are built offline: one ``FullAttentionSpec`` per layer,
a ``VllmConfig`` from a bundled model config (only ``max_model_len`` and the
model dtype matter to the sizing code), and then ``get_kv_cache_configs``,
``get_num_blocks``, ``check_enough_kv_cache_memory`` and
``estimate_max_model_len`` are called as vLLM's engine calls them at start-up.
Nothing here returns a vLLM or torch object: every answer is an int, a string,
a tuple or a dict of those.

Hybrid models (:meth:`VllmKVSizing.hybrid_sizing`: Gemma 3, Llama 4, Granite
4.0-H) are sized as on a CUDA GPU.  What is vLLM's own code: ``ModelConfig``
reading the bundled config (transformers' ``layer_types`` and
``no_rope_layers``); ``VllmConfig.__post_init__`` (whether the hybrid KV cache
manager stays on, ``HybridAttentionMambaModelConfig`` raising the attention
block size and padding the Mamba page, ``MambaModelConfig`` turning prefix
caching off); the model class's ``get_mamba_state_shape_from_config`` and
``get_mamba_state_dtype_from_config``; the spec classes (``FullAttentionSpec``,
``SlidingWindowSpec``, ``ChunkedLocalAttentionSpec``, ``MambaSpec``) with their
page sizes and needs; ``get_kv_cache_configs``, ``max_memory_usage_bytes``,
``estimate_max_model_len``, ``get_max_concurrency_for_kv_cache_config`` and
``generate_scheduler_kv_cache_config``.  Stand-ins, since the model itself is
not built (no weights, no GPU):

* the platform: ``current_platform.support_hybrid_kv_cache`` answers True, as
  CUDA's does (the CPU's answer would always turn the hybrid manager off);
* the per-layer specs that ``GPUModelRunner.get_kv_cache_spec`` reads from the
  built layers are built here from the config, by the same rules the model
  code applies (:func:`_layer_plan`): which layer is a sliding-window
  ``Attention`` (gemma3.py: ``layer_types[i] == "sliding_attention"``), a
  ``ChunkedLocalAttention`` (llama4.py: the layer uses RoPE and
  ``attention_chunk_size`` is set) or a ``MambaMixer2`` (granitemoehybrid.py:
  ``layer_types[i] == "mamba"``), the model-wide window ``CacheConfig`` gets
  (arg_utils.py: ``get_sliding_window()`` unless ``is_interleaved``), the layer
  names (``[language_model.]model.layers.<i>.self_attn.attn`` and
  ``model.layers.<i>.mixer``), ``mamba_type`` "mamba2" and
  ``num_speculative_blocks`` 0 (vLLM refuses drafts with Mamba layers here);
* one GPU: no tensor or pipeline parallelism.
"""

from __future__ import annotations

import copy
import os
import types
from contextlib import contextmanager
from pathlib import Path
from unittest import mock
from typing import Any

from harness.engines import vllm_env  # before vLLM is imported
import torch  # noqa: E402
from vllm.config import (CacheConfig, DeviceConfig, ModelConfig, ParallelConfig,  # noqa: E402
                         SchedulerConfig, VllmConfig)
from vllm.model_executor.models import ModelRegistry  # noqa: E402
from vllm.platforms import current_platform  # noqa: E402
try:
    from vllm.transformers_utils.config import is_interleaved  # noqa: E402
except ImportError:  # 0.27.0: the engine arguments read layer_types themselves
    is_interleaved = None
try:
    from vllm.utils import get_dtype_size, get_kv_cache_torch_dtype  # noqa: E402
except ImportError:  # 0.11.1 and later
    from vllm.utils.torch_utils import get_dtype_size, get_kv_cache_torch_dtype  # noqa: E402
from vllm.v1 import kv_cache_interface as kvi  # noqa: E402
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
            # 0.29.0: the engine core resolves the KV cache layout before the sizing; the
            # layers here share one spec, so their specs do not narrow the choice.
            compat.resolve_kv_cache_layout(vc, ())
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
        mc, pc = self._model_config(model_dtype, max_model_len), ParallelConfig()
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
        (cfg,) = compat.kv_cache_configs(vc, [specs], [budget])
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
        shape = compat.flash_attention_kv_shape(cfg.num_blocks, next(iter(specs.values())))
        if shape is None:
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
            compat.kv_cache_configs(vc, [specs], [budget])
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

    # -- hybrid models (see the module docstring for what is vLLM's code here) ----------------

    def _hybrid_vllm_config(self, block_size: int, max_model_len: int, max_num_batched_tokens: int,
                            disable_hybrid: bool, allow_chunked_local: bool,
                            cache_dtype: str = "auto") -> VllmConfig:
        mc = copy.deepcopy(self._model_config("auto", max_model_len))
        mc.config_updated = False  # a fresh engine start: the model's config hooks run again
        sc = SchedulerConfig(max_model_len=max_model_len, max_num_batched_tokens=max_num_batched_tokens,
                             enable_chunked_prefill=True, is_encoder_decoder=False,
                             disable_hybrid_kv_cache_manager=disable_hybrid)
        window = _cache_sliding_window(mc)
        cc = CacheConfig(block_size=block_size, cache_dtype=cache_dtype, sliding_window=window)
        with _as_on_cuda(allow_chunked_local):
            vc = VllmConfig(model_config=mc, cache_config=cc, scheduler_config=sc,
                            device_config=DeviceConfig("cpu"))
        if vc.model_config.max_model_len != max_model_len:
            raise RuntimeError("vLLM changed the max_model_len it was given")
        return vc


    def _hybrid_specs(self, vc: VllmConfig) -> dict[str, Any]:
        """Each layer's KVCacheSpec as GPUModelRunner.get_kv_cache_spec makes it."""
        mc, cc = vc.model_config, vc.cache_config
        kv_dtype = self._kv_dtype(str(mc.dtype).removeprefix("torch."), cc.cache_dtype)
        heads, head_size = mc.get_num_kv_heads(vc.parallel_config), mc.get_head_size()
        attention, mamba = {}, {}
        for name, cls, window in _layer_plan(mc, cc.sliding_window):
            if cls == "MambaMixer2":
                model_cls, _ = ModelRegistry.resolve_model_cls(mc.architecture, model_config=mc)
                mamba[name] = kvi.MambaSpec(
                    shapes=model_cls.get_mamba_state_shape_from_config(vc),
                    dtypes=model_cls.get_mamba_state_dtype_from_config(vc),
                    block_size=mc.max_model_len, page_size_padded=cc.mamba_page_size_padded,
                    mamba_type="mamba2", num_speculative_blocks=0)
            elif window is not None:
                attention[name] = kvi.SlidingWindowSpec(
                    block_size=cc.block_size, num_kv_heads=heads, head_size=head_size,
                    dtype=kv_dtype, sliding_window=window)
            elif mc.attention_chunk_size is not None and cls == "ChunkedLocalAttention":
                attention[name] = kvi.ChunkedLocalAttentionSpec(
                    block_size=cc.block_size, num_kv_heads=heads, head_size=head_size,
                    dtype=kv_dtype, attention_chunk_size=mc.attention_chunk_size)
            else:
                attention[name] = kvi.FullAttentionSpec(
                    block_size=cc.block_size, num_kv_heads=heads, head_size=head_size, dtype=kv_dtype)
        return {**attention, **mamba}


    def is_hybrid(self) -> bool:
        """Whether any layer's spec is not plain full attention (the default CUDA settings)."""
        vc = self._hybrid_vllm_config(16, BUDGET_MAX_MODEL_LEN_PROBE, 2048, False, False)
        return any(type(s) is not kvi.FullAttentionSpec for s in self._hybrid_specs(vc).values())

    def hybrid_sizing(self, block_size: int, max_model_len: int, max_num_batched_tokens: int,
                      budgets: list[int], disable_hybrid: bool = False,
                      allow_chunked_local: bool = False) -> dict[str, Any]:
        """vLLM's start-up sizing of a (hybrid) model on one CUDA GPU, in plain values.

        ``disable_hybrid``: --disable-hybrid-kv-cache-manager; ``allow_chunked_local``:
        VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE=1.  Per budget: the KV cache
        config (or the start-up error) and the estimated longest length.
        """
        vc = self._hybrid_vllm_config(block_size, max_model_len, max_num_batched_tokens,
                                      disable_hybrid, allow_chunked_local)
        specs = self._hybrid_specs(vc)
        compat.resolve_kv_cache_layout(vc, specs.values())  # 0.29.0, as the engine core does
        out: dict[str, Any] = {
            "hybrid manager": not vc.scheduler_config.disable_hybrid_kv_cache_manager,
            "attention block size": vc.cache_config.block_size,
            "mamba page padded to": vc.cache_config.mamba_page_size_padded,
            "prefix caching turned off": vc.cache_config.enable_prefix_caching is False,
            "layer specs": sorted(((_spec_row(s)[:4] + (s.page_size_bytes,), n)
                               for s, n in _count(specs).items()), key=repr),
            "need": ku.max_memory_usage_bytes(vc, specs.values()),
            "budgets": {},
        }
        for budget in budgets:
            row: dict[str, Any] = {}
            try:
                row["estimate"] = ku.estimate_max_model_len(vc, dict(specs), budget)
            finally:
                vc.model_config.max_model_len = max_model_len
            try:
                (cfg,) = compat.kv_cache_configs(vc, [dict(specs)], [budget])
            except ValueError as exc:
                row["error"] = ("cannot unify" if "failed to convert" in str(exc)
                                else "not enough memory")
                out["budgets"][budget] = row
                continue
            finally:
                vc.model_config.max_model_len = max_model_len
            sched = ku.generate_scheduler_kv_cache_config([cfg])
            row.update({
                "num blocks": cfg.num_blocks,
                "group page sizes": [g.kv_cache_spec.page_size_bytes for g in cfg.kv_cache_groups],
                "groups": [_spec_row(g.kv_cache_spec) + (tuple(g.layer_names),)
                           for g in sched.kv_cache_groups],
                "tensors": [(t.size, tuple(t.shared_by)) for t in cfg.kv_cache_tensors],
                "max concurrency": (ku.get_max_concurrency_for_kv_cache_config(vc, cfg)
                                    if cfg.num_blocks else None),
            })
            out["budgets"][budget] = row
        return out



# -- hybrid models ------------------------------------------------------------------------------

def _cache_sliding_window(mc: ModelConfig) -> int | None:
    """CacheConfig.sliding_window as the engine arguments set it (arg_utils.py): the
    model's window unless its layers mix attention types (``is_interleaved``); where that
    helper is gone (0.27.0), unless ``layer_types`` names a layer that is not sliding."""
    if is_interleaved is not None:
        return None if is_interleaved(mc.hf_text_config) else mc.get_sliding_window()
    layer_types = getattr(mc.hf_text_config, "layer_types", None)
    if layer_types is None or all(t == "sliding_attention" for t in layer_types):
        return mc.get_sliding_window()
    return None


# The KV cache manager's name for each spec class.
_KINDS = {kvi.FullAttentionSpec: "full", kvi.SlidingWindowSpec: "sliding_window",
          kvi.ChunkedLocalAttentionSpec: "chunked_local", kvi.MambaSpec: "mamba"}
BUDGET_MAX_MODEL_LEN_PROBE = 2048
_ALLOW_CHUNKED = "VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE"


@contextmanager
def _as_on_cuda(allow_chunked_local: bool):
    """vLLM's config code as it runs on a CUDA GPU (stand-in: the platform's answer), with
    VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE set or not."""
    saved = os.environ.pop(_ALLOW_CHUNKED, None)
    if allow_chunked_local:
        os.environ[_ALLOW_CHUNKED] = "1"
    try:
        with mock.patch.object(current_platform, "support_hybrid_kv_cache", lambda: True):
            yield
    finally:
        os.environ.pop(_ALLOW_CHUNKED, None)
        if saved is not None:
            os.environ[_ALLOW_CHUNKED] = saved


def _layer_plan(mc: ModelConfig, cache_sliding_window: int | None) -> list[tuple[str, str, Any]]:
    """(layer name, layer class, sliding window) of every layer with a KV cache, in the order
    the model registers them (stand-in for building the model; see the module docstring)."""
    hf = mc.hf_text_config
    arch = mc.architecture
    n = hf.num_hidden_layers
    prefix = "language_model." if arch == "Llama4ForConditionalGeneration" else ""
    plan = []
    for i in range(n):
        name = f"{prefix}model.layers.{i}"
        if arch == "Gemma3ForCausalLM":
            own = hf.sliding_window if hf.layer_types[i] == "sliding_attention" else None
            plan.append((f"{name}.self_attn.attn", "Attention",
                         own if own is not None else cache_sliding_window))
        elif arch in ("Llama4ForConditionalGeneration", "Llama4ForCausalLM"):
            chunked = hf.no_rope_layers[i] != 0 and hf.attention_chunk_size
            plan.append((f"{name}.self_attn.attn",
                         "ChunkedLocalAttention" if chunked else "Attention", cache_sliding_window))
        elif arch == "GraniteMoeHybridForCausalLM" and hf.layer_types[i] == "mamba":
            plan.append((f"{name}.mixer", "MambaMixer2", None))
        else:
            plan.append((f"{name}.self_attn.attn", "Attention", cache_sliding_window))
    return plan


def _spec_row(spec) -> tuple:
    """(kind, block size, sliding window, chunk size, speculative pages) of a spec."""
    return (_KINDS[type(spec)], spec.block_size, getattr(spec, "sliding_window", None),
            getattr(spec, "attention_chunk_size", None),
            getattr(spec, "num_speculative_blocks", 0))


def _count(specs: dict[str, Any]) -> dict[Any, int]:
    counts: dict[Any, int] = {}
    for s in specs.values():
        counts[s] = counts.get(s, 0) + 1
    return counts

