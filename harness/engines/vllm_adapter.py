"""The real vLLM 0.11.0 engine, instrumented.  All of vLLM's internals live here.

An upgrade to another vLLM version should touch this file only: it builds
vLLM's config and ``Scheduler`` offline from ``fixtures/models/<model>``,
creates ``Request`` objects, turns ``SchedulerOutput`` into the engine-neutral
:class:`~harness.formats.steps.Scheduled`, and installs the hooks that see
what ``SchedulerOutput`` does not carry:

* preemptions, in order: ``KVCacheManager.free`` called inside ``schedule()``
  (during ``schedule()`` vLLM frees pages only to preempt);
* prefix hits: the result of ``KVCacheManager.get_computed_blocks``;
* evictions: ``BlockPool._maybe_evict_cached_block`` returning True.

The worker's view of the KV slots is vLLM's own
``vllm.v1.worker.block_table.BlockTable`` on the CPU, fed as the model runner feeds
it; the slots are the block-table rule on its rows (``vllm_compat.worker_slots``).

Speculative decoding: vLLM's ``SpeculativeConfig`` wants a draft model, but the
scheduler reads only ``num_speculative_tokens`` and ``use_eagle()``; a small
stand-in object with exactly those two members takes its place.

LoRA: real ``LoRARequest``s (their adapter path is never read: the scheduler
reads only the integer id) under a real ``LoRAConfig``.

Multimodal inputs: real ``MultiModalFeatureSpec``s (placeholder range and content
hash; no pixel data, which only the worker reads) and vLLM's real
``EncoderCacheManager``.  vLLM sizes the encoder's compute budget and cache
itself (``compute_encoder_budget``: the scheduler config's two sizes, raised to
the model's largest item); only the largest item comes from a stand-in,
:class:`EncoderRegistry`, because vLLM asks the model's multimodal processor,
which the bundled text-only configs do not have.  The scheduler config's two
sizes are set from the stream where it names them (``encoder_compute_budget``,
``encoder_cache_size``; vLLM itself always sets ``max_num_batched_tokens``).

Pooling requests: real ``PoolingParams`` (task ``embed``) and no sampling
parameters; the stand-in model runner returns no sampled tokens and a pooled
output (:data:`POOLED`) for each request whose prefill it completed, as vLLM's
pooling runner does.

Structured output: vLLM compiles a grammar with a backend (xgrammar) that needs
the tokenizer, which is not available offline.  The request, its
``StructuredOutputRequest`` and vLLM's ``StructuredOutputManager`` are real; the
grammar is :class:`ScriptedGrammar` (it rejects the stream's tokens and writes
its state into the bitmask), handed over through a ``Future`` that the harness
completes at the stream's ``ready_step`` (vLLM's ``grammar_init`` hands a
``Future`` of the compiling backend), and the backend is
:class:`BitmaskBackend`, which only allocates the bitmask.
"""

from __future__ import annotations

from harness.engines import vllm_env  # before vLLM is imported

import dataclasses  # noqa: E402
import types  # noqa: E402
from collections import deque  # noqa: E402
from concurrent.futures import Future  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
import vllm  # noqa: E402
from vllm.config import (CacheConfig, DeviceConfig, KVEventsConfig, KVTransferConfig,  # noqa: E402
                         LoRAConfig, ModelConfig, SchedulerConfig, VllmConfig)
from vllm.distributed.kv_events import EventPublisher, EventPublisherFactory  # noqa: E402
from vllm.lora.request import LoRARequest  # noqa: E402
from vllm.multimodal.inputs import MultiModalFeatureSpec, PlaceholderRange  # noqa: E402
from vllm.pooling_params import PoolingParams  # noqa: E402
from vllm.sampling_params import SamplingParams, StructuredOutputsParams  # noqa: E402
from vllm.v1.core.kv_cache_utils import init_none_hash  # noqa: E402
from vllm.v1.attention.backends.flash_attn import FlashAttentionBackend  # noqa: E402
from vllm.v1.core.sched.async_scheduler import AsyncScheduler  # noqa: E402
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402
from vllm.v1.kv_cache_interface import (ChunkedLocalAttentionSpec,  # noqa: E402
                                        FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec,
                                        MambaSpec, SlidingWindowSpec)
from vllm.v1.outputs import DraftTokenIds, KVConnectorOutput, ModelRunnerOutput  # noqa: E402
from vllm.v1.request import Request, RequestStatus  # noqa: E402
from vllm.v1.structured_output import StructuredOutputManager  # noqa: E402
from vllm.v1.structured_output.backend_types import StructuredOutputGrammar  # noqa: E402

from harness.engines import vllm_compat as compat  # noqa: E402
from harness.engines import vllm_connector  # noqa: E402
from harness.formats.steps import (NEW, RESUMED, RUNNING, ConnectorScript, HashNumbers,  # noqa: E402
                                  Observed, RequestState, Scheduled, StepStates, counts_before,
                                  kv_cache_header, kv_event_records, stats_record, to_scheduled)
from harness.formats.paths import MODELS_DIR  # noqa: E402
from harness.formats.trace import optional_fields  # noqa: E402
from harness.formats.stream import Config, RequestSpec, Stream, largest_mm_item, lora_ids  # noqa: E402
from reference.arith import cdiv  # noqa: E402

vllm_env.quiet_vllm_logs()

VLLM_VERSION = vllm.__version__

_MODEL_CONFIGS: dict[str, ModelConfig] = {}
#: A pooled output (an embedding); the scheduler only asks whether there is one.
POOLED = torch.zeros(1)


class SpeculativeStandIn:
    """Stands in for vLLM's SpeculativeConfig: the scheduler reads only these.

    (``uses_draft_model()`` is read from 0.15.0 on, ``use_dflash()`` from 0.23.0; those
    drafters reserve lookahead slots like eagle.  The harness's methods are ngram and
    eagle.)
    """

    def __init__(self, num_speculative_tokens: int, method: str):
        self.num_speculative_tokens = num_speculative_tokens
        self.method = method

    def use_eagle(self) -> bool:
        return self.method == "eagle"

    def uses_draft_model(self) -> bool:
        return self.method == "draft_model"

    def use_dflash(self) -> bool:  # read from 0.23.0
        return self.method == "dflash"

    @property
    def parallel_drafting(self) -> bool:
        """Read from 0.33.0 (``VllmConfig``'s model runner v2 check): vLLM sets it for
        dflash and dspark, which draft in parallel; every other method drafts in turn."""
        return self.method in ("dflash", "dspark")

    #: read from 0.24.0: a number of drafts per batch size (none: always num_speculative_tokens)
    num_speculative_tokens_per_batch_size = None
    #: read from 0.28.0: extra query slots a drafter needs per request (0 for ngram and
    #: for eagle without parallel drafting, as vLLM's own table says)
    max_num_new_slots_for_drafting = 0

    def use_dspark(self) -> bool:  # read from 0.25.0
        return False

    def use_multi_module_mtp(self) -> bool:  # read from 0.28.0
        return False

    # Read from 0.34.0, as vLLM's SpeculativeConfig answers them: its options at their
    # defaults, and what it derives from the method (its own code, restated).
    custom_method = None
    disable_eagle_block_drop = False
    disable_lookahead_block_hashes = False
    enable_adaptive_verification = False

    @property
    def speculator_config(self):
        """vLLM's own config class of the method (``NgramSpeculatorConfig``,
        ``EagleSpeculatorConfig``): the lookahead the scheduler reserves and the tokens a
        prefill chunk keeps ahead come from it (``VllmConfig.num_lookahead_tokens``)."""
        return compat.speculator_config(self)

    @property
    def uses_target_hidden_states(self) -> bool:
        return self.speculator_config.uses_target_hidden_states

    def needs_eagle_block_drop(self) -> bool:
        return self.use_eagle() and not (self.use_dflash() or self.use_dspark())

    def use_eagle_block_drop(self) -> bool:
        return self.needs_eagle_block_drop() and not self.disable_eagle_block_drop

    def uses_dynamic_speculative_decoding(self) -> bool:
        return self.num_speculative_tokens_per_batch_size is not None


class ScriptedGrammar(StructuredOutputGrammar):
    """Stands in for a compiled grammar: rejects the stream's ``rejected_tokens``, never
    terminates, and counts the tokens it has accepted (its state).  A bitmask row it
    fills holds the request's row number in the harness and that state."""

    def __init__(self, rejected: frozenset[int], row: int):
        self.rejected = rejected
        self.row = row
        self.num_accepted = 0

    def accept_tokens(self, request_id: str, tokens: list[int]) -> bool:
        if any(t in self.rejected for t in tokens):
            return False
        self.num_accepted += len(tokens)
        return True

    def validate_tokens(self, tokens: list[int]) -> list[int]:
        for i, t in enumerate(tokens):
            if t in self.rejected:
                return tokens[:i]
        return list(tokens)

    def rollback(self, num_tokens: int) -> None:
        self.num_accepted -= num_tokens

    def fill_bitmask(self, bitmask: torch.Tensor, batch_index: int) -> None:
        bitmask[batch_index, 0] = self.row
        bitmask[batch_index, 1] = self.num_accepted

    def is_terminated(self) -> bool:
        return False

    def reset(self) -> None:
        self.num_accepted = 0


class BitmaskBackend:
    """Stands in for the structured-output backend: the manager only asks it for the
    bitmask tensor (two int32 columns: row number and grammar state)."""

    def allocate_token_bitmask(self, max_num_seqs: int) -> torch.Tensor:
        return torch.full((max_num_seqs, 2), -1, dtype=torch.int32)

    def compile_grammar(self, request_type, grammar_spec) -> None:
        """EngineCore's ``grammar_init`` compiles at arrival; the harness replaces that
        Future with its own, completed at the stream's ``ready_step``."""
        return None

    def destroy(self) -> None:
        pass


class WorkerTable:
    """vLLM's own worker ``BlockTable`` on the CPU, behind the harness's WorkerTable.

    One per KV cache group, as vLLM's ``MultiGroupBlockTable`` holds them: a
    row is wide enough for ``max_model_len`` tokens or ``1 + num_speculative_tokens``
    pages, whichever is more.
    """

    def __init__(self, c: Config, block_size: int, num_requests: int):
        self.table = compat.cpu_block_table(
            block_size, num_requests,
            max(cdiv(c.max_model_len, block_size), 1 + c.num_speculative_tokens),
            c.max_num_batched_tokens)
        self.verify = compat.verifies_slots()

    def add_row(self, block_ids: list[int], row: int) -> None:
        self.table.add_row(block_ids, row)

    def append_row(self, block_ids: list[int], row: int) -> None:
        self.table.append_row(block_ids, row)

    def slots(self, row: int, first_position: int, num_tokens: int) -> list[int]:
        return compat.worker_slots(self.table, row, first_position, num_tokens, self.verify)


class EventRecorder(EventPublisher):
    """An in-process KV event publisher: keeps the batches the scheduler publishes.

    Registered with vLLM's ``EventPublisherFactory`` under :data:`PUBLISHER` and
    chosen through ``KVEventsConfig(publisher=...)``, as a deployment chooses
    ``zmq``; nothing leaves the process.
    """

    def __init__(self, data_parallel_rank: int = 0, **zmq_settings) -> None:
        super().__init__(data_parallel_rank)
        self.batches: list = []

    def publish(self, events) -> None:
        self.batches.append(events)

    def take(self) -> list[list]:
        """The events of each batch published since the last call."""
        taken, self.batches = [b.events for b in self.batches], []
        return taken

    def shutdown(self) -> None:
        pass


PUBLISHER = "harness-recorder"
try:
    EventPublisherFactory.register_publisher(PUBLISHER, EventRecorder)
except KeyError:  # registered already: this module was imported again
    pass


def kv_events_config() -> KVEventsConfig:
    """KV cache events on, published to the :class:`EventRecorder`.  The publisher is named
    after the config is built: from 0.11.1 the field only admits ``null`` and ``zmq``,
    but the factory still looks the name up in its registry."""
    config = KVEventsConfig(enable_kv_cache_events=True)
    config.publisher = PUBLISHER
    return config


def model_config(name: str, max_model_len: int) -> ModelConfig:
    """vLLM's ModelConfig for a bundled config.json, built once per process, offline.

    Where the scheduler reads ``max_model_len`` from the model config (0.11.1
    and later), the stream's value is set on it for each stream.
    """
    if name not in _MODEL_CONFIGS:
        _MODEL_CONFIGS[name] = ModelConfig(
            model=str(MODELS_DIR / name), skip_tokenizer_init=True, seed=0)
    mc = _MODEL_CONFIGS[name]
    for key, value in compat.model_config_kwargs(max_model_len).items():
        setattr(mc, key, value)
    return mc


class EncoderRegistry:
    """Stands in for vLLM's ``MultiModalRegistry`` where the scheduler asks it for the
    model's largest item per modality: every item is an image of at most ``largest``
    tokens (none: a model whose modalities are all off)."""

    def __init__(self, largest: int) -> None:
        self.by_modality = {"image": largest} if largest else {}

    def supports_multimodal_inputs(self, model_config) -> bool:
        return True

    def get_max_tokens_per_item_by_modality(self, model_config, **kwargs) -> dict[str, int]:
        return dict(self.by_modality)

    get_max_tokens_per_item_by_nonzero_modality = get_max_tokens_per_item_by_modality

    # From 0.19.0 the scheduler sizes the encoder through ``MultiModalBudget``, which asks
    # the registry for the model's processor and the processor for the largest item.
    def processor_only_cache_from_config(self, vllm_config) -> None:
        return None

    def create_processor(self, model_config, cache=None) -> "_ProcessorStandIn":
        return _ProcessorStandIn(self.by_modality, model_config)


class _ProcessorStandIn:
    """What ``MultiModalBudget`` reads of a multimodal processor: its modalities (one image
    per prompt is allowed; the scheduler never reads the per-prompt limit) and the largest
    item of each."""

    def __init__(self, by_modality: dict[str, int], model_config=None) -> None:
        self.info = self
        # 0.34.0 reads the model's max_model_len through the processing context.
        self.ctx = types.SimpleNamespace(model_config=model_config)
        self.by_modality = by_modality
        self.supported_mm_limits = {m: None for m in by_modality}
        self.allowed_mm_limits = {m: 1 for m in by_modality}

    def get_mm_max_tokens_per_item(self, seq_len: int, mm_counts) -> dict[str, int]:
        return dict(self.by_modality)


def build_scheduler(c: Config, largest_mm_item: int = 0,
                    connector_script: ConnectorScript | None = None) -> Scheduler:
    vc, encoder = build_vllm_config(c, largest_mm_item, connector_script)
    scheduler = AsyncScheduler if c.async_scheduling else Scheduler
    kvc = compat.startup_retention(kv_cache_config(c, vc), vc)
    with compat.multimodal_while_sizing(vc.model_config, bool(encoder)):
        return scheduler(vllm_config=vc, kv_cache_config=kvc,
                         structured_output_manager=StructuredOutputManager(vc),
                         log_stats=c.log_stats, **encoder, **compat.scheduler_kwargs(vc, kvc))


def build_vllm_config(c: Config, largest_mm_item: int = 0,
                      connector_script: ConnectorScript | None = None
                      ) -> tuple[VllmConfig, dict]:
    """vLLM's config for a stream, and the scheduler's multimodal registry stand-in
    (as keyword arguments; none for a stream without an encoder)."""
    mc = model_config(c.model, c.max_model_len)
    sc = SchedulerConfig(
        disable_chunked_mm_input=c.disable_chunked_mm_input,
        max_num_seqs=c.max_num_seqs,
        max_num_batched_tokens=c.max_num_batched_tokens,
        max_model_len=c.max_model_len,
        enable_chunked_prefill=c.enable_chunked_prefill,
        long_prefill_token_threshold=c.long_prefill_token_threshold,
        policy=c.policy, **compat.async_scheduling_kwargs(c.async_scheduling),
        **compat.scheduler_config_kwargs(mc),
    )
    cc = CacheConfig(block_size=c.block_size, enable_prefix_caching=c.enable_prefix_caching,
                     **compat.cache_config_kwargs())
    cc.num_gpu_blocks = c.num_gpu_blocks
    lora = None if c.max_loras is None else LoRAConfig(max_loras=c.max_loras)
    events = kv_events_config() if c.kv_cache_events else None
    transfer = None
    if connector_script is not None:
        vllm_connector.SCRIPTS["engine"] = connector_script
        transfer = KVTransferConfig(
            kv_connector=vllm_connector.CONNECTOR, kv_role=c.kv_role,
            kv_connector_module_path=vllm_connector.MODULE,
            kv_connector_extra_config={"script": "engine"})
    vc = VllmConfig(model_config=mc, scheduler_config=sc, cache_config=cc,
                    device_config=DeviceConfig("cpu"), lora_config=lora, kv_events_config=events,
                    kv_transfer_config=transfer)
    # Pipeline stages as the scheduler sees them (it then sends the workers the tokens of
    # cached requests); set after construction, so that no process group is planned.
    vc.parallel_config.pipeline_parallel_size = c.pipeline_parallel_size
    if c.num_speculative_tokens > 0:
        object.__setattr__(vc, "speculative_config",
                           SpeculativeStandIn(c.num_speculative_tokens, c.speculative_method))
        compat.after_speculative_config(vc)
    effective = (vc.scheduler_config.max_num_batched_tokens, vc.cache_config.block_size,
                 compat.effective_chunked_prefill(vc.scheduler_config),
                 compat.effective_max_model_len(vc), vc.scheduler_config.async_scheduling)
    wanted = (c.max_num_batched_tokens, c.block_size, c.enable_chunked_prefill, c.max_model_len,
              c.async_scheduling)
    if effective != wanted:
        raise RuntimeError(f"vLLM changed the config: wanted {wanted}, got {effective}")
    encoder = {}
    if c.has_encoder:
        encoder["mm_registry"] = EncoderRegistry(largest_mm_item)
        if c.encoder_compute_budget is not None:
            sc.max_num_encoder_input_tokens = c.encoder_compute_budget
        if c.encoder_cache_size is not None:
            sc.encoder_cache_size = c.encoder_cache_size
    return vc, encoder


def layer_specs(vc: VllmConfig) -> dict[str, FullAttentionSpec]:
    """One full-attention spec per model layer, as the model runner reports them."""
    mc, pc = vc.model_config, vc.parallel_config
    spec = FullAttentionSpec(block_size=vc.cache_config.block_size,
                             num_kv_heads=mc.get_num_kv_heads(pc),
                             head_size=mc.get_head_size(), dtype=mc.dtype)
    return {f"layers.{i}": spec for i in range(mc.get_num_layers(pc))}


def pool_header(vc: VllmConfig, num_blocks: int) -> dict:
    """The trace header of a pool of ``num_blocks`` pages for the model's layers."""
    specs = layer_specs(vc)
    spec = next(iter(specs.values()))
    shape = compat.flash_attention_kv_shape(num_blocks, spec)  # None: a block size refused
    return kv_cache_header(num_blocks, spec.block_size, len(specs), spec.page_size_bytes, shape)


def pages_from_memory(c: Config) -> int:
    """What vLLM's start-up sizing (``get_kv_cache_configs``) makes of the stream's
    ``kv_cache_memory_bytes``."""
    vc, _ = build_vllm_config(c)
    vc.cache_config.num_gpu_blocks = None
    # The model config is shared by the streams: the stream's max_model_len only for
    # this call (a server sets it from --max-model-len; vLLM's estimate may change it).
    mc = vc.model_config
    model_max, mc.max_model_len = mc.max_model_len, c.max_model_len
    try:
        compat.resolve_kv_cache_layout(vc, layer_specs(vc).values())
        (config,) = compat.kv_cache_configs(vc, [layer_specs(vc)], [c.kv_cache_memory_bytes])
    finally:
        mc.max_model_len = model_max
    return config.num_blocks


def kv_cache_config(c: Config, vc: VllmConfig) -> KVCacheConfig:
    """The scheduler's KVCacheConfig: one KVCacheGroupSpec per stream group, in order.

    Without ``kv_cache_groups`` it is the model's one full-attention group, with
    the model's KV heads, head size and dtype as vLLM reads them.  A hybrid
    stream names its groups itself; each gets two layer names of its own.  A
    Mamba group's state shape is a stand-in (one float, its page padded to the
    attention page as vLLM pads a hybrid model's): the scheduler reads only its
    block size (``max_model_len``, as vLLM's model runner sets it) and
    ``num_speculative_blocks`` (the runner sets ``num_speculative_tokens``).
    """
    mc, pc = vc.model_config, vc.parallel_config
    attention = dict(block_size=c.block_size, num_kv_heads=mc.get_num_kv_heads(pc),
                     head_size=mc.get_head_size(), dtype=mc.dtype)
    if c.kv_cache_groups is None:
        layers = layer_specs(vc)
        return KVCacheConfig(
            num_blocks=c.num_gpu_blocks, kv_cache_tensors=[],
            kv_cache_groups=[KVCacheGroupSpec(list(layers), next(iter(layers.values())))])
    groups = []
    for i, g in enumerate(c.kv_cache_groups):
        if g.type == "full":
            spec = FullAttentionSpec(**attention)
        elif g.type == "sliding_window":
            spec = SlidingWindowSpec(**attention, sliding_window=g.sliding_window)
        elif g.type == "chunked_local":
            spec = ChunkedLocalAttentionSpec(**attention,
                                             attention_chunk_size=g.attention_chunk_size)
        else:
            # Padded to the attention page, as vLLM pads a hybrid model's Mamba page, so
            # that EngineCore's start-up can group the layers (one page size for all).
            spec = MambaSpec(shapes=((1,),), dtypes=(torch.float32,), block_size=c.max_model_len,
                             num_speculative_blocks=c.num_speculative_tokens,
                             page_size_padded=FullAttentionSpec(**attention).page_size_bytes)
        groups.append(KVCacheGroupSpec([f"layers.{2 * i}", f"layers.{2 * i + 1}"], spec))
    return KVCacheConfig(num_blocks=c.num_gpu_blocks, kv_cache_tensors=[], kv_cache_groups=groups)


def sampling_params(spec: RequestSpec) -> SamplingParams | None:
    """A request's SamplingParams as a client sends them (none for a pooling request)."""
    if spec.pooling:
        return None
    so = spec.structured_output
    return SamplingParams(
        max_tokens=spec.effective_max_tokens, ignore_eos=spec.ignore_eos,
        stop_token_ids=list(spec.stop_token_ids), prompt_logprobs=spec.prompt_logprobs,
        structured_outputs=None if so is None else StructuredOutputsParams(json_object=True))


def pooling_params(spec: RequestSpec) -> PoolingParams | None:
    return PoolingParams(task="embed") if spec.pooling else None


def mm_features(spec: RequestSpec) -> list[MultiModalFeatureSpec] | None:
    """A request's images: placeholder range and content hash (no pixel data)."""
    return [MultiModalFeatureSpec(
        data=None, modality="image", identifier=m.hash,
        mm_position=PlaceholderRange(offset=m.offset, length=m.length))
        for m in spec.mm_inputs] or None


class PagedWorkerTable(WorkerTable):
    """The worker table the engine reads: the step record's slot runs a page at a time
    (``vllm_compat.worker_slot_runs``) rather than a slot at a time.

    (Apart from :class:`WorkerTable`, below ``build_vllm_config``: an engine failure's
    message names the line it was raised at, and a trace keeps its bytes.)"""

    def slot_runs(self, row: int, first_position: int, num_tokens: int) -> list[list[int]]:
        return compat.worker_slot_runs(self.table, row, first_position, num_tokens,
                                       self.verify)


class _Unhooked:
    """The set-aside hook of a stream whose steps do not record the requests passed over:
    called for each ``schedule()`` as the hook is, a context that does nothing."""

    def __call__(self) -> "_Unhooked":
        return self

    def __enter__(self) -> None:
        pass

    def __exit__(self, *exc) -> None:
        pass


def scheduler_stats(outputs) -> object | None:
    """The SchedulerStats among ``update_from_output``'s EngineCoreOutputs, if any."""
    return next((o.scheduler_stats for o in outputs.values()
                 if o.scheduler_stats is not None), None)


def finish_in_arrival_order(sched):
    """The scheduler's ``finish_requests``, finishing several requests one at a time in
    the order they were added.

    The scheduler's update fails the requests of a step's errors (from 0.31.0 an encoder
    output of another length; a grammar that did not compile, a failed load) in one call
    with a set of their ids, and ``finish_requests`` frees them in the set's iteration
    order, which follows the per-process string hash (docs/findings.md, "Requests finished
    together are freed in PYTHONHASHSEED order").  Any order is one that vLLM shows
    under some hash seed; the harness fixes the requests' arrival order so that runs
    repeat, and the reference states that order.  One id, or none (every request), goes
    through unchanged.
    """
    real_finish = sched.finish_requests

    def finish_requests(request_ids, finished_status):
        if request_ids is None or isinstance(request_ids, str):
            return real_finish(request_ids, finished_status)
        wanted = set(request_ids)
        if len(wanted) < 2:
            return real_finish(list(wanted), finished_status)
        ordered = [rid for rid in sched.requests if rid in wanted]
        ordered += sorted(wanted.difference(ordered))  # unknown ids: ignored by vLLM
        finished = [real_finish(rid, finished_status) for rid in ordered]
        if all(f is None for f in finished):  # a release whose call returns nothing
            return None
        return [r for f in finished for r in (f or [])]

    return finish_requests


class VllmEngine:
    """vLLM 0.11.0's real Scheduler, KVCacheManager and BlockPool."""

    name = "vllm"

    def version(self) -> str:
        return VLLM_VERSION

    def start(self, stream: Stream) -> None:
        c = stream.config
        if c.kv_cache_memory_bytes is not None:
            # The pool is vLLM's own answer for the memory, whatever the stream computed.
            c = dataclasses.replace(c, num_gpu_blocks=pages_from_memory(c))
            stream = dataclasses.replace(stream, config=c)
        self.config = c
        self.script = ConnectorScript(stream) if c.kv_role is not None else None
        self.sched = self._build(stream)
        self.pooling = any(r.pooling for r in stream.requests)
        self._stats = None
        self.hasher = None
        if c.enable_prefix_caching:
            hash_fn = compat.hash_fn(self.sched.cache_config.prefix_caching_hash_algo)
            init_none_hash(hash_fn)
            self.hasher = compat.request_block_hasher(c.block_size, hash_fn,
                                                      self.sched.vllm_config)
        self.requests: dict[str, Request] = {}
        self.rows: dict[str, int] = {}
        self.workers = [PagedWorkerTable(c, g.kv_cache_spec.block_size, len(stream.requests))
                        for g in self.sched.kv_cache_config.kv_cache_groups]
        self.lora_ids = lora_ids(stream)
        self.row_ids: dict[int, str] = {}
        self.grammars: dict[str, tuple[Future, frozenset[int]]] = {}
        self.sched.structured_output_manager.backend = BitmaskBackend()
        self.hash_numbers = HashNumbers()
        self._in_flight: deque = deque()  # scheduler outputs not yet updated, oldest first
        self._records_set_aside = "set_aside" in optional_fields(stream)
        self._install_hooks()

    def _build(self, stream: Stream) -> Scheduler:
        return build_scheduler(stream.config, largest_mm_item(stream), self.script)

    # -- hooks -------------------------------------------------------------

    def _install_hooks(self) -> None:
        kvm = self.sched.kv_cache_manager
        pool = kvm.block_pool
        self._in_schedule = False
        self._observed = Observed()

        real_free = kvm.free
        real_lookup = kvm.get_computed_blocks
        real_evict = pool._maybe_evict_cached_block

        def free(request):
            if self._in_schedule:
                self._observed.preempted.append(request.request_id)
            return real_free(request)

        def get_computed_blocks(request, *args, **kwargs):
            # (pages, hit tokens), and from 0.34.0 a third value (a shared-prefix boundary)
            found = real_lookup(request, *args, **kwargs)
            self._observed.hits[request.request_id] = found[1]
            return found

        def maybe_evict(block):
            evicted = real_evict(block)
            if evicted:
                self._observed.evicted.append(block.block_id)
            return evicted

        kvm.free = free
        kvm.get_computed_blocks = get_computed_blocks
        pool._maybe_evict_cached_block = maybe_evict
        self.sched.finish_requests = finish_in_arrival_order(self.sched)
        # A step record holds the requests passed over only where the stream has a feature
        # that passes requests over (optional_fields); elsewhere the hook would only cost.
        self._set_aside_queue = compat.set_aside_queue_hook(
            lambda request: self._observed.set_aside.append(request.request_id), self.sched
        ) if self._records_set_aside else _Unhooked()

    # -- the engine interface ---------------------------------------------------

    def reset_prefix_cache(self) -> bool:
        return bool(self.sched.reset_prefix_cache())

    def abort(self, req_id: str) -> None:
        self.sched.finish_requests(req_id, RequestStatus.FINISHED_ABORTED)

    def add(self, spec: RequestSpec, arrival_index: int) -> None:
        params = sampling_params(spec)
        req = Request(
            request_id=spec.id, prompt_token_ids=list(spec.prompt), sampling_params=params,
            pooling_params=pooling_params(spec),
            **compat.request_eos_kwargs(params, spec.eos_token_id),
            arrival_time=float(arrival_index), cache_salt=spec.cache_salt,
            priority=spec.priority, lora_request=self.lora_request(spec),
            block_hasher=self.hasher, mm_features=mm_features(spec),
            **(compat.structured_output_request_kwargs(params)
               if spec.structured_output is not None else {}))
        if spec.structured_output is not None:
            req.structured_output_request.grammar = self.grammar_future(spec)
        self._admit(spec, arrival_index, req)
        self.sched.add_request(req)

    def lora_request(self, spec: RequestSpec) -> LoRARequest | None:
        return None if spec.lora is None else LoRARequest(
            lora_name=spec.lora, lora_int_id=self.lora_ids[spec.lora],
            lora_path=f"/nonexistent/lora/{spec.lora}")

    def grammar_future(self, spec: RequestSpec) -> Future:
        """The request's grammar as vLLM's compiler hands it over: a Future, completed
        with a :class:`ScriptedGrammar` at the stream's ready_step."""
        compiling: Future = Future()
        self.grammars[spec.id] = (compiling, frozenset(spec.structured_output.rejected_tokens))
        return compiling

    def _admit(self, spec: RequestSpec, arrival_index: int, req: Request) -> None:
        """Keep the request for the trace."""
        self.requests[spec.id] = req
        self.rows[spec.id] = arrival_index
        self.row_ids[arrival_index] = spec.id

    def grammar_ready(self, req_id: str) -> None:
        grammar, rejected = self.grammars[req_id]
        grammar.set_result(ScriptedGrammar(rejected, self.rows[req_id]))

    def num_unfinished(self) -> int:
        return self.sched.get_num_unfinished_requests()

    def refuses(self, stream: Stream) -> str | None:
        return None  # takes every valid stream

    def has_requests(self) -> bool:
        return self.sched.has_requests()

    def schedule(self) -> Scheduled:
        return self.translate(self.observed_schedule(self.sched.schedule))

    def observed_schedule(self, schedule):
        """Run vLLM's ``schedule`` with the hooks watching; its SchedulerOutput."""
        self._before, self._pending = counts_before(self.sched.requests)
        self._observed = Observed()
        self._in_schedule = True
        try:
            with self._set_aside_queue():
                out = schedule()
        finally:
            self._in_schedule = False
        self._in_flight.append(out)
        return out

    def translate(self, out) -> Scheduled:
        """A SchedulerOutput as the worker receives it, in engine-neutral form."""
        before = self._before
        new = out.scheduled_new_reqs
        resumed_new = compat.resumed_among_new(new, self.requests, self.sched)  # resumed there?
        # Plain (req_id, kind, block_ids, num_computed_tokens) tuples: see Handed.
        handed = [(d.req_id, RESUMED if resumed_new[i] else NEW, d.block_ids,
                   d.num_computed_tokens)
                  for i, d in enumerate(new)]
        cached = out.scheduled_cached_reqs
        resumed = compat.resumed_flags(cached)
        handed += [(rid, RESUMED if resumed[i] else RUNNING, cached.new_block_ids[i],
                    cached.num_computed_tokens[i])
                   for i, rid in enumerate(cached.req_ids)]
        reqs = self.requests
        grammar_index, bitmask = compat.grammar_output(self.sched, out)
        scheduled = to_scheduled(
            handed, out.num_scheduled_tokens.items(), out.scheduled_spec_decode_tokens,
            out.finished_req_ids, before, self._observed, self.workers, self.rows,
            lambda rid: (reqs[rid].num_tokens, reqs[rid].num_output_tokens),
            grammar_index, [(row if isinstance(row, str) else self.row_ids[int(row)], int(state))
                            for row, state in bitmask],  # a str: an unconstrained row's owner
            out.scheduled_encoder_inputs, out.free_encoder_mm_hashes, self._pending)
        return scheduled

    def update(self, scheduled: Scheduled, sampled: dict[str, list[int]],
               finished_recving: list[str] = (), finished_sending: list[str] = ()) -> None:
        output = self.runner_output(scheduled, sampled, finished_recving, finished_sending)
        outputs = self.sched.update_from_output(self._in_flight.popleft(), output)
        # (vLLM makes stats only with log_stats, and only then are they asked for.)
        self._stats = scheduler_stats(outputs) if self.config.log_stats else None

    def runner_output(self, scheduled: Scheduled, sampled: dict[str, list[int]],
                      finished_recving: list[str] = (), finished_sending: list[str] = ()
                      ) -> ModelRunnerOutput:
        """The model runner's answer to a step: the scripted model's tokens (or pooled
        outputs) and the worker's KV transfer report."""
        ids = [rid for rid, _ in scheduled.scheduled]
        if self.pooling:  # a pooling runner samples nothing and pools finished prefills
            tokens, pooled = [], [POOLED if rid in sampled else None for rid in ids]
        else:
            tokens = compat.sampled_token_ids([list(sampled.get(rid, [])) for rid in ids])
            pooled = []
        output = ModelRunnerOutput(
            req_ids=ids, **compat.runner_output_kwargs(ids),
            sampled_token_ids=tokens, logprobs=None, prompt_logprobs_dict={},
            pooler_output=pooled)
        if self.script is not None:
            # The worker's connector report.  vLLM's worker hands sets and the scheduler frees
            # the pages of finished sends in the set's iteration order, which follows the
            # string hash of the ids (random per process unless PYTHONHASHSEED is set); the
            # harness hands the ids sorted, in lists, so that runs repeat.
            output.kv_connector_output = KVConnectorOutput(
                finished_sending=sorted(finished_sending) or None,
                finished_recving=sorted(finished_recving) or None)
        return output

    def stats(self) -> dict | None:
        s = self._stats
        if s is None:
            return None
        return stats_record(s.num_running_reqs, s.num_waiting_reqs, s.kv_cache_usage,
                            s.prefix_cache_stats, s.spec_decoding_stats,
                            preempted_apart=hasattr(s.prefix_cache_stats, "preempted_requests"),
                            num_set_aside=getattr(s, "num_skipped_waiting_reqs", None))

    def connector_calls(self) -> list[list]:
        return self.script.take_calls() if self.script else []

    def kv_events(self) -> list[dict]:
        publisher = self.sched.kv_event_publisher
        if not isinstance(publisher, EventRecorder):
            return []
        return kv_event_records(publisher.take(), self.hash_numbers)

    def set_drafts(self, drafts: dict[str, list[int]]) -> None:
        ids = list(drafts)
        self.sched.update_draft_token_ids(
            DraftTokenIds(req_ids=ids, draft_token_ids=[list(drafts[r]) for r in ids]))

    def state(self, req_id: str) -> RequestState:
        r = self.requests[req_id]
        return RequestState(compat.status_name(r.status), r.num_computed_tokens,
                            r.num_output_tokens, r.num_output_placeholders)

    def step_states(self, req_ids: list[str], placeholders: bool) -> StepStates:
        """:meth:`state` of each request as the step record holds it (see
        :func:`harness.formats.steps.step_states`)."""
        reqs, name = self.requests, compat.status_name
        status, computed = {}, {}
        for rid in req_ids:
            r = reqs[rid]
            status[rid] = name(r.status)
            computed[rid] = r.num_computed_tokens
        return StepStates(status, computed, {rid: reqs[rid].num_output_placeholders
                                             for rid in req_ids} if placeholders else None)

    def kv_cache_header(self) -> dict | None:
        if self.config.kv_cache_memory_bytes is None:
            return None
        return pool_header(self.sched.vllm_config, self.sched.kv_cache_config.num_blocks)

    def applies_oldest_now(self, in_flight: int, runs_work: bool, worker_done: bool) -> bool:
        """This engine drives vLLM's scheduler without EngineCore; the step loop imitates
        ``step_with_batch_queue`` with the queue vLLM's executors ask for: two under async
        scheduling, else one per pipeline stage (``vllm-core`` checks the imitation
        against EngineCore itself)."""
        c = self.config
        size = 2 if c.async_scheduling else c.pipeline_parallel_size
        if not compat.applies_batch_the_worker_is_done_with():
            return not (in_flight < size and (runs_work or self.sched.has_requests()))
        return not (runs_work and in_flight < size and not worker_done)

    def end_step(self) -> None:
        """The step loop drives this scheduler itself: nothing is left to do."""

    def shutdown(self) -> None:
        self.sched.shutdown()

    def num_free_blocks(self) -> int:
        return self.sched.kv_cache_manager.block_pool.get_num_free_blocks()
