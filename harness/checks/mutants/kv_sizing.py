"""Mutants of KV sizing: the model shape read from config.json, a stream's pool, hybrid
models' page sizes."""

from __future__ import annotations

from harness.checks.mutants.applies import from_memory
from harness.checks.mutants.registry import mutant
from harness.formats.mutant import (
    HYBRID_MODEL_CONFIG,
    KV_CACHE_INTERFACE,
    KV_CACHE_UTILS,
    MODEL_CONFIG,
    VLLM_CONFIG,
)
from reference import kv_sizing as rkvs
from reference import kv_sizing_hybrid as rkvh


@mutant("kv_heads_from_attention_heads",
        "KV heads are num_key_value_heads (one per attention head when absent)", MODEL_CONFIG,
        replaces=(rkvs, "config_kv_heads"), checked_by="kv sizing")
def _attention_heads(cfg):
    return cfg["num_attention_heads"]


@mutant("head_size_from_kv_heads",
        "head size is head_dim, else hidden_size / num_attention_heads", MODEL_CONFIG,
        replaces=(rkvs, "config_head_size"), checked_by="kv sizing")
def _hidden_over_kv_heads(cfg):
    return cfg.get("head_dim") or cfg["hidden_size"] // rkvs.config_kv_heads(cfg)


@mutant("head_dim_key_ignored", "a config's head_dim wins over hidden_size / num_attention_heads",
        MODEL_CONFIG, replaces=(rkvs, "config_head_size"), checked_by="kv sizing")
def _hidden_over_heads(cfg):
    return cfg["hidden_size"] // cfg["num_attention_heads"]


@mutant("dtype_key_ignored", "the model dtype is the config's torch_dtype (newer configs: dtype)",
        MODEL_CONFIG, replaces=(rkvs, "config_dtype"), checked_by="kv sizing")
def _newer_key_only(cfg):
    return cfg.get("dtype") or "bfloat16"


@mutant("pool_pages_rounded_up", "the pool is the whole pages the memory holds, rounded down",
        KV_CACHE_UTILS, replaces=(rkvs, "num_blocks_for_budget"), applies=from_memory)
def _partial_page_counted(shape, block_size, available_memory, num_gpu_blocks_override=None):
    whole_pool_page = shape.page_size_bytes(block_size) * shape.num_layers
    blocks = max(-(-available_memory // whole_pool_page), 0)
    return rkvs.override_num_blocks(blocks, num_gpu_blocks_override)


@mutant("sliding_window_no_extra_page",
        "a sliding-window layer needs the pages of window - 1 + max_num_batched_tokens tokens "
        "(at most max_model_len) plus one", KV_CACHE_INTERFACE,
        replaces=(rkvh, "attention_pages_needed"), checked_by="kv sizing")
def _window_pages_only(spec, max_model_len, max_num_batched_tokens):
    if spec.kind == rkvh.SLIDING_WINDOW:
        tokens = min(spec.sliding_window - 1 + max_num_batched_tokens, max_model_len)
        return rkvs.cdiv(tokens, spec.block_size)
    return _attention_pages_needed(spec, max_model_len, max_num_batched_tokens)


_attention_pages_needed = rkvh.attention_pages_needed


@mutant("padding_groups_contiguous",
        "a kind's layers are dealt round robin into its groups (layers[i::groups])",
        KV_CACHE_UTILS, replaces=(rkvh, "split_kind"), checked_by="kv sizing")
def _contiguous_groups(layers, group_size):
    return [layers[i:i + group_size] for i in range(0, len(layers), group_size)]


@mutant("mamba_block_not_multiple_of_16",
        "a Mamba hybrid's attention block is the smallest multiple of 16 tokens whose page "
        "holds a Mamba state", HYBRID_MODEL_CONFIG,
        replaces=(rkvh, "mamba_attention_block_size"), checked_by="kv sizing")
def _smallest_block(block_size, attn_bytes_per_token, mamba_page):
    needed = rkvs.cdiv(mamba_page, attn_bytes_per_token)
    return needed if block_size is None or block_size < needed else block_size


@mutant("chunked_local_keeps_hybrid_manager",
        "chunked local attention turns the hybrid KV cache manager off unless "
        "VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE=1", VLLM_CONFIG,
        replaces=(rkvh, "hybrid_manager_on"), checked_by="kv sizing")
def _manager_kept(cfg, disable_hybrid_kv_cache_manager=False,
                  allow_chunked_local_with_hybrid=False):
    return not disable_hybrid_kv_cache_manager


