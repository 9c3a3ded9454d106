"""Where vLLM's internal API moved between releases, and how the adapter follows it.

Every difference is found by feature detection (a signature, a dataclass
field, an attribute), never by comparing version numbers, so a release that
keeps an older shape keeps working.  Each shim names the releases where the
difference was first seen; ``DETECTED`` lists the ones this vLLM needed.

| what | 0.11.0 | later |
|---|---|---|
| ``get_hash_fn_by_name`` | ``vllm.utils`` | ``vllm.utils.hashing`` (0.11.1) |
| ``SchedulerConfig.max_model_len`` | a field the scheduler reads | an InitVar; the scheduler reads ``model_config.max_model_len`` (0.11.1) |
| ``SchedulerConfig(is_encoder_decoder=)`` | absent | InitVar, optional (0.11.1), required (0.12.0) |
| ``SchedulerConfig.chunked_prefill_enabled`` | the field the scheduler reads | alias (0.11.1), gone (0.12.0): ``enable_chunked_prefill`` |
| ``Scheduler(block_size=)`` | absent | required (0.11.1) |
| ``BlockTable(kernel_block_size=, *_kv_cache_interleave_size=)`` | absent | required (0.11.1; ``dcp_`` then ``cp_`` from 0.12.0) |
| ``CachedRequestData`` resumed flags | ``resumed_from_preemption`` list | ``resumed_req_ids`` set (0.11.1) |
| ``ModelRunnerOutput.sampled_token_ids`` | lists | numpy arrays (0.11.1, 0.11.2), lists again (0.12.0) |
| ``CacheConfig(swap_space=)`` | accepted | gone in later releases |
| ``BlockPool(hash_block_size=)`` | absent | required (0.12.0) |
| ``Request(eos_token_id=)`` | accepted | gone (0.17.0): the EOS is set on ``SamplingParams`` |
| ``SpeculativeConfig.uses_draft_model()`` | not read | read by the scheduler (0.15.0) |
| ``BlockTable.compute_slot_mapping`` | numpy on the CPU | a Triton GPU kernel taking tensors (0.19.0): **not followed**, so 0.19.0 and later cannot be driven here |
| ``FullAttentionSpec.max_memory_usage_bytes`` reads | ``decode_context_parallel_size`` | also ``prefill_context_parallel_size`` (0.12.0) |
| ``Request(structured_output_request=)`` | given by the caller | built from ``SamplingParams`` (0.11.1) |
| structured-output ids and bitmask | in ``SchedulerOutput`` (a dict: batch index) | ``Scheduler.get_grammar_bitmask()`` after ``schedule()`` (a list, 0.11.1) |
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from typing import Any

import numpy as np

from harness.engines import vllm_env  # noqa: F401  (before vLLM is imported)
from vllm.config import CacheConfig, SchedulerConfig
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.worker.block_table import BlockTable

try:
    from vllm.utils import get_hash_fn_by_name
except ImportError:  # 0.11.1 and later
    from vllm.utils.hashing import get_hash_fn_by_name

DETECTED: list[str] = []


def _note(what: str) -> None:
    if what not in DETECTED:
        DETECTED.append(what)


def _initvars(cls) -> set[str]:
    return {n for n, f in getattr(cls, "__dataclass_fields__", {}).items()
            if f._field_type is dataclasses._FIELD_INITVAR}


@functools.lru_cache(maxsize=None)
def _params(fn) -> dict[str, inspect.Parameter]:
    return dict(inspect.signature(fn).parameters)


_SCHED_INITVARS = _initvars(SchedulerConfig)
MAX_MODEL_LEN_ON_MODEL_CONFIG = "max_model_len" in _SCHED_INITVARS


def hash_fn(name: str):
    return get_hash_fn_by_name(name)


def model_config_kwargs(max_model_len: int) -> dict[str, Any]:
    """Extra ModelConfig arguments: where the scheduler reads max_model_len from it."""
    if MAX_MODEL_LEN_ON_MODEL_CONFIG:
        _note("max_model_len read from ModelConfig")
        return {"max_model_len": max_model_len}
    return {}


def scheduler_config_kwargs(model_config) -> dict[str, Any]:
    if "is_encoder_decoder" in _SCHED_INITVARS:
        _note("SchedulerConfig(is_encoder_decoder=)")
        return {"is_encoder_decoder": bool(getattr(model_config, "is_encoder_decoder", False))}
    return {}


def cache_config_kwargs() -> dict[str, Any]:
    if "swap_space" in _params(CacheConfig):
        return {"swap_space": 0}
    _note("CacheConfig without swap_space")
    return {}


def effective_chunked_prefill(scheduler_config) -> bool:
    if hasattr(scheduler_config, "chunked_prefill_enabled") and \
            "chunked_prefill_enabled" in getattr(type(scheduler_config), "__dataclass_fields__", {}):
        return scheduler_config.chunked_prefill_enabled
    _note("enable_chunked_prefill read")
    return scheduler_config.enable_chunked_prefill


def effective_max_model_len(vllm_config) -> int:
    if MAX_MODEL_LEN_ON_MODEL_CONFIG:
        return vllm_config.model_config.max_model_len
    return vllm_config.scheduler_config.max_model_len


def scheduler_kwargs(vllm_config) -> dict[str, Any]:
    if "block_size" in _params(Scheduler.__init__):
        _note("Scheduler(block_size=)")
        return {"block_size": vllm_config.cache_config.block_size}
    return {}


def block_table_kwargs(block_size: int) -> dict[str, Any]:
    params = _params(BlockTable.__init__)
    out: dict[str, Any] = {}
    if "kernel_block_size" in params:
        _note("BlockTable(kernel_block_size=)")
        out["kernel_block_size"] = block_size
    for name in ("dcp_kv_cache_interleave_size", "cp_kv_cache_interleave_size"):
        if name in params:
            _note(f"BlockTable({name}=)")
            out[name] = 1
    return out


def block_pool_kwargs(block_size: int) -> dict[str, Any]:
    from vllm.v1.core.block_pool import BlockPool
    if "hash_block_size" in _params(BlockPool.__init__):
        _note("BlockPool(hash_block_size=)")
        return {"hash_block_size": block_size}
    return {}


def request_eos_kwargs(params, eos_token_id: int | None) -> dict[str, Any]:
    """Where a request's EOS goes: ``Request(eos_token_id=)``, or (0.17.0 and later) the
    sampling parameters, set as vLLM's input processor sets them."""
    from vllm.v1.request import Request
    if "eos_token_id" in _params(Request.__init__):
        return {"eos_token_id": eos_token_id}
    if params is None:  # a pooling request
        return {}
    _note("EOS in SamplingParams")
    params.update_from_generation_config({}, eos_token_id=eos_token_id)
    return {}


def resumed_flags(cached) -> list[bool]:
    """Per cached request of a SchedulerOutput: was it resumed from preemption?"""
    if hasattr(cached, "resumed_from_preemption"):
        return list(cached.resumed_from_preemption)
    _note("CachedRequestData.resumed_req_ids")
    resumed = cached.resumed_req_ids
    return [rid in resumed for rid in cached.req_ids]


_SAMPLED_AS_ARRAYS = "ndarray" in str(
    getattr(ModelRunnerOutput, "__dataclass_fields__", {}).get("sampled_token_ids", None)
    and ModelRunnerOutput.__dataclass_fields__["sampled_token_ids"].type)


def sampled_token_ids(tokens: list[list[int]]) -> list:
    if _SAMPLED_AS_ARRAYS:
        _note("sampled_token_ids as numpy arrays")
        return [np.array(t, dtype=np.int64) for t in tokens]
    return tokens


def set_aside_queue_hook(record):
    """A context manager for one ``schedule()`` call: the queue vLLM makes there for the
    waiting requests it passes over (``skipped_waiting_requests``) reports each request
    put into it to ``record``.  The scheduler's own waiting queue is made at start-up,
    outside the hook, so it is not affected."""
    import contextlib

    from vllm.v1.core.sched import scheduler as sched_module
    real = sched_module.create_request_queue
    recording: dict[type, type] = {}  # a queue class and its recording subclass, made once

    def recording_class(base: type) -> type:
        class Recording(base):
            def prepend_request(self, request):
                record(request)
                return super().prepend_request(request)
        return Recording

    def recording_queue(policy):
        queue = real(policy)
        base = type(queue)
        if base not in recording:
            recording[base] = recording_class(base)
        queue.__class__ = recording[base]
        return queue

    @contextlib.contextmanager
    def hooked():
        sched_module.create_request_queue = recording_queue
        try:
            yield
        finally:
            sched_module.create_request_queue = real
    return hooked


def grammar_output(scheduler, output) -> tuple[dict[str, int], list]:
    """The step's structured-output part: {request id: index} and the bitmask rows (each
    row: [harness row number, grammar state], written by the scripted grammar).

    0.11.0 puts both in the SchedulerOutput (the index: place in the worker's batch).
    From 0.11.1 the engine asks ``Scheduler.get_grammar_bitmask`` right after
    ``schedule()``, as done here; the ids come as a list, whose positions are the index.
    """
    if hasattr(output, "structured_output_request_ids"):
        index = dict(output.structured_output_request_ids or {})
        bitmask = output.grammar_bitmask
        return index, [] if bitmask is None else bitmask.tolist()
    _note("Scheduler.get_grammar_bitmask")
    grammar = scheduler.get_grammar_bitmask(output)
    if grammar is None:
        return {}, []
    return ({rid: i for i, rid in enumerate(grammar.structured_output_request_ids)},
            grammar.grammar_bitmask.tolist())


def structured_output_request_kwargs(params) -> dict[str, Any]:
    """0.11.0's Request takes its StructuredOutputRequest; from 0.11.1 it builds one from
    the sampling parameters itself."""
    from vllm.v1.request import Request
    if "structured_output_request" in _params(Request.__init__):
        from vllm.v1.structured_output.request import StructuredOutputRequest
        return {"structured_output_request": StructuredOutputRequest(sampling_params=params)}
    _note("Request builds its StructuredOutputRequest")
    return {}
