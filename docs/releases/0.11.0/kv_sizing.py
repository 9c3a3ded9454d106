"""KV cache sizing: bytes per token, page size, pool size, tensor shape.

Clean-room model of how vLLM 0.11.0 sizes the KV cache of a model whose
attention layers are all full attention with one common spec (the uniform
case: one KV cache group holding every layer, one tensor per layer).

Mirrors (vLLM 0.11.0):

* vllm/config/model.py -- ModelConfig.get_num_kv_heads, get_head_size and
  the dtype "auto" resolves to (how config.json gives the model shape)
* vllm/v1/kv_cache_interface.py -- AttentionSpec.page_size_bytes,
  FullAttentionSpec.max_memory_usage_bytes
* vllm/v1/core/kv_cache_utils.py -- get_num_blocks, may_override_num_blocks,
  max_memory_usage_bytes, estimate_max_model_len,
  check_enough_kv_cache_memory, get_kv_cache_config_from_groups (general
  branch, one group), get_kv_cache_configs (single worker),
  get_max_concurrency_for_kv_cache_config
* vllm/utils/__init__.py -- get_kv_cache_torch_dtype / STR_DTYPE_TO_TORCH_DTYPE
  (how a cache dtype name turns into an element size)
* vllm/v1/attention/backends/flash_attn.py -- get_kv_cache_shape
* vllm/v1/core/block_pool.py -- block 0 is kept back as the null block

Units: every size is in bytes, every count is an int. "Per layer" means one
attention layer; "all layers" means the sum over the model's layers.

Worked example (the project's seed, Qwen2.5-0.5B in bf16, 16-token pages):
K and V x 2 KV heads x head size 64 x 2 bytes = 512 B per layer per token,
x 24 layers = 12288 B (12 KB) per token, x 16 tokens = 192 KB per page over
all layers, and 2048 tokens held contiguously take 24 MB.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from reference.arith import cdiv

# Element size in bytes of each KV cache dtype name vLLM accepts, plus the
# plain torch names a HF config may carry.  All fp8 flavours are stored as one
# byte per element (vLLM keeps them in uint8 tensors).
DTYPE_BYTES = {
    "float32": 4, "float": 4,
    "float16": 2, "half": 2,
    "bfloat16": 2,
    "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1, "fp8_inc": 1,
    "float8_e4m3fn": 1, "float8_e5m2": 1, "uint8": 1, "int8": 1,
}

GiB = 1 << 30


def normalize_dtype(name: str) -> str:
    """'torch.bfloat16' -> 'bfloat16'; lower case, known names only."""
    key = str(name).strip().lower()
    if key.startswith("torch."):
        key = key[len("torch."):]
    if key not in DTYPE_BYTES:
        raise ValueError(f"unknown KV cache dtype {name!r}; known: {sorted(DTYPE_BYTES)}")
    return key


def dtype_bytes(name: str) -> int:
    """Bytes per element of a KV cache dtype."""
    return DTYPE_BYTES[normalize_dtype(name)]


def resolve_kv_dtype(cache_dtype: str, model_dtype: str) -> str:
    """The dtype the KV cache is stored in.

    ``cache_dtype`` is CacheConfig.cache_dtype: "auto" means "same as the
    model's weights/activations", anything else names the storage dtype.
    """
    if cache_dtype == "auto":
        return normalize_dtype(model_dtype)
    return normalize_dtype(cache_dtype)


# -- the model shape as a HF config.json states it (one rule per field) --------------

def config_kv_heads(cfg: dict) -> int:
    """KV heads: ``num_key_value_heads``; a config without it has one KV head per attention head."""
    return cfg.get("num_key_value_heads", cfg["num_attention_heads"])


def config_head_size(cfg: dict) -> int:
    """Head size: ``head_dim`` when the config gives one, else hidden_size / num_attention_heads."""
    return cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]


def config_dtype(cfg: dict) -> str:
    """The dtype vLLM's dtype="auto" picks: the config's ``torch_dtype`` (configs of newer
    transformers say ``dtype``), except that an unset or float32 dtype becomes bfloat16 (vLLM
    reads an unset one as float32 and downcasts float32 to its platform's first choice,
    bfloat16 on GPUs and on x86 and ARM CPUs)."""
    name = cfg.get("torch_dtype") or cfg.get("dtype") or "float32"
    return "bfloat16" if name == "float32" else name


@dataclass(frozen=True)
class ModelShape:
    """The parts of a model config that decide the size of its KV cache.

    ``dtype`` is the dtype the KV cache is stored in (by default the model's
    own dtype, i.e. cache_dtype="auto").
    """

    num_layers: int
    num_kv_heads: int
    head_size: int
    dtype: str = "bfloat16"

    @classmethod
    def from_hf_config(cls, cfg: dict, dtype: str | None = None) -> "ModelShape":
        """The shape a HF ``config.json`` describes; ``dtype`` overrides the config's dtype."""
        return cls(num_layers=cfg["num_hidden_layers"], num_kv_heads=config_kv_heads(cfg),
                   head_size=config_head_size(cfg), dtype=dtype or config_dtype(cfg))

    @classmethod
    def load(cls, model_dir: str | Path, dtype: str | None = None) -> "ModelShape":
        return cls.from_hf_config(json.loads((Path(model_dir) / "config.json").read_text()), dtype)

    def with_cache_dtype(self, cache_dtype: str) -> "ModelShape":
        """This shape with its KV stored as ``cache_dtype`` ("auto" keeps it)."""
        return ModelShape(self.num_layers, self.num_kv_heads, self.head_size,
                          resolve_kv_dtype(cache_dtype, self.dtype))

    def with_layers(self, num_layers: int) -> "ModelShape":
        return ModelShape(num_layers, self.num_kv_heads, self.head_size, self.dtype)

    @property
    def dtype_bytes(self) -> int:
        return dtype_bytes(self.dtype)

    # -- per token ---------------------------------------------------------

    @property
    def bytes_per_token_per_layer(self) -> int:
        """K and V for one token in one layer."""
        return 2 * self.num_kv_heads * self.head_size * self.dtype_bytes

    @property
    def bytes_per_token(self) -> int:
        """K and V for one token over all layers."""
        return self.bytes_per_token_per_layer * self.num_layers

    # -- per page (block) --------------------------------------------------

    def page_size_bytes(self, block_size: int) -> int:
        """One page (block) of one layer: vLLM's AttentionSpec.page_size_bytes."""
        return block_size * self.bytes_per_token_per_layer

    def page_size_bytes_all_layers(self, block_size: int) -> int:
        """One block id's worth of memory over every layer."""
        return self.page_size_bytes(block_size) * self.num_layers

    # -- contiguous reservations -------------------------------------------

    def contiguous_bytes(self, num_tokens: int) -> int:
        """Bytes for ``num_tokens`` tokens packed with no page rounding."""
        return num_tokens * self.bytes_per_token

    def tensor_shape(self, num_blocks: int, block_size: int) -> tuple[int, int, int, int, int]:
        """Per-layer KV tensor shape (see :func:`kv_cache_tensor_shape`)."""
        return kv_cache_tensor_shape(num_blocks, block_size, self.num_kv_heads, self.head_size)


def kv_cache_tensor_shape(num_blocks: int, block_size: int, num_kv_heads: int,
                          head_size: int) -> tuple[int, int, int, int, int]:
    """Logical shape of one layer's KV cache tensor: K/V first, then pages.

    This is the layout the flash-attention backend asks for; vLLM rejects
    block sizes that are not a multiple of 16 for that backend (other
    backends, e.g. the CPU one, use other shapes of the same byte size).
    """
    return (2, num_blocks, block_size, num_kv_heads, head_size)


def flash_attention_shape(num_blocks: int, block_size: int, num_kv_heads: int,
                          head_size: int, pages_first: bool = False,
                          kv_in_last_dim: bool = False) -> tuple[int, ...] | None:
    """The flash-attention backend's KV tensor shape of one layer, or None for a block
    size it refuses (not a multiple of 16).  From 0.23.0 (kv_pages_first_in_tensor) the
    pages come before K/V.  From 0.26.0 (kv_packed_in_last_dim) there is no K/V axis:
    a page holds its KV heads, each head its tokens, and each token its key then its
    value side by side, four axes in all; the bytes are the same."""
    if block_size % 16:
        return None
    if kv_in_last_dim:
        return (num_blocks, num_kv_heads, block_size, 2 * head_size)
    k_v, pages, *rest = kv_cache_tensor_shape(num_blocks, block_size, num_kv_heads, head_size)
    return (pages, k_v, *rest) if pages_first else (k_v, pages, *rest)


def override_num_blocks(num_blocks: int, num_gpu_blocks_override: int | None) -> int:
    """CacheConfig.num_gpu_blocks_override, when set (even to 0), wins outright.

    It is applied after the budget division and is not checked against the
    budget: a larger override makes the tensors larger than the budget.
    """
    return num_blocks if num_gpu_blocks_override is None else num_gpu_blocks_override


def num_blocks_for_budget(shape: ModelShape, block_size: int, available_memory: int,
                          num_gpu_blocks_override: int | None = None) -> int:
    """How many blocks vLLM makes out of ``available_memory`` bytes.

    Every layer gets its own tensor of ``num_blocks`` pages, so the budget is
    split evenly across layers: floor(budget / page) then floor(/ layers),
    never below zero, then the override.
    """
    per_layer_page = shape.page_size_bytes(block_size)
    blocks = max(available_memory // per_layer_page // shape.num_layers, 0)
    return override_num_blocks(int(blocks), num_gpu_blocks_override)


def min_bytes_for_max_model_len(shape: ModelShape, block_size: int, max_model_len: int,
                                dcp_world_size: int = 1) -> int:
    """Memory one request of ``max_model_len`` tokens needs (whole pages).

    With decode-context parallelism each rank keeps only its share of the
    tokens (rounded up).
    """
    tokens = max_model_len if dcp_world_size <= 1 else cdiv(max_model_len, dcp_world_size)
    return cdiv(tokens, block_size) * shape.page_size_bytes_all_layers(block_size)


def estimate_max_model_len(shape: ModelShape, block_size: int, max_model_len: int,
                           available_memory: int, dcp_world_size: int = 1) -> int:
    """Longest request length in [1, max_model_len] whose pages fit; 0 if none.

    vLLM finds it by bisection; the need grows monotonically with length, so
    it is the largest multiple of the page length (times dcp) that fits,
    capped at max_model_len.
    """
    pages = available_memory // shape.page_size_bytes_all_layers(block_size)
    return max(0, min(max_model_len, pages * block_size * max(dcp_world_size, 1)))


class NotEnoughKVCacheMemory(ValueError):
    """The budget cannot hold one request of max_model_len tokens (vLLM raises ValueError)."""

    def __init__(self, message: str, *, needed: int, available: int, estimated_max_len: int):
        super().__init__(message)
        self.needed = needed
        self.available = available
        self.estimated_max_len = estimated_max_len


def check_enough_kv_cache_memory(shape: ModelShape, block_size: int, max_model_len: int,
                                 available_memory: int, dcp_world_size: int = 1,
                                 null_page_held_back: bool = False) -> None:
    """Start-up check: raise unless one max_model_len request fits.

    A model with no attention layers is never checked.  A budget of zero or
    less is refused outright; otherwise the error carries the longest length
    that would have fitted.

    ``null_page_held_back`` (from 0.29.0, releases.startup_check_holds_back_null_page):
    the check plans with the budget less one page of every layer, the null page the
    block pool keeps back, so a pool of exactly one max_model_len request's pages is
    refused.  0.11.0 checked the whole budget: such a pool started, and its one request
    could never get all its pages.  The pool itself is still cut from the whole budget.
    """
    if shape.num_layers == 0:
        return
    if null_page_held_back:
        available_memory -= shape.page_size_bytes_all_layers(block_size)
    if available_memory <= 0:
        raise NotEnoughKVCacheMemory("no memory available for KV cache blocks",
                                     needed=min_bytes_for_max_model_len(
                                         shape, block_size, max_model_len, dcp_world_size),
                                     available=available_memory, estimated_max_len=0)
    needed = min_bytes_for_max_model_len(shape, block_size, max_model_len, dcp_world_size)
    if needed > available_memory:
        est = estimate_max_model_len(shape, block_size, max_model_len, available_memory,
                                     dcp_world_size)
        raise NotEnoughKVCacheMemory(
            f"one request of max_model_len={max_model_len} needs {needed} B "
            f"({needed / GiB:.2f} GiB) of KV cache but only {available_memory} B "
            f"({available_memory / GiB:.2f} GiB) is available; "
            f"estimated maximum model length: {est}",
            needed=needed, available=available_memory, estimated_max_len=est)


@dataclass(frozen=True)
class KVCacheLayout:
    """What vLLM decides at start-up for a uniform full-attention model."""

    shape: ModelShape
    block_size: int
    num_blocks: int
    max_model_len: int
    dcp_world_size: int = 1

    @property
    def page_size_bytes(self) -> int:
        """One page of one layer."""
        return self.shape.page_size_bytes(self.block_size)

    @property
    def num_tensors(self) -> int:
        """One KV tensor per layer (each layer is its own memory pool)."""
        return self.shape.num_layers

    @property
    def tensor_size_bytes(self) -> int:
        """Bytes of each per-layer tensor (KVCacheTensor.size)."""
        return self.page_size_bytes * self.num_blocks

    @property
    def tensor_shape(self) -> tuple[int, int, int, int, int]:
        return self.shape.tensor_shape(self.num_blocks, self.block_size)

    @property
    def total_bytes(self) -> int:
        """All tensors together (at most the budget unless overridden upward)."""
        return self.tensor_size_bytes * self.num_tensors

    @property
    def num_tokens(self) -> int:
        """Token slots in the pool, as vLLM logs "GPU KV cache size" (one group;
        with decode-context parallelism each rank's slots count dcp times)."""
        return self.num_blocks * self.block_size * max(self.dcp_world_size, 1)

    @property
    def allocatable_blocks(self) -> int:
        """Blocks requests can get: the block pool keeps block 0 as the null block."""
        return max(self.num_blocks - 1, 0)

    @property
    def blocks_per_max_len_request(self) -> int:
        """Pages one max_model_len request takes on this rank."""
        tokens = self.max_model_len
        if self.dcp_world_size > 1:
            tokens = cdiv(tokens, self.dcp_world_size)
        return cdiv(tokens, self.block_size)

    @property
    def max_concurrency(self) -> float:
        """num_blocks / pages of one max_model_len request, as vLLM logs it."""
        return self.num_blocks / self.blocks_per_max_len_request


def kv_cache_layout(shape: ModelShape, block_size: int, available_memory: int,
                    max_model_len: int, num_gpu_blocks_override: int | None = None,
                    dcp_world_size: int = 1, null_page_held_back: bool = False) -> KVCacheLayout:
    """The start-up sizing for one worker: check, then divide the budget.

    Raises NotEnoughKVCacheMemory where vLLM's get_kv_cache_configs raises
    ValueError.  The check uses the budget, not the override.
    """
    check_enough_kv_cache_memory(shape, block_size, max_model_len, available_memory,
                                 dcp_world_size, null_page_held_back)
    blocks = num_blocks_for_budget(shape, block_size, available_memory, num_gpu_blocks_override)
    return KVCacheLayout(shape=shape, block_size=block_size, num_blocks=blocks,
                         max_model_len=max_model_len, dcp_world_size=dcp_world_size)
