"""The streams a rule can matter on (``Mutant.applies``): predicates over a
:class:`harness.formats.stream.Stream`, named after the features they look for."""

from __future__ import annotations

import ast
from typing import Any, Callable


def drafts(s) -> bool:
    return s.config.num_speculative_tokens > 0


def eagle(s) -> bool:
    return drafts(s) and s.config.speculative_method == "eagle"


def caching(s) -> bool:
    return s.config.enable_prefix_caching


def priority(s) -> bool:
    return s.config.policy == "priority"


def fcfs(s) -> bool:
    return s.config.policy == "fcfs"


def chunked_off(s) -> bool:
    return not s.config.enable_chunked_prefill


def threshold(s) -> bool:
    return s.config.long_prefill_token_threshold > 0


def eagle_and_caching(s) -> bool:
    return eagle(s) and caching(s)


def drafts_and_caching(s) -> bool:
    return drafts(s) and caching(s)


def fcfs_chunked_off(s) -> bool:
    return fcfs(s) and chunked_off(s)


def chunked_off_threshold(s) -> bool:
    return chunked_off(s) and threshold(s)


def priority_drafts(s) -> bool:
    return priority(s) and drafts(s)


def _has_group(s, kind: str) -> bool:
    return any(g.type == kind for g in s.config.groups)


def sliding(s) -> bool:
    return _has_group(s, "sliding_window")


def chunked_local(s) -> bool:
    return _has_group(s, "chunked_local")


def mamba_drafts(s) -> bool:
    return _has_group(s, "mamba") and drafts(s)


def several_groups(s) -> bool:
    return len(s.config.groups) > 1


def hybrid_caching(s) -> bool:
    return caching(s) and several_groups(s)


def sliding_caching(s) -> bool:
    return sliding(s) and caching(s)


def sliding_drafts_caching(s) -> bool:
    return sliding_caching(s) and drafts(s)


def chunked_local_caching(s) -> bool:
    return chunked_local(s) and caching(s)


def from_memory(s) -> bool:
    return s.config.kv_cache_memory_bytes is not None


def priority_windows(s) -> bool:
    return priority(s) and (sliding(s) or chunked_local(s))


def lora(s) -> bool:
    return s.config.max_loras is not None and any(r.lora is not None for r in s.requests)


def lora_and_caching(s) -> bool:
    return lora(s) and caching(s)


def encoder(s) -> bool:
    return s.config.has_encoder and any(r.mm_inputs for r in s.requests)


def encoder_and_caching(s) -> bool:
    return encoder(s) and caching(s)


def encoder_eagle(s) -> bool:
    return encoder(s) and eagle(s)


def chunked_mm_off(s) -> bool:
    return encoder(s) and s.config.disable_chunked_mm_input


def stats(s) -> bool:
    return s.config.log_stats


def stats_caching(s) -> bool:
    return stats(s) and caching(s)


def stats_drafts(s) -> bool:
    return stats(s) and drafts(s)


def kv_events(s) -> bool:
    return s.config.kv_cache_events and caching(s)


def kv_events_lora(s) -> bool:
    return kv_events(s) and lora(s)


def kv_events_resets(s) -> bool:
    # A reset is announced with prefix caching off too.
    return s.config.kv_cache_events and bool(s.reset_prefix_cache_steps)


def connector(s) -> bool:
    return s.config.kv_role is not None


def _transfers(s):
    return [r.kv_transfer for r in s.requests if r.kv_transfer is not None]


def connector_loads(s) -> bool:
    return connector(s) and any(t.external_tokens > 0 for t in _transfers(s))


def connector_async(s) -> bool:
    return connector(s) and any(t.external_tokens > 0 and t.load_async for t in _transfers(s))


def connector_async_caching(s) -> bool:
    return connector_async(s) and caching(s)


def connector_unknown(s) -> bool:
    return connector(s) and any(t.unknown_lookups > 0 for t in _transfers(s))


def connector_sends(s) -> bool:
    return connector(s) and any(t.send_steps is not None for t in _transfers(s))


def grammar(s) -> bool:
    return any(r.structured_output is not None for r in s.requests)


def grammar_drafts(s) -> bool:
    return grammar(s) and drafts(s)


def pooling(s) -> bool:
    return any(r.pooling for r in s.requests)


def async_scheduling(s) -> bool:
    return s.config.async_scheduling


def pipeline_parallel(s) -> bool:
    return s.config.pipeline_parallel_size > 1


def batch_queue(s) -> bool:
    return s.config.batch_queue


def aborts(s) -> bool:
    return any(r.abort_step is not None for r in s.requests)


def events_asked(s) -> bool:
    return s.config.kv_cache_events


def uses_eagle(s) -> bool:
    return s.config.uses_eagle


def lone_group(s) -> bool:
    return s.config.kv_cache_groups is not None and len(s.config.kv_cache_groups) == 1


def prompt_logprobs(s) -> bool:
    return any(r.prompt_logprobs is not None for r in s.requests)


def threshold_above_model_len(s) -> bool:
    return s.config.long_prefill_token_threshold > s.config.max_model_len


def predicate(words: str) -> Callable[[Any], bool] | None:
    """The predicate a rule change's ``matters_on`` names: the features above joined by
    ``and``, ``or`` and ``not`` (``"(sliding or chunked_local) and batch_queue"``); None
    for "" (any stream).  A word that names no feature raises ValueError."""
    if not words:
        return None
    tree = ast.parse(words, mode="eval").body

    def build(node) -> Callable[[Any], bool]:
        if isinstance(node, ast.BoolOp):
            parts = [build(v) for v in node.values]
            if isinstance(node.op, ast.And):
                return lambda s: all(p(s) for p in parts)
            return lambda s: any(p(s) for p in parts)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            inner = build(node.operand)
            return lambda s: not inner(s)
        if isinstance(node, ast.Name) and node.id in FEATURES:
            return FEATURES[node.id]
        raise ValueError(f"matters_on {words!r}: {ast.unparse(node)!r} is not a feature of a "
                         f"stream ({', '.join(sorted(FEATURES))})")
    return build(tree)


#: The features a rule change's ``matters_on`` may name: every predicate of this module.
FEATURES: dict[str, Callable[[Any], bool]] = {
    name: f for name, f in list(globals().items())
    if callable(f) and not name.startswith("_") and name not in ("predicate",)
    and getattr(f, "__module__", None) == __name__}
