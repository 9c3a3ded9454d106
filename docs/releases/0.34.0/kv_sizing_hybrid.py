"""KV cache sizing of hybrid models: layers of several attention kinds, or Mamba layers.

Clean-room model of how vLLM 0.11.0 sizes the KV cache at start-up when a
model's layers do not all use plain full attention: Gemma 3 (sliding-window
layers between full ones), Llama 4 (chunked-local layers, every fourth layer
full) and Granite 4.0-H (Mamba-2 layers with a few full-attention ones).  The
uniform full-attention case, and the model shape fields, are in
``reference.kv_sizing``; this module reuses them.

Sized as on a CUDA GPU (the platform vLLM's users serve hybrid models on):
the hybrid KV cache manager is on unless the user turns it off, or the model
has chunked-local layers and VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE
is not set.  (On platforms without hybrid support vLLM always turns it off.)

Mirrors (vLLM 0.11.0):

* vllm/model_executor/models/gemma3.py, llama4.py, granitemoehybrid.py --
  which layer gets which attention kind, and the layer names
* vllm/attention/layer.py -- a layer's own window wins over the model-wide one
* vllm/engine/arg_utils.py -- the model-wide window is only set when the
  config does not interleave sliding and full layers
* vllm/v1/worker/gpu_model_runner.py -- get_kv_cache_spec (attention layers
  first, then Mamba layers; a Mamba layer's block is max_model_len tokens)
* vllm/model_executor/layers/mamba/mamba_utils.py -- Mamba-2 state shapes and dtypes
* vllm/model_executor/models/config.py -- HybridAttentionMambaModelConfig
  (attention block size raised so its page holds a Mamba state, Mamba page
  padded to the attention page), MambaModelConfig (no prefix caching)
* vllm/config/__init__.py -- VllmConfig.__post_init__ (when the hybrid
  manager is turned off)
* vllm/v1/kv_cache_interface.py -- page sizes and max_memory_usage_bytes of
  each spec kind, merging specs, UniformTypeKVCacheSpecs
* vllm/v1/core/kv_cache_utils.py -- check_enough_kv_cache_memory,
  estimate_max_model_len, unify_hybrid_kv_cache_specs, get_kv_cache_groups,
  _get_kv_cache_groups_uniform_page_size, get_kv_cache_config_from_groups,
  get_max_concurrency_for_kv_cache_config, generate_scheduler_kv_cache_config

Worked example (Gemma 3 1B, bf16, 16-token pages, hybrid manager on): 22
sliding-window layers (window 512) and 4 full ones, one KV head of 256, so
every layer's page is 2 x 1 x 256 x 2 B x 16 = 16 KiB.  The smallest kind has
4 layers, so the groups hold 4 layers each: the 22 sliding layers make 6
groups (two of 3 layers: 2 padding slots), the 4 full layers one.  4 tensors,
each shared by one layer of every group; 1 GiB gives 1 GiB // 16 KiB // 4 =
16384 pages.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path

from reference.arith import cdiv
from reference.kv_sizing import (GiB, ModelShape, NotEnoughKVCacheMemory, dtype_bytes,
                                 override_num_blocks)

# Attention kinds, as the KV cache manager knows them.
FULL = "full"
SLIDING_WINDOW = "sliding_window"
CHUNKED_LOCAL = "chunked_local"
MAMBA = "mamba"


class CannotUnifyKVCacheSpecs(ValueError):
    """The hybrid manager is off but the layers cannot be made one kind (vLLM raises ValueError)."""


# -- one layer's KV cache ------------------------------------------------------------------

@dataclass(frozen=True)
class LayerSpec:
    """What one layer keeps per request, as the model runner states it.

    Attention layers: ``kv_heads`` x ``head_size`` in ``dtype``; a FULL layer
    may carry the window or chunk of the layer it stood in for when the
    hybrid manager is off (it is still sized as full attention).  Mamba
    layers: ``state_bytes`` of conv and SSM state, one page of ``block_size``
    = max_model_len tokens, padded to ``padded_page`` when that is set.
    """

    kind: str
    block_size: int
    kv_heads: int = 0
    head_size: int = 0
    dtype: str = "bfloat16"
    sliding_window: int | None = None
    attention_chunk_size: int | None = None
    state_bytes: int = 0
    padded_page: int | None = None
    num_speculative_blocks: int = 0

    @property
    def page_size_bytes(self) -> int:
        if self.kind == MAMBA:
            return self.padded_page if self.padded_page is not None else self.state_bytes
        return 2 * self.block_size * self.kv_heads * self.head_size * dtype_bytes(self.dtype)

    def need_bytes(self, max_model_len: int, max_num_batched_tokens: int) -> int:
        """Memory one request of ``max_model_len`` tokens needs in this layer (whole pages)."""
        return attention_pages_needed(self, max_model_len, max_num_batched_tokens) \
            * self.page_size_bytes


def attention_pages_needed(spec: LayerSpec, max_model_len: int,
                           max_num_batched_tokens: int) -> int:
    """Pages one request of ``max_model_len`` tokens holds at most in a layer of ``spec``.

    Full: every token.  Sliding window: the window's tokens before the newest
    (window - 1) plus one step's tokens, at most max_model_len, and one page
    more because the window need not start at a page boundary.  Chunked
    local: a chunk plus one step's tokens, at most max_model_len.  Mamba: one
    page, whatever the length.
    """
    if spec.kind == MAMBA:
        return 1
    if spec.kind == SLIDING_WINDOW:
        tokens = min(spec.sliding_window - 1 + max_num_batched_tokens, max_model_len)
        return cdiv(tokens, spec.block_size) + 1
    if spec.kind == CHUNKED_LOCAL:
        tokens = min(spec.attention_chunk_size + max_num_batched_tokens, max_model_len)
        return cdiv(tokens, spec.block_size)
    return cdiv(max_model_len, spec.block_size)


# -- the model config: which layer is which ---------------------------------------------------

def text_config(cfg: dict) -> dict:
    """The language model's part of a config (a multimodal config nests it in text_config)."""
    return cfg.get("text_config", cfg)


def layer_name_prefix(cfg: dict) -> str:
    """A multimodal wrapper registers its language model's layers under "language_model."."""
    return "language_model." if "text_config" in cfg else ""


def config_layer_types(text: dict) -> list[str]:
    """Each layer's type, as transformers' config states it.

    A config may list them (``layer_types``).  Gemma 3 text configs without
    the list derive it: every ``sliding_window_pattern``-th layer (default 6)
    is full, the others slide.  Llama 4 derives it from ``no_rope_layers``
    (0 = a layer without RoPE, which attends fully; the others are chunked),
    itself derived when absent or empty: every fourth layer has no RoPE.
    Anything else: every layer full attention.
    """
    n = text["num_hidden_layers"]
    if text.get("layer_types"):
        return list(text["layer_types"])
    if text.get("model_type") == "gemma3_text":
        pattern = text.get("sliding_window_pattern", 6)
        return ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(n)]
    if text.get("attention_chunk_size") and text.get("model_type") == "llama4_text":
        return ["chunked_attention" if use_rope else "full_attention"
                for use_rope in llama4_rope_layers(text)]
    return ["full_attention"] * n


def llama4_rope_layers(text: dict) -> list[int]:
    """Llama 4's no_rope_layers: 1 where a layer uses RoPE; derived with interval 4 when empty."""
    given = text.get("no_rope_layers")
    if given:
        return list(given)
    interval = text.get("no_rope_layer_interval", 4)
    return [int((i + 1) % interval != 0) for i in range(text["num_hidden_layers"])]


def model_wide_window(text: dict, layer_types: list[str]) -> int | None:
    """The window every attention layer without its own gets.

    Only set when the config does not interleave sliding and full layers; a
    config that turns its window off (``use_sliding_window`` false) has none.
    """
    if {"sliding_attention", "full_attention"} <= set(layer_types):
        return None
    if text.get("use_sliding_window") is False:
        return None
    return text.get("sliding_window")


def layer_kinds(cfg: dict) -> list[tuple[int, str, int | None, int | None]]:
    """(layer index, kind, sliding window, chunk size) of every layer that keeps a KV cache."""
    text = text_config(cfg)
    types = config_layer_types(text)
    wide = model_wide_window(text, types)
    chunk = text.get("attention_chunk_size")
    out = []
    for i, t in enumerate(types):
        if t == "mamba":
            out.append((i, MAMBA, None, None))
            continue
        window = text.get("sliding_window") if t == "sliding_attention" else wide
        if window is not None:
            out.append((i, SLIDING_WINDOW, window, None))
        elif t == "chunked_attention" and chunk:
            out.append((i, CHUNKED_LOCAL, None, chunk))
        else:
            out.append((i, FULL, None, None))
    return out


def is_hybrid_config(cfg: dict) -> bool:
    """Whether any layer keeps something else than a plain full-attention KV cache."""
    return any(kind != FULL for _, kind, _, _ in layer_kinds(cfg))


def has_mamba(cfg: dict) -> bool:
    return any(kind == MAMBA for _, kind, _, _ in layer_kinds(cfg))


def has_chunked_local(cfg: dict) -> bool:
    return text_config(cfg).get("attention_chunk_size") is not None


# -- Mamba-2 state and the attention block size -------------------------------------------------

def mamba2_state_bytes(text: dict, dtype: str) -> int:
    """One Mamba-2 layer's state for one request: conv state plus SSM state (one GPU).

    Conv state: (d_conv - 1) x (expand x hidden + 2 x groups x d_state);
    SSM state: heads x head dim x d_state; both in the model dtype.
    """
    conv_dim = text["mamba_expand"] * text["hidden_size"] \
        + 2 * text["mamba_n_groups"] * text["mamba_d_state"]
    conv = (text["mamba_d_conv"] - 1) * conv_dim
    ssm = text["mamba_n_heads"] * text["mamba_d_head"] * text["mamba_d_state"]
    return (conv + ssm) * dtype_bytes(dtype)


def mamba_attention_block_size(block_size: int | None, attn_bytes_per_token: int,
                               mamba_page: int) -> int:
    """The attention block size of a Mamba hybrid: the user's, unless its page is smaller
    than a Mamba state; then the smallest multiple of 16 tokens whose page holds one."""
    needed = 16 * cdiv(mamba_page, 16 * attn_bytes_per_token)
    return needed if block_size is None or block_size < needed else block_size


def mamba_padded_page(attn_page: int, mamba_page: int) -> int | None:
    """The Mamba page is padded to the attention page, unless they are already equal."""
    return None if attn_page == mamba_page else attn_page


# -- the model's layer specs ----------------------------------------------------------------------

@dataclass(frozen=True)
class HybridModel:
    """A bundled config read for sizing: its shape and its layers' kinds."""

    cfg: dict
    shape: ModelShape  # attention KV heads, head size, model dtype (layers: all of them)

    @classmethod
    def from_hf_config(cls, cfg: dict) -> "HybridModel":
        return cls(cfg, ModelShape.from_hf_config(text_config(cfg)))

    @classmethod
    def load(cls, model_dir: str | Path) -> "HybridModel":
        return cls.from_hf_config(json.loads((Path(model_dir) / "config.json").read_text()))

    def attention_block_size(self, block_size: int, cache_dtype: str = "auto") -> int:
        """The block size attention layers get (raised for a Mamba hybrid)."""
        if not has_mamba(self.cfg):
            return block_size
        shape = self.shape.with_cache_dtype(cache_dtype)
        return mamba_attention_block_size(block_size, shape.bytes_per_token_per_layer,
                                          mamba2_state_bytes(text_config(self.cfg),
                                                             self.shape.dtype))

    def layer_specs(self, block_size: int, max_model_len: int, cache_dtype: str = "auto",
                    num_speculative_tokens: int = 0) -> dict[str, LayerSpec]:
        """Every layer's spec by layer name: attention layers in model order, then Mamba layers."""
        shape = self.shape.with_cache_dtype(cache_dtype)
        attn_block = self.attention_block_size(block_size, cache_dtype)
        prefix = layer_name_prefix(self.cfg)
        attention, mamba = {}, {}
        padded = None
        if has_mamba(self.cfg):
            state = mamba2_state_bytes(text_config(self.cfg), self.shape.dtype)
            padded = mamba_padded_page(attn_block * shape.bytes_per_token_per_layer, state)
        for i, kind, window, chunk in layer_kinds(self.cfg):
            if kind == MAMBA:
                mamba[f"{prefix}model.layers.{i}.mixer"] = LayerSpec(
                    MAMBA, max_model_len, dtype=self.shape.dtype,
                    state_bytes=mamba2_state_bytes(text_config(self.cfg), self.shape.dtype),
                    padded_page=padded, num_speculative_blocks=num_speculative_tokens)
            else:
                attention[f"{prefix}model.layers.{i}.self_attn.attn"] = LayerSpec(
                    kind, attn_block, shape.num_kv_heads, shape.head_size, shape.dtype,
                    sliding_window=window, attention_chunk_size=chunk)
        return {**attention, **mamba}


def hybrid_manager_on(cfg: dict, disable_hybrid_kv_cache_manager: bool = False,
                      allow_chunked_local_with_hybrid: bool = False) -> bool:
    """Whether the hybrid KV cache manager stays on (on a CUDA GPU).

    The user can turn it off; a model with chunked-local attention turns it
    off unless VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE=1.
    """
    if disable_hybrid_kv_cache_manager:
        return False
    return not (has_chunked_local(cfg) and not allow_chunked_local_with_hybrid)


# -- what one request needs, and the longest that fits ------------------------------------------

def request_need(specs: dict[str, LayerSpec], max_model_len: int,
                 max_num_batched_tokens: int) -> int:
    """The start-up check's need: every layer's need for one max_model_len request, summed."""
    return sum(s.need_bytes(max_model_len, max_num_batched_tokens) for s in specs.values())


def estimate_max_model_len(specs: dict[str, LayerSpec], max_model_len: int,
                           max_num_batched_tokens: int, available_memory: int) -> int:
    """Longest length in [1, max_model_len] whose need fits; 0 if none.

    The layers' specs stay as built (a Mamba page keeps its size); only the
    request length changes.  The need never shrinks as the length grows, so
    a bisection finds the longest.
    """
    def fits(n: int) -> bool:
        return request_need(specs, n, max_num_batched_tokens) <= available_memory

    if not fits(1):
        return 0
    lo, hi = 1, max_model_len  # fits(lo); the answer is in [lo, hi]
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


def check_enough_memory(specs: dict[str, LayerSpec], max_model_len: int,
                        max_num_batched_tokens: int, available_memory: int) -> None:
    """Raise NotEnoughKVCacheMemory unless one max_model_len request fits (no layers: no check)."""
    if not specs:
        return
    needed = request_need(specs, max_model_len, max_num_batched_tokens)
    if available_memory <= 0:
        raise NotEnoughKVCacheMemory("no memory available for KV cache blocks", needed=needed,
                                     available=available_memory, estimated_max_len=0)
    if needed > available_memory:
        est = estimate_max_model_len(specs, max_model_len, max_num_batched_tokens,
                                     available_memory)
        raise NotEnoughKVCacheMemory(
            f"one request of max_model_len={max_model_len} needs {needed} B "
            f"({needed / GiB:.2f} GiB) of KV cache but only {available_memory} B is available; "
            f"estimated maximum model length: {est}",
            needed=needed, available=available_memory, estimated_max_len=est)


# -- grouping ----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Group:
    """A KV cache group: layers sharing one block table, and the spec they share.

    ``per_layer_pages``: set when the group holds layers of one kind with
    different page sizes (vLLM's UniformTypeKVCacheSpecs): the page is then
    their sum.
    """

    spec: LayerSpec
    layer_names: tuple[str, ...]
    per_layer_pages: tuple[int, ...] | None = None

    @property
    def page_size_bytes(self) -> int:
        if self.per_layer_pages is not None:
            return sum(self.per_layer_pages)
        return self.spec.page_size_bytes


def unify_specs(specs: dict[str, LayerSpec]) -> dict[str, LayerSpec]:
    """The hybrid manager is off: sliding-window and chunked-local layers are sized as full
    attention (keeping their window or chunk) when the model also has full layers.

    Raises CannotUnifyKVCacheSpecs when the layers still are not one kind
    (e.g. Mamba and attention layers together).
    """
    if merged_spec(list(specs.values())) is not None or same_kind(specs):
        return specs
    kinds = {s.kind for s in specs.values()}
    if FULL in kinds and kinds & {SLIDING_WINDOW, CHUNKED_LOCAL}:
        specs = {name: replace(s, kind=FULL) if s.kind in (SLIDING_WINDOW, CHUNKED_LOCAL) else s
                 for name, s in specs.items()}
    if merged_spec(list(specs.values())) is None and not same_kind(specs):
        raise CannotUnifyKVCacheSpecs("the hybrid KV cache manager is off but the layers "
                                      "cannot be made one kind")
    return specs


def merged_spec(specs: list[LayerSpec]) -> LayerSpec | None:
    """The one spec all these layers can share, or None.

    Full-attention layers merge when they agree on block size, heads, head
    size and dtype, and carry at most one window and at most one chunk size
    (not both); any other kind merges only with identical specs.
    """
    first = specs[0]
    if first.kind != FULL:
        return first if all(s == first for s in specs) else None
    if any(s.kind != FULL for s in specs):
        return None
    if any((s.block_size, s.kv_heads, s.head_size, s.dtype)
           != (first.block_size, first.kv_heads, first.head_size, first.dtype) for s in specs):
        return None
    windows = {s.sliding_window for s in specs} - {None}
    chunks = {s.attention_chunk_size for s in specs} - {None}
    if len(windows) > 1 or len(chunks) > 1 or (windows and chunks):
        return None
    return replace(first, sliding_window=min(windows, default=None),
                   attention_chunk_size=min(chunks, default=None))


def same_kind(specs: dict[str, LayerSpec]) -> bool:
    """Every layer needs the same token slots: one block size and one kind (the same window,
    chunk or speculative pages)."""
    values = list(specs.values())
    first = values[0]
    if len({s.block_size for s in values}) > 1:
        return False
    key = {SLIDING_WINDOW: lambda s: s.sliding_window,
           CHUNKED_LOCAL: lambda s: s.attention_chunk_size,
           MAMBA: lambda s: s.num_speculative_blocks}.get(first.kind, lambda s: None)
    return all(s.kind == first.kind and key(s) == key(first) for s in values)


def kv_cache_groups(specs: dict[str, LayerSpec], hybrid_manager: bool = True) -> list[Group]:
    """The KV cache groups, in vLLM's order.

    Hybrid manager off: unify the kinds first.  One mergeable spec: one group
    of every layer.  One kind (pages of different sizes): one group, its page
    the sum of the layers' pages.  Several kinds with one page size: see
    :func:`groups_of_equal_size`.
    """
    if not hybrid_manager:
        specs = unify_specs(specs)
    if not specs:
        return []
    names = tuple(specs)
    merged = merged_spec(list(specs.values()))
    if merged is not None:
        return [Group(merged, names)]
    if same_kind(specs):
        return [Group(specs[names[0]], names, tuple(s.page_size_bytes for s in specs.values()))]
    if len({s.page_size_bytes for s in specs.values()}) == 1:
        return groups_of_equal_size(specs)
    raise NotImplementedError("layers of several kinds with different page sizes")


def groups_of_equal_size(specs: dict[str, LayerSpec]) -> list[Group]:
    """Layers of several kinds, one page size: groups of equally many layers.

    Layers with identical specs form a kind, in the order each kind first
    appears.  The group size is the layer count of the smallest kind; a kind
    of n layers makes ceil(n / size) groups, the i-th taking every
    (number of groups)-th layer from the i-th on (the last groups may be a
    layer short: padding).
    """
    kinds: dict[LayerSpec, list[str]] = {}
    for name, spec in specs.items():
        kinds.setdefault(spec, []).append(name)
    size = min(len(layers) for layers in kinds.values())
    groups = []
    for spec, layers in kinds.items():
        for part in split_kind(layers, size):
            groups.append(Group(spec, tuple(part)))
    return groups


def split_kind(layers: list[str], group_size: int) -> list[list[str]]:
    """One kind's layers dealt into ceil(n / group_size) groups, round robin."""
    count = cdiv(len(layers), group_size)
    return [layers[i::count] for i in range(count)]


# -- the layout: pages and tensors ---------------------------------------------------------------

@dataclass(frozen=True)
class Tensor:
    size: int
    shared_by: tuple[str, ...]


@dataclass(frozen=True)
class HybridLayout:
    """What vLLM decides at start-up from the groups and the budget."""

    groups: tuple[Group, ...]
    num_blocks: int
    tensors: tuple[Tensor, ...]
    max_model_len: int
    max_num_batched_tokens: int
    page_size_bytes: int = field(default=0)

    @property
    def layers_per_group(self) -> int:
        return max(len(g.layer_names) for g in self.groups)

    @property
    def num_tokens(self) -> int:
        """Token slots vLLM logs: pages per group times the smallest block size."""
        smallest = min(g.spec.block_size for g in self.groups)
        return self.num_blocks // len(self.groups) * smallest

    @property
    def max_concurrency(self) -> float:
        """Requests of max_model_len that fit, as vLLM logs it: the pool's pages over one
        request's pages, where a request needs every group's need in each group slot."""
        per_group = self.layers_per_group
        need = per_group * sum(group_need(g, self.max_model_len, self.max_num_batched_tokens)
                               for g in self.groups)
        per_block = self.groups[0].page_size_bytes * per_group
        return self.num_blocks / cdiv(need, per_block)

    def scheduler_groups(self) -> list[LayerSpec]:
        """The spec of each group as the scheduler's KV cache manager gets it (a group of one
        kind with different page sizes hands over its first layer's spec)."""
        return [g.spec for g in self.groups]


def group_need(group: Group, max_model_len: int, max_num_batched_tokens: int) -> int:
    """One request's need in one group's spec (all its layers' pages for a one-kind group)."""
    if group.per_layer_pages is None:
        return group.spec.need_bytes(max_model_len, max_num_batched_tokens)
    pages = attention_pages_needed(group.spec, max_model_len, max_num_batched_tokens)
    return pages * group.page_size_bytes


def hybrid_layout(specs: dict[str, LayerSpec], available_memory: int, max_model_len: int,
                  max_num_batched_tokens: int, hybrid_manager: bool = True,
                  num_gpu_blocks_override: int | None = None) -> HybridLayout:
    """The start-up sizing on one GPU: check the need (with the layers' own kinds, even when
    the hybrid manager is off), group, then divide the budget.

    One group of one kind with different page sizes: one tensor per layer,
    budget // (sum of pages) blocks.  Otherwise every layer's page is the
    same: as many tensors as the largest group has layers, tensor i shared
    by the i-th layer of every group, budget // page // tensors blocks.
    """
    check_enough_memory(specs, max_model_len, max_num_batched_tokens, available_memory)
    groups = kv_cache_groups(specs, hybrid_manager)
    if len(groups) == 1 and groups[0].per_layer_pages is not None:
        g = groups[0]
        blocks = override_num_blocks(available_memory // g.page_size_bytes,
                                     num_gpu_blocks_override)
        tensors = tuple(Tensor(page * blocks, (name,))
                        for name, page in zip(g.layer_names, g.per_layer_pages))
        page = g.page_size_bytes
    else:
        per_group = max(len(g.layer_names) for g in groups)
        page = next(iter(specs.values())).page_size_bytes
        blocks = override_num_blocks(max(available_memory // page // per_group, 0),
                                     num_gpu_blocks_override)
        tensors = tuple(Tensor(page * blocks,
                               tuple(g.layer_names[i] for g in groups if i < len(g.layer_names)))
                        for i in range(per_group))
    return HybridLayout(tuple(groups), blocks, tensors, max_model_len, max_num_batched_tokens,
                        page)
