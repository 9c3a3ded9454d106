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
| ``BlockTable.compute_slot_mapping`` | numpy on the CPU | a Triton kernel over the whole batch, taking tensors (0.19.0): see :func:`slot_mapping` |
| ``FullAttentionSpec.max_memory_usage_bytes`` reads | ``decode_context_parallel_size`` | also ``prefill_context_parallel_size`` (0.12.0) |
| ``RequestStatus.WAITING_FOR_FSM`` | its name | ``WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR`` (0.19.0): traced under the old name |
| ``Request(structured_output_request=)`` | given by the caller | built from ``SamplingParams`` (0.11.1) |
| ``get_kv_cache_configs`` | ``kv_cache_utils``, three arguments | ``kv_cache_planning``, with ``get_global_kv_cache_groups``'s groups (0.33.0) |
| structured-output ids and bitmask | in ``SchedulerOutput`` (a dict: batch index) | ``Scheduler.get_grammar_bitmask()`` after ``schedule()`` (a list, 0.11.1) |
| ``SchedulerConfig.async_scheduling`` default | False | None, which ``VllmConfig`` turns on (0.14.0; on a CPU too in 0.34.0): always given as the stream's bool, and checked |
| ``ModelConfig.supports_multimodal_inputs`` | not read | read by the scheduler instead of its registry (0.31.0): answered as the registry stand-in while the scheduler starts |
| a request resumed from preemption | among the cached requests, flagged | among the new ones, unflagged, under the model runner v2 (0.25.1 seen) and always (0.34.0, flag gone): resumed when its ``num_preemptions`` > 0, see :func:`resumed_among_new` |
| ``ModelRunnerOutput(req_id_to_index=)`` | required | gone (0.34.0): a request's place in ``req_ids`` |
| ``vllm.v1.worker.block_table.BlockTable`` | the worker's table | gone (0.34.0): the CPU model runner v2's ``CPUBlockTables`` |
| ``SpeculativeConfig.speculator_config`` and its shortcuts | not read | read for the lookahead and eagle's block drop (0.34.0): vLLM's config class of the method |
| ``VllmConfig.num_hash_lookahead_tokens`` | absent | a property (0.33.0 seen), a field resolved once at construction (0.34.0): resolved again after the speculative stand-in is set |
| ``get_request_block_hasher(num_hash_lookahead_tokens=)`` | absent | a third argument the engine core gives as ``VllmConfig.num_hash_lookahead_tokens`` (0.33.0 seen; 1 for eagle with prefix caching): given the same way, see :func:`request_block_hasher` |
| ``SpeculativeConfig.parallel_drafting`` | not read | read while ``VllmConfig`` checks the model runner v2 (0.33.0): answered as vLLM sets it, true for dflash and dspark only |
| ``KVCacheManager.get_computed_blocks`` | (pages, hit tokens) | a third value (0.34.0): the hook reads the first two |
| requests set aside in ``schedule()`` | a queue made there (``prepend_request``) | plain deques, each request marked in ``Scheduler.deferred_waiting`` first (0.31.0): the marks are recorded |
| grammar bitmask rows | packed: one per scheduled draft plus one | a block of ``1 + num_spec_tokens`` per request, the first ones written (0.34.0): those are taken; a row left unconstrained is traced with state -1 |
| multimodal processor stand-in | ``info`` read | also ``info.ctx.model_config`` (0.34.0) |
| ``EngineCore.step_with_batch_queue`` | applies the oldest batch once its Future is ``done()`` | only when the queue is full or no request is left (0.23.0): see :func:`applies_batch_the_worker_is_done_with` |
| the KV cache layout | fixed by the backend | resolved once by the engine core before the sizing (0.29.0): see :func:`resolve_kv_cache_layout` |
| ``FlashAttentionBackend.get_kv_cache_shape`` | the backend's tensor shape | gone (0.29.0): the logical per-layer view, see :func:`flash_attention_kv_shape` |
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib.util
import inspect
import os
import types
from typing import Any

import numpy as np

from harness.engines import vllm_env  # noqa: F401  (before vLLM is imported)
from harness.formats.steps import page_span, slot_ranges, slot_runs
from vllm.config import CacheConfig, SchedulerConfig
from vllm.v1.core.kv_cache_utils import get_request_block_hasher
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.outputs import ModelRunnerOutput
try:
    from vllm.v1.worker.block_table import BlockTable
except ImportError:  # 0.34.0: only the model runner v2's tables are left
    BlockTable = None

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


def speculator_config(spec):
    """0.34.0: what ``SpeculativeConfig.speculator_config`` gives for a config with no
    draft checkpoint: an instance of vLLM's config class for the method, specialized as
    ``get_speculator_config_class`` specializes it."""
    from vllm.v1.worker.gpu.spec_decode.speculator_config import get_method_config_class
    _note("SpeculativeConfig.speculator_config")
    return get_method_config_class(spec).specialize(spec)(spec)


def after_speculative_config(vllm_config) -> None:
    """The harness sets its speculative stand-in after ``VllmConfig`` is built.  From 0.34.0
    ``VllmConfig`` resolves ``num_hash_lookahead_tokens`` (block hashes covering the tokens
    an eagle drafter reads past a block; the KV cache manager then keeps the last cached
    page) once, when it is built; it is resolved again here, as with the speculative
    config in place.  Up to 0.33.0 it is a property, read from the stand-in each time."""
    resolve = getattr(vllm_config, "_resolve_num_hash_lookahead_tokens", None)
    if resolve is None:
        return
    _note("VllmConfig.num_hash_lookahead_tokens resolved with the speculative config")
    object.__setattr__(vllm_config, "num_hash_lookahead_tokens", resolve())


def request_block_hasher(block_size: int, caching_hash_fn, vllm_config):
    """The request block hasher, built as the engine core builds it: from 0.33.0 (seen)
    ``get_request_block_hasher`` takes the hash lookahead (the tokens after a block its
    hash also covers), which the engine core gives as
    ``vllm_config.num_hash_lookahead_tokens``."""
    if "num_hash_lookahead_tokens" not in _params(get_request_block_hasher):
        return get_request_block_hasher(block_size, caching_hash_fn)
    _note("get_request_block_hasher(num_hash_lookahead_tokens=)")
    return get_request_block_hasher(block_size, caching_hash_fn,
                                    vllm_config.num_hash_lookahead_tokens)


def async_scheduling_kwargs(on: bool) -> dict[str, Any]:
    """``SchedulerConfig(async_scheduling=)``, always given as the stream's bool.  In
    0.11.0 (to 0.12.0) its default is False; later (0.14.0 seen) it is None, which
    ``VllmConfig`` turns on unless the executor or a pooling model refuses (0.34.0 on a
    CPU too): a synchronous stream must say False.  The adapter checks the built config."""
    field = getattr(SchedulerConfig, "__dataclass_fields__", {}).get("async_scheduling")
    if field is not None and field.default is not False:
        _note("async scheduling on by default: set off explicitly")
    return {"async_scheduling": bool(on)}


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


def scheduler_kwargs(vllm_config, kv_cache_config=None) -> dict[str, Any]:
    """Scheduler(block_size=) from 0.11.1; from 0.20.0 the engine resolves it with the
    hash block size from the KV cache groups (``resolve_kv_cache_block_sizes``: the
    least common multiple of the groups' page sizes), as done here."""
    if "block_size" not in _params(Scheduler.__init__):
        return {}
    _note("Scheduler(block_size=)")
    from vllm.v1.core import kv_cache_utils
    resolve = getattr(kv_cache_utils, "resolve_kv_cache_block_sizes", None)
    if resolve is None or kv_cache_config is None or "hash_block_size" not in _params(
            Scheduler.__init__):
        return {"block_size": vllm_config.cache_config.block_size}
    _note("resolve_kv_cache_block_sizes")
    block_size, hash_block_size = resolve(kv_cache_config, vllm_config)
    return {"block_size": block_size, "hash_block_size": hash_block_size}


def startup_retention(kv_cache_config, vllm_config):
    """From 0.29.0 start-up (``get_kv_cache_configs``) copies the cache config's
    ``prefix_cache_retention_interval`` (default 0: sparse sliding-window caching) into the
    KVCacheConfig, whose own default is None (dense); the harness builds the KVCacheConfig
    itself, so it copies the setting as start-up does.  0.24.0-0.28.x read it from an
    environment variable, unset by default."""
    cache_config = vllm_config.cache_config
    if hasattr(kv_cache_config, "prefix_cache_retention_interval") and \
            hasattr(cache_config, "prefix_cache_retention_interval"):
        _note("prefix_cache_retention_interval copied from the cache config")
        kv_cache_config.prefix_cache_retention_interval = \
            cache_config.prefix_cache_retention_interval
    return kv_cache_config


def block_table_kwargs(block_size: int) -> dict[str, Any]:
    if BlockTable is None:
        return {}
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


#: 0.19.0 and later: the slot mapping is a Triton kernel over the batch (``query_start_loc``).
SLOTS_BY_KERNEL = BlockTable is None or "query_start_loc" in _params(BlockTable.compute_slot_mapping)
#: With ``HARNESS_SLOT_KERNEL=verify`` every slot mapping of a kernel release is also run
#: through vLLM's own kernel under Triton's interpreter, and one of an earlier release
#: through its numpy ``compute_slot_mapping`` (:func:`worker_slots`); a difference stops
#: the run.
VERIFY_SLOT_KERNEL = "HARNESS_SLOT_KERNEL"


def cpu_block_table(block_size: int, max_num_reqs: int, max_num_blocks_per_req: int,
                    max_num_batched_tokens: int):
    """vLLM's worker block table for one KV cache group, on the CPU: the model runner's
    ``BlockTable``, or from 0.34.0 (where it is gone) the CPU model runner v2's
    ``CPUBlockTables`` behind the same ``add_row``/``append_row``."""
    import torch
    if BlockTable is None:
        return _CpuBlockTablesRows(block_size, max_num_reqs, max_num_blocks_per_req,
                                   max_num_batched_tokens)
    return BlockTable(block_size=block_size, max_num_reqs=max_num_reqs,
                      max_num_blocks_per_req=max_num_blocks_per_req,
                      max_num_batched_tokens=max_num_batched_tokens, pin_memory=False,
                      device=torch.device("cpu"), **block_table_kwargs(block_size))


class _CpuBlockTablesRows:
    """0.34.0: one group's rows in the CPU model runner v2's ``CPUBlockTables``, written by
    its own ``append_block_ids`` (a new or resumed request's table overwrites its row)."""

    def __init__(self, block_size: int, max_num_reqs: int, max_num_blocks: int,
                 max_num_batched_tokens: int):
        import torch
        from vllm.v1.worker.cpu.block_table import CPUBlockTables
        _note("CPUBlockTables of the model runner v2")
        self.block_size = block_size
        self.tables = CPUBlockTables([block_size], max_num_reqs, max_num_batched_tokens,
                                     [max_num_blocks], torch.device("cpu"))

    def add_row(self, block_ids: list[int], row: int) -> None:
        self.tables.append_block_ids(row, (block_ids,), overwrite=True)

    def append_row(self, block_ids: list[int], row: int) -> None:
        self.tables.append_block_ids(row, (block_ids,), overwrite=False)

    @property
    def block_table(self):
        """The group's rows as ``BlockTable.block_table`` shows them (``.np``)."""
        return types.SimpleNamespace(np=self.tables.block_tables_np[0])


def slot_mapping(table, row: int, first_position: int, num_tokens: int) -> list[int]:
    """The KV slots of ``num_tokens`` new tokens of the request in ``row`` of vLLM's worker
    ``BlockTable`` (one KV cache group), from ``first_position`` on.

    Up to 0.18.1 vLLM computes them on the CPU with numpy (``compute_slot_mapping``), and
    the harness calls it.  From 0.19.0 that is a Triton kernel, which needs a GPU; vLLM's
    CPU backend replaces it with a compiled op of its CPU build, which the CUDA wheel does
    not have.  The harness then reads the row that vLLM's own ``add_row``/``append_row``
    wrote into the table and applies the kernel's rule for one context-parallel rank with
    kernel pages the size of the manager's pages (as the harness configures every
    ``BlockTable``): slot = page * block_size + position % block_size.  That this is the
    kernel's answer is checked, not assumed: with ``HARNESS_SLOT_KERNEL=verify`` the
    kernel itself also runs, under Triton's interpreter (:func:`_interpreted_slots`), and
    ``upgrade-report`` runs the bundled streams so; ``tests/test_upgrade.py`` checks
    the rule against the numpy path of the installed release.  0.34.0 has no such
    kernel to interpret (its CPU runner calls a compiled op, its GPU runner a kernel of
    another shape), so there the rule is not checked against vLLM.
    """
    if not SLOTS_BY_KERNEL:
        positions = np.arange(first_position, first_position + num_tokens, dtype=np.int64)
        table.compute_slot_mapping(np.full(num_tokens, row, dtype=np.int64), positions)
        return table.slot_mapping.np[:num_tokens].tolist()
    _note("slot mapping by a Triton kernel: the kernel's rule on vLLM's block table")
    slots = slots_from_block_table(table.block_table.np[row], table.block_size,
                                   first_position, num_tokens)
    if os.environ.get(VERIFY_SLOT_KERNEL) == "verify" and _kernel_to_interpret() is not None:
        by_kernel = _interpreted_slots(table, row, first_position, num_tokens)
        if by_kernel != slots:
            raise AssertionError(f"slot mapping of row {row}: vLLM's kernel gives {by_kernel}, "
                                 f"the block-table rule {slots}")
    return slots


def slots_from_block_table(pages, block_size: int, first_position: int, num_tokens: int) -> list[int]:
    """The block-table rule on one row of the table (``pages``, a numpy row): slot = page *
    block_size + position % block_size for each of the ``num_tokens`` positions from
    ``first_position`` on (a position past the row raises IndexError, as numpy's lookup
    does).  Plain Python over the pages the tokens touch: numpy's per-call overhead is
    more than the whole answer costs for the few tokens of a step."""
    if num_tokens <= 0:
        return []
    first_page = first_position // block_size
    last_page = (first_position + num_tokens - 1) // block_size
    row = pages[first_page:last_page + 1].tolist()
    return [row[p // block_size - first_page] * block_size + p % block_size
            for p in range(first_position, first_position + num_tokens)]


def worker_slots(table, row: int, first_position: int, num_tokens: int,
                 verify: bool = False) -> list[int]:
    """The KV slots the step loop records for one request of one KV cache group: the
    block-table rule on the row that vLLM's own ``add_row``/``append_row`` wrote.

    Up to 0.18.1 that is what vLLM's numpy ``compute_slot_mapping`` computes (the rule is
    held to it on the installed release by ``tests/test_upgrade.py``), and it is taken
    from the row directly: called per request and step, numpy cost more than the rest of
    the vLLM engine's translation together.  With ``verify`` (``HARNESS_SLOT_KERNEL=verify``,
    :func:`verifies_slots`) every answer is also held to :func:`slot_mapping`, vLLM's own
    computation, and a difference stops the run.  The kernel releases go through
    :func:`slot_mapping` itself, which applies the rule and interprets the kernel to verify.
    """
    if SLOTS_BY_KERNEL:
        return slot_mapping(table, row, first_position, num_tokens)
    slots = slots_from_block_table(table.block_table.np[row], table.block_size,
                                   first_position, num_tokens)
    if verify:
        by_vllm = slot_mapping(table, row, first_position, num_tokens)
        if by_vllm != slots:
            raise AssertionError(f"slot mapping of row {row}: vLLM's compute_slot_mapping "
                                 f"gives {by_vllm}, the block-table rule {slots}")
    return slots


def worker_slot_runs(table, row: int, first_position: int, num_tokens: int,
                     verify: bool = False) -> list[list[int]]:
    """:func:`worker_slots` as the trace writes them, [start, end) runs of consecutive
    slots: the block-table rule a page at a time on the pages the tokens touch, or,
    where vLLM's own computation is asked for (a kernel release, ``verify``), the runs of
    :func:`worker_slots`."""
    if SLOTS_BY_KERNEL or verify:
        return slot_ranges(worker_slots(table, row, first_position, num_tokens, verify))
    rows, size = table.block_table.np, table.block_size
    offset = first_position % size
    if 0 < num_tokens <= size - offset:  # one page (every decode step): one run
        # (read as an int at once: a numpy slice costs five times more)
        first_slot = rows.item(row, first_position // size) * size + offset
        return [[first_slot, first_slot + num_tokens]]
    if num_tokens <= 0:
        return []
    pages = rows[row, page_span(first_position, num_tokens, size)].tolist()
    return slot_runs(pages, size, first_position, num_tokens)


def verifies_slots() -> bool:
    """Whether ``HARNESS_SLOT_KERNEL=verify`` asks for vLLM's own slot mapping beside the
    rule (read when a run starts)."""
    return os.environ.get(VERIFY_SLOT_KERNEL) == "verify"


def _kernel_to_interpret():
    """vLLM's slot-mapping kernel of the v1 model runner, where the release has it (0.19.0
    to 0.28.0; 0.29.0 moved it, 0.34.0 dropped that runner): None otherwise."""
    if BlockTable is None:
        return None
    from vllm.v1.worker import block_table as module
    return getattr(module, "_compute_slot_mapping_kernel", None)


@functools.lru_cache(maxsize=1)
def _interpreted_kernel():
    """vLLM's ``_compute_slot_mapping_kernel`` under Triton's CPU interpreter.  Without a
    GPU driver vLLM puts a placeholder in place of ``triton``, so the kernel module holds the
    bare function; it is rebound to the real ``triton.language`` and interpreted."""
    import triton
    import triton.language as tl
    from triton.runtime.interpreter import InterpretedFunction
    kernel = _kernel_to_interpret()
    fn = getattr(kernel, "fn", kernel)
    bound = types.FunctionType(fn.__code__, {**fn.__globals__, "tl": tl, "triton": triton},
                               fn.__name__, fn.__defaults__, fn.__closure__)
    bound.__annotations__ = dict(fn.__annotations__)
    return InterpretedFunction(bound)


def _interpreted_slots(table, row: int, first_position: int, num_tokens: int) -> list[int]:
    """The kernel maps batch index ``i`` to table row ``i``: rows before ``row`` get no
    tokens (empty ranges in ``query_start_loc``)."""
    import torch

    from vllm.v1.worker import block_table as module
    table.commit_block_table(row + 1)
    query_start_loc = torch.tensor([0] * (row + 1) + [num_tokens], dtype=torch.int32)
    positions = torch.arange(first_position, first_position + num_tokens, dtype=torch.int64)
    real = module._compute_slot_mapping_kernel
    module._compute_slot_mapping_kernel = _interpreted_kernel()
    try:
        table.compute_slot_mapping(row + 1, query_start_loc, positions)
    finally:
        module._compute_slot_mapping_kernel = real
    return table.slot_mapping.gpu[:num_tokens].tolist()


#: 0.19.0 and later size the encoder through ``vllm.multimodal.encoder_budget.MultiModalBudget``.
BUDGET_ASKS_MODEL_CONFIG = importlib.util.find_spec("vllm.multimodal.encoder_budget") is not None


@contextlib.contextmanager
def multimodal_while_sizing(model_config, images: bool):
    """While the scheduler starts: a model config with a (default) multimodal config, for a
    stream with images on a text-only bundled model.

    From 0.19.0 ``MultiModalBudget`` asks the model config for its multimodal config (it
    reads ``enable_mm_embeds``, off by default) before it asks the registry stand-in for
    the largest item; a text-only config refuses.  Only the scheduler's start-up sees it:
    the shared model config is put back at once.
    """
    if not (images and BUDGET_ASKS_MODEL_CONFIG and model_config.multimodal_config is None):
        yield
        return
    from vllm.config.multimodal import MultiModalConfig
    _note("MultiModalBudget reads the model's multimodal config")
    # No processor cache: the harness's items carry no data, and no client-side cache
    # stands behind them (0.34.0's EngineCore builds a receiver cache otherwise).
    model_config.multimodal_config = MultiModalConfig(mm_processor_cache_gb=0)
    # From 0.31.0 the scheduler asks the model config, not its registry, whether the model
    # takes multimodal inputs; the config asks vLLM's global registry for the model's
    # processor, which the bundled text-only models lack (it would answer "text-only": no
    # encoder budget, and no request with an image ever scheduled).  It answers as the
    # registry stand-in does, while the scheduler starts.
    asks_model = hasattr(model_config, "_cached_supports_multimodal_inputs")
    if asks_model:
        _note("ModelConfig.supports_multimodal_inputs answered as the registry stand-in")
        object.__setattr__(model_config, "_cached_supports_multimodal_inputs", lambda: True)
    try:
        yield
    finally:
        model_config.multimodal_config = None
        if asks_model:
            object.__delattr__(model_config, "_cached_supports_multimodal_inputs")


#: Request statuses renamed by later releases, under their 0.11.0 names (the trace's).
_STATUS_NAMES = {"WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR": "WAITING_FOR_FSM"}  # 0.19.0


#: The statuses seen whose name is the trace's, by status (an enum's ``name`` is slow to
#: ask for every request at every step).
_PLAIN_NAMES: dict = {}


def status_name(status) -> str:
    name = _PLAIN_NAMES.get(status)
    if name is not None:
        return name
    name = status.name
    if name in _STATUS_NAMES:
        _note(f"RequestStatus.{name}")
        return _STATUS_NAMES[name]
    _PLAIN_NAMES[status] = name
    return name


def resumed_flags(cached) -> list[bool]:
    """Per cached request of a SchedulerOutput: was it resumed from preemption?  (From
    0.34.0 none is: a resumed request is handed among the new ones, see
    :func:`resumed_among_new`.)"""
    if hasattr(cached, "resumed_from_preemption"):
        return list(cached.resumed_from_preemption)
    if hasattr(cached, "resumed_req_ids"):
        _note("CachedRequestData.resumed_req_ids")
        resumed = cached.resumed_req_ids
        return [rid in resumed for rid in cached.req_ids]
    _note("resumed requests handed among the new ones")
    return [False] * len(cached.req_ids)


@functools.lru_cache(maxsize=None)
def applies_batch_the_worker_is_done_with() -> bool:
    """Whether EngineCore's ``step_with_batch_queue`` applies the oldest batch in flight
    as soon as the worker is done with it (it asks that batch's Future ``done()``), as up
    to 0.22.1; from 0.23.0 it applies one only when the queue is full or the scheduler
    holds no request.  Read from the method's source: the rule is a condition in its
    body, with no attribute or signature to show it."""
    from vllm.v1.engine.core import EngineCore
    asks = asks_whether_the_worker_is_done(EngineCore.step_with_batch_queue)
    if not asks:
        _note("batch queue applied only when full")
    return asks


def asks_whether_the_worker_is_done(step_with_batch_queue) -> bool:
    """Whether this ``step_with_batch_queue`` asks a batch's Future ``done()``."""
    return ".done()" in inspect.getsource(step_with_batch_queue)


def resumes_among_new(scheduler) -> bool:
    """Whether the scheduler hands a request resumed from preemption among the new ones:
    always in 0.34.0 (``CachedRequestData`` has no resumed flag left), and before that
    when it serves the model runner v2 (``Scheduler.use_v2_model_runner``, 0.25.1 seen:
    its resumed list is moved into the new one and the flag set stays empty)."""
    return RESUMED_AMONG_NEW or bool(getattr(scheduler, "use_v2_model_runner", False))


def resumed_among_new(new_reqs, requests, scheduler=None) -> list[bool]:
    """Per new request of a SchedulerOutput (``NewRequestData``): was it resumed from
    preemption?  ``requests``: the harness's vLLM ``Request`` of each id.

    Where vLLM hands a resumed request among the cached ones, flagged, none is.  0.34.0
    (and earlier releases serving the model runner v2, see :func:`resumes_among_new`)
    hands it among the new ones, with its whole block table, and no flag.
    Older releases flagged exactly the requests ``schedule()`` took from the waiting queue
    in status PREEMPTED; in 0.34.0 a request in that status when taken has been preempted
    (``num_preemptions`` > 0, which nothing lowers), and one preempted before and taken
    again is always in that status (only a streaming session's update sets a preempted
    request WAITING; the harness has none).  So a new request is resumed exactly when its
    ``num_preemptions`` is positive: a request is new once, and each later time it is
    among the new ones it comes back from a preemption.

    Checked over the bundled streams (2026-12-03): on 0.33.0 with the model runner v1
    (``VLLM_USE_V2_MODEL_RUNNER=0``) the rule gives vLLM's own ``resumed_req_ids`` on all
    295 whole-table hand-overs (14 resumed); on 0.33.0 (v2) and 0.34.0 it gives, on all
    255 and 294, the requests PREEMPTED when ``schedule()`` began or preempted in it.
    """
    if not new_reqs or not resumes_among_new(scheduler):
        return [False] * len(new_reqs)
    _note("resumed requests handed among the new ones")
    return [requests[d.req_id].num_preemptions > 0 for d in new_reqs]


def _cached_fields() -> set[str]:
    from vllm.v1.core.sched.output import CachedRequestData
    return {*getattr(CachedRequestData, "__dataclass_fields__", {}), *vars(CachedRequestData)}


#: 0.34.0: CachedRequestData carries no resumed flag; resumed requests are among the new ones.
RESUMED_AMONG_NEW = not {"resumed_from_preemption", "resumed_req_ids"} & _cached_fields()


def runner_output_kwargs(req_ids: list[str]) -> dict[str, Any]:
    """``ModelRunnerOutput(req_id_to_index=)`` where it has the field (gone in 0.34.0: the
    scheduler reads a request's place in ``req_ids``)."""
    if "req_id_to_index" in getattr(ModelRunnerOutput, "__dataclass_fields__", {}):
        return {"req_id_to_index": {rid: i for i, rid in enumerate(req_ids)}}
    _note("ModelRunnerOutput without req_id_to_index")
    return {}


_SAMPLED_AS_ARRAYS = "ndarray" in str(
    getattr(ModelRunnerOutput, "__dataclass_fields__", {}).get("sampled_token_ids", None)
    and ModelRunnerOutput.__dataclass_fields__["sampled_token_ids"].type)


def sampled_token_ids(tokens: list[list[int]]) -> list:
    if _SAMPLED_AS_ARRAYS:
        _note("sampled_token_ids as numpy arrays")
        return [np.array(t, dtype=np.int64) for t in tokens]
    return tokens


def set_aside_queue_hook(record, scheduler=None):
    """A context manager for one ``schedule()`` call: the queue vLLM makes there for the
    waiting requests it passes over (``skipped_waiting_requests``) reports each request
    put into it to ``record``.  The scheduler's own waiting queue is made at start-up,
    outside the hook, so it is not affected.

    From 0.31.0 ``schedule()`` passes a request over in a local ``skip_request``, into
    plain deques (one per waiting queue), and marks it in the scheduler's
    ``deferred_waiting`` set first; the only ``add`` to that set inside ``schedule()``
    is that mark, so the set reports each ``add`` made while the hook is on."""
    deferred = getattr(scheduler, "deferred_waiting", None)
    if isinstance(deferred, set):
        _note("set-aside requests seen in Scheduler.deferred_waiting")
        marks = _RecordingSet(deferred)
        scheduler.deferred_waiting = marks
        marking = _Set(marks, "record", record, None)
        return lambda: marking

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

    hooked = _Set(sched_module, "create_request_queue", recording_queue, real)
    return lambda: hooked


class _Set:
    """A context manager that sets ``owner.name`` to ``inside`` while it is entered and to
    ``outside`` when it is left, however it is left (a class: one made of a generator
    costs more than the hook itself, once per step)."""

    def __init__(self, owner, name: str, inside, outside) -> None:
        self.owner, self.name, self.inside, self.outside = owner, name, inside, outside

    def __enter__(self) -> None:
        setattr(self.owner, self.name, self.inside)

    def __exit__(self, *exc) -> None:
        setattr(self.owner, self.name, self.outside)


class _RecordingSet(set):
    """A set that reports each element added while ``record`` is set."""

    record = None

    def add(self, element) -> None:
        if self.record is not None:
            self.record(element)
        super().add(element)


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
    ids = list(grammar.structured_output_request_ids)
    return ({rid: i for i, rid in enumerate(ids)},
            written_bitmask_rows(grammar.grammar_bitmask.tolist(), ids,
                                 output.scheduled_spec_decode_tokens,
                                 getattr(scheduler, "num_spec_tokens", 0) or 0))


def written_bitmask_rows(rows: list, ids: list[str], spec_tokens: dict[str, list[int]],
                         num_spec_tokens: int) -> list:
    """The bitmask rows vLLM wrote for this step, request after request: one per scheduled
    draft plus one.

    Up to 0.33.0 they are packed, and the bitmask holds exactly those.  0.34.0 gives each
    request a block of ``1 + num_spec_tokens`` rows and writes only the first ones (the
    others keep what an earlier step left): the block's written rows are taken.  Which
    layout a bitmask has is told by its length; when each request has every draft (or
    there are none) the two layouts are the same rows.
    """
    wanted = [1 + len(spec_tokens.get(rid, ())) for rid in ids]
    stride = 1 + num_spec_tokens
    owners = [rid for rid, n in zip(ids, wanted) for _ in range(n)]
    if len(rows) != sum(wanted) and len(rows) == stride * len(ids):
        _note("grammar bitmask in fixed blocks per request")
        rows = [row for i, n in enumerate(wanted) for row in rows[i * stride:i * stride + n]]
    if len(rows) != len(owners):
        return rows
    return [_unconstrained(row, owner) for row, owner in zip(rows, owners)]


#: A bitmask row that allows every token: vLLM fills it with all bits set (int32 -1).
FULL_MASK_ROW = [-1, -1]


def _unconstrained(row: list, owner: str) -> list:
    """A row the grammar did not fill (0.34.0: the one after a draft the grammar rejects,
    as vLLM no longer cuts drafts before handing them over) allows every token; it is
    traced under the request whose rows hold it, with grammar state -1."""
    if list(row) != FULL_MASK_ROW:
        return row
    _note("bitmask rows the grammar leaves unconstrained")
    return [owner, -1]


def set_structured_output_backend(params) -> None:
    """The backend name vLLM's input processor resolves for a request (``_backend``; the
    engine's default ``auto`` gives ``xgrammar`` for a JSON object), which 0.34.0's
    ``grammar_init`` requires.  The harness's backend stand-in is in place already, so
    the name selects nothing."""
    so = getattr(params, "structured_outputs", None)
    if so is not None and getattr(so, "_backend", "absent") is None:
        _note("StructuredOutputsParams._backend set as the input processor sets it")
        so._backend = "xgrammar"


def structured_output_request_kwargs(params) -> dict[str, Any]:
    """0.11.0's Request takes its StructuredOutputRequest; from 0.11.1 it builds one from
    the sampling parameters itself."""
    from vllm.v1.request import Request
    if "structured_output_request" in _params(Request.__init__):
        from vllm.v1.structured_output.request import StructuredOutputRequest
        return {"structured_output_request": StructuredOutputRequest(sampling_params=params)}
    _note("Request builds its StructuredOutputRequest")
    return {}


def _layout_resolver():
    """0.29.0: ``resolve_kv_cache_layout`` and the worker's list of the layouts its
    backends support, or None where the sizing reads no resolved layout."""
    try:
        from vllm.v1.attention.backends.utils import (get_supported_kv_cache_layouts,
                                                      resolve_kv_cache_layout)
    except ImportError:
        return None
    return resolve_kv_cache_layout, get_supported_kv_cache_layouts


def supported_kv_cache_layouts() -> list[str] | None:
    """What a CUDA worker running the flash-attention backend reports to the engine core
    (``get_supported_kv_cache_layouts``: names, most preferred first); None before 0.29.0."""
    found = _layout_resolver()
    if found is None:
        return None
    from vllm.v1.attention.backends.flash_attn import FlashAttentionBackend
    return [layout.name for layout in found[1]([FlashAttentionBackend])]


def resolve_kv_cache_layout(vllm_config, specs) -> None:
    """0.29.0: the engine core resolves one KV cache layout for the model, from what the
    workers' backends support and the layers' specs, before the start-up sizing reads it
    (``get_kv_cache_configs`` raises while it is unresolved).  Done here as the engine
    core does it, once per config; nothing to do before 0.29.0."""
    found = _layout_resolver()
    if found is None or getattr(vllm_config.cache_config, "kv_cache_layout", None) is not None:
        return
    _note("resolve_kv_cache_layout before the start-up sizing")
    found[0](vllm_config, [supported_kv_cache_layouts()], list(specs))


def flash_attention_kv_shape(num_blocks: int, spec) -> tuple[int, ...] | None:
    """One layer's KV tensor shape as the flash-attention backend sees it, or None for a
    block size the backend refuses.  Up to 0.28.0 the backend's ``get_kv_cache_shape``;
    from 0.29.0 (gone) the logical per-layer view every backend gets
    (``compute_layer_kv_cache_shape_bytes``: pages, heads, tokens, content in bytes),
    its content counted in the cache's dtype, for a block size the backend's kernels take."""
    from vllm.v1.attention.backends.flash_attn import FlashAttentionBackend
    get_shape = getattr(FlashAttentionBackend, "get_kv_cache_shape", None)
    if get_shape is not None:
        try:
            return tuple(get_shape(num_blocks, spec.block_size, spec.num_kv_heads, spec.head_size))
        except ValueError:
            return None
    _note("KV tensor shape from compute_layer_kv_cache_shape_bytes")
    from vllm.v1.kv_cache_interface import compute_layer_kv_cache_shape_bytes
    if not FlashAttentionBackend.supports_block_size(spec.block_size):
        return None
    *outer, content = compute_layer_kv_cache_shape_bytes(spec, num_blocks)
    return (*outer, content // spec.dtype.itemsize)


def kv_cache_configs(vllm_config, specs: list[dict], memory: list[int]) -> list:
    """vLLM's start-up sizing of the KV pool from memory, as EngineCore calls it.

    From 0.33.0 ``get_kv_cache_configs`` lives in ``kv_cache_planning`` and takes the
    model's global KV cache groups, which EngineCore computes first with
    ``get_global_kv_cache_groups``."""
    try:
        from vllm.v1.core import kv_cache_planning as planning
    except ImportError:
        planning = None
    if planning is not None and hasattr(planning, "get_global_kv_cache_groups"):
        _note("get_kv_cache_configs in kv_cache_planning, with the global groups")
        groups = planning.get_global_kv_cache_groups(vllm_config, specs)
        return planning.get_kv_cache_configs(vllm_config, specs, memory, groups)
    from vllm.v1.core import kv_cache_utils
    return kv_cache_utils.get_kv_cache_configs(vllm_config, specs, memory)

