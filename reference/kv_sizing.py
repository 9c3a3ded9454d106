"""KV cache sizing: bytes per token, page size, pool size, tensor shape.

Mirrors: vllm/v1/kv_cache_interface.py (AttentionSpec.page_size_bytes) and
vllm/v1/core/kv_cache_utils.py (get_num_blocks, get_kv_cache_configs).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1}


@dataclass(frozen=True)
class ModelShape:
    """The parts of a model config that decide the size of its KV cache."""

    num_layers: int
    num_kv_heads: int
    head_size: int
    dtype: str = "bfloat16"

    @classmethod
    def from_hf_config(cls, cfg: dict, dtype: str | None = None) -> "ModelShape":
        heads = cfg["num_attention_heads"]
        return cls(
            num_layers=cfg["num_hidden_layers"],
            num_kv_heads=cfg.get("num_key_value_heads", heads),
            head_size=cfg.get("head_dim") or cfg["hidden_size"] // heads,
            dtype=dtype or cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16",
        )

    @classmethod
    def load(cls, model_dir: str | Path, dtype: str | None = None) -> "ModelShape":
        return cls.from_hf_config(json.loads((Path(model_dir) / "config.json").read_text()), dtype)

    @property
    def bytes_per_token_per_layer(self) -> int:
        """K and V for one token in one layer."""
        return 2 * self.num_kv_heads * self.head_size * DTYPE_BYTES[self.dtype]

    @property
    def bytes_per_token(self) -> int:
        return self.bytes_per_token_per_layer * self.num_layers

    def page_size_bytes(self, block_size: int) -> int:
        """One page (block) of one layer."""
        return block_size * self.bytes_per_token_per_layer
