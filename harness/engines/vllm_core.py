"""vLLM's own engine loop: the real ``EngineCore`` over a scripted executor.

The ``vllm`` engine (:mod:`harness.engines.vllm_adapter`) drives vLLM's
``Scheduler`` from the harness's step loop, which imitates
``vllm/v1/engine/core.py``.  This engine, ``vllm-core``, lets vLLM's
``EngineCore`` drive it instead, so that the claim "our loop calls the
scheduler as vLLM's engine does" is checked rather than assumed:

* start-up is ``EngineCore.__init__``: it asks the executor for the KV cache
  specs and the free memory, sizes the pool with vLLM's own
  ``get_kv_cache_configs`` and builds the scheduler, the structured-output
  manager and the block hasher itself;
* requests enter as ``EngineCoreRequest``\\ s through
  ``preprocess_add_request`` and ``add_request``, aborts through
  ``abort_requests``, prefix-cache resets through ``reset_prefix_cache``;
* a step is ``step()`` then ``post_step()``, as ``EngineCoreProc``'s busy loop
  calls them: ``schedule``, the executor's ``execute_model``,
  ``update_from_output``, then the drafts from ``take_draft_token_ids``;
* with ``async_scheduling`` EngineCore runs vLLM's ``AsyncScheduler`` under
  ``step_with_batch_queue`` (the executor reports two concurrent batches, as
  vLLM's own executors do then): ``execute_model`` hands back a Future that is
  done at once only in the stream's ``async_ready_steps``, otherwise when
  EngineCore waits for it, so at most one batch is on the "worker" while the next
  is scheduled.  Which batch EngineCore applies in a step is compared with the
  step loop's own rule (:func:`harness.loop.runner._batch_queue_step`);
* with ``pipeline_parallel_size`` > 1 the executor reports that many concurrent
  batches, and EngineCore runs vLLM's synchronous ``Scheduler`` under the same
  batch queue;
* an idle step (no request in the scheduler, no batch in flight) still calls the
  step function, as vLLM's in-process client does; EngineCore returns at once.

:class:`ScriptedExecutor` is a real subclass of vLLM's ``Executor`` (EngineCore
takes the class as ``executor_class``).  It runs no model: it reports one
attention layer spec per model layer and free memory for exactly the stream's
``num_gpu_blocks`` pages, from which vLLM computes the pool (checked), and
answers ``execute_model`` with the scripted model's tokens
(:mod:`harness.formats.scripted_model`), the same function the step loop calls, so the two
answers are compared every step.

Images: EngineCore builds the scheduler class the config names; for a stream
with images that is vLLM's ``Scheduler`` with the multimodal registry stand-in
of the ``vllm`` engine bound as its ``mm_registry`` argument (the bundled text
models have no encoder of their own).

Hybrid KV cache groups: the executor reports two layers per stream group with
the group's spec, and EngineCore groups the layers itself (vLLM's
``get_kv_cache_groups``), with the hybrid KV cache manager on as on a CUDA GPU.

A KV connector: vLLM's scheduler drives the scripted connector as in the
``vllm`` engine, and the executor reports the transfers done by each step in
its output (``kv_connector_output``), timed as the step loop times them.

Streams this engine takes (:func:`unsupported`): those whose groups vLLM's
start-up makes again from per-layer specs: each kind's groups next to each
other, and some kind only once (the rarest kind's layer count is vLLM's group
size).  A Mamba group's stand-in page is padded to the attention page, as vLLM
pads a hybrid model's.  Nor those whose pool EngineCore's start-up refuses
(:func:`start_up_refusal`, asked of vLLM by starting it): later releases check
the pool against one max_model_len request more strictly than the stream format
does, and 0.34.0 sets the block size to the groups' smallest page (a lone
Mamba group's holds max_model_len tokens).  The others are driven by the
``vllm`` engine only.
"""

from __future__ import annotations

import functools
from collections import Counter
from concurrent.futures import Future
from pathlib import Path

from harness.engines import vllm_env  # noqa: F401  (before vLLM is imported)

from vllm.v1.core.sched.async_scheduler import AsyncScheduler  # noqa: E402
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402
from vllm.v1.engine import EngineCoreRequest  # noqa: E402
from vllm.v1.engine.core import EngineCore  # noqa: E402
from vllm.v1.executor.abstract import Executor  # noqa: E402
from vllm.v1.outputs import DraftTokenIds  # noqa: E402

from harness.formats import scripted_model  # noqa: E402
from harness.engines import vllm_compat as compat  # noqa: E402
from harness.formats.steps import Scheduled, TransferReports, nothing_scheduled  # noqa: E402
from harness.engines.vllm_adapter import (VllmEngine, build_vllm_config,  # noqa: E402
                                          kv_cache_config, layer_specs, mm_features, pooling_params,
                                          sampling_params, scheduler_stats)
from harness.formats.stream import Stream, largest_mm_item  # noqa: E402

#: The V1 scheduler's qualified name; 0.11.0's SchedulerConfig defaults to V0's,
#: which EngineArgs replaces before EngineCore reads it.
V1_SCHEDULER = "vllm.v1.core.sched.scheduler.Scheduler"
ASYNC_SCHEDULER = "vllm.v1.core.sched.async_scheduler.AsyncScheduler"


def unsupported(stream: Stream) -> str | None:
    """Why ``vllm-core`` does not take this stream, or None when it does."""
    c = stream.config
    groups = c.kv_cache_groups or ()
    if list(groups) != _grouped_by_spec(groups):
        return ("KV cache groups of one kind apart from each other (vLLM makes the groups "
                "from the layers' specs, each kind's groups together, in order of first "
                "appearance)")
    if groups and min(Counter(groups).values()) > 1:
        return ("every kind of KV cache group more than once (vLLM's groups have as many "
                "layers as the rarest kind, so it would make fewer, larger groups)")
    return None


def _grouped_by_spec(groups) -> list:
    """The groups in the order vLLM's start-up makes them from per-layer specs: layers of
    one spec are split into that spec's groups together, specs in order of first layer."""
    kinds = list(dict.fromkeys(groups))
    return [g for kind in kinds for g in groups if g == kind]


class ScriptedExecutor(Executor):
    """The worker side of one stream: KV specs and memory at start-up, the scripted
    model's tokens per step, the scripted drafts after it.  EngineCore builds it
    from the config alone; the engine that is starting is handed over in
    :data:`_STARTING`."""

    uses_ray = False
    supports_pp = False

    def _init_executor(self) -> None:
        self.engine: VllmCoreEngine = _STARTING[0]
        self.drafts: DraftTokenIds | None = None
        self.pending: Future | None = None  # the last batch's output

    def collective_rpc(self, method, timeout=None, args=(), kwargs=None, non_block=False):
        return [None]  # initialize_cache and friends: no worker to tell

    def check_health(self) -> None:
        pass

    def compile_or_warm_up_model(self) -> list:
        """No model: nothing compiled, no compilation times (0.34.0's EngineCore reads them
        from each worker's answer; earlier releases ignore the answer)."""
        return []

    def _specs(self) -> dict:
        """One spec per layer: the model's full-attention layers, or for a stream with its
        own KV cache groups two layers per group, in group order (the layers the ``vllm``
        engine names), from which EngineCore makes the groups itself."""
        c = self.engine.config
        if c.kv_cache_groups is None:
            return layer_specs(self.vllm_config)
        return {layer: g.kv_cache_spec for g in kv_cache_config(c, self.vllm_config).kv_cache_groups
                for layer in g.layer_names}

    def get_kv_cache_specs(self):
        return [self._specs()]

    def get_supported_kv_cache_layouts(self):
        """0.29.0: the layouts the worker's flash-attention backend supports, from which
        EngineCore resolves the KV cache layout at start-up."""
        return [compat.supported_kv_cache_layouts()]

    def determine_available_memory(self):
        """The stream's ``kv_cache_memory_bytes``, or exactly its pool: ``num_gpu_blocks``
        pages in every layer of a group (each group's layers share the pages' tensors)."""
        c = self.engine.config
        if c.kv_cache_memory_bytes is not None:
            return [c.kv_cache_memory_bytes]
        specs = self._specs()
        page = next(iter(specs.values())).page_size_bytes
        layers_per_group = len(specs) // len(c.groups)
        return [c.num_gpu_blocks * page * layers_per_group]

    def initialize_from_config(self, kv_cache_configs) -> None:
        self.kv_cache_configs = kv_cache_configs

    @property
    def max_concurrent_batches(self) -> int:
        """Two under async scheduling, else one per pipeline stage, as vLLM's executors
        report (EngineCore steps with its batch queue when it is more than one)."""
        if self.scheduler_config.async_scheduling:
            return 2
        return self.parallel_config.pipeline_parallel_size

    @property
    def supported_tasks(self):
        return ("generate", "embed")

    def execute_model(self, scheduler_output, non_block: bool = False):
        output = self.engine.run_model(scheduler_output)
        self.pending = None
        if not non_block:
            return output
        if not self.engine.batch_queue:
            # 0.34.0's EngineCore.step asks for a Future without a batch queue too: the
            # output is there at once, as the synchronous loop has it.
            done: Future = Future()
            done.set_result(output)
            self.pending = done
            return done
        self.pending = WorkerFuture(self.engine, self.engine._scheduled, self.engine._sampled,
                                    output,
                                    ready=self.engine.step in self.engine.config.async_ready_steps)
        return self.pending

    def sample_tokens(self, grammar_output, non_block: bool = False):
        """The sampled output of the batch ``execute_model`` took last.  EngineCore asks for
        it when ``execute_model`` hands back no output, and (0.34.0, with the batch queue)
        always, keeping this Future as the batch's; here the model's answer was whole
        already, so it is the same Future."""
        pending = self.pending
        if pending is None:
            return None
        return pending if non_block else pending.result()

    def take_draft_token_ids(self) -> DraftTokenIds | None:
        drafts, self.drafts = self.drafts, None
        return drafts

    def execute_dummy_batch(self) -> None:
        pass

    def profile(self, is_start: bool = True) -> None:
        pass

    def shutdown(self) -> None:
        pass


class WorkerFuture(Future):
    """A batch on the scripted worker.  Done at once in an ``async_ready_steps`` step;
    otherwise it completes when EngineCore waits for it (``result``), which tells the
    engine which batch EngineCore applies now."""

    def __init__(self, engine: VllmCoreEngine, scheduled: Scheduled,
                 sampled: dict[str, list[int]], output, ready: bool) -> None:
        super().__init__()
        self.engine, self.output = engine, output
        self.batch = (scheduled, sampled)
        if ready:
            self.set_result(output)

    def result(self, timeout=None):
        if not self.done():
            self.set_result(self.output)
        self.engine.applied.append(self.batch)
        return super().result(timeout)


class GrammarCompiler:
    """Stands in for the structured-output manager's compile thread pool (vLLM builds
    it with the tokenizer, which is not available offline): ``grammar_init`` submits
    a request's grammar and gets the harness's Future, completed at the stream's
    ``ready_step``."""

    def __init__(self, engine: VllmCoreEngine) -> None:
        self.engine = engine

    def submit(self, compile_grammar, request):
        return self.engine.grammar_future(self.engine.by_id[request.request_id])


class StartUpRefusal(ValueError):
    """EngineCore's start-up does not take the stream's pool as the stream states it; a
    server would not start (or would start with another block size)."""


#: vLLM's KV cache sizing at start-up (``kv_cache_planning`` from 0.33.0): a ValueError
#: raised there is its refusal of the pool.
SIZING_MODULES = ("kv_cache_utils.py", "kv_cache_planning.py")


def raised_by_sizing(error: ValueError) -> bool:
    """Whether vLLM's start-up sizing raised the error (its innermost frame)."""
    tb = error.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb is not None and Path(tb.tb_frame.f_code.co_filename).name in SIZING_MODULES


def advice_cut(error: Exception) -> str:
    """vLLM's message on one line, without the advice to the server's operator."""
    text = " ".join(str(error).split())
    return text.split(" Try ", 1)[0]


def start_up_refusal(stream: Stream) -> str | None:
    """Why EngineCore's start-up refuses the stream's pool, or None when it takes it.

    Later releases check the pool more strictly than the stream format does (0.29.0 holds
    the null page back from one max_model_len request, 0.26.0 plans for the batches in
    flight), and 0.34.0 sets the block size to the groups' smallest page; the ``vllm``
    engine builds its Scheduler itself and takes such a stream.  Asked of vLLM itself: a
    throwaway engine starts on the stream (EngineCore's start-up costs about 2 ms).  Any
    other start-up failure is not a refusal: the run meets it again and compares it."""
    probe = VllmCoreEngine()
    try:
        probe.start(stream)
        why = None
    except StartUpRefusal as refusal:
        why = str(refusal)
    except Exception:  # noqa: BLE001  (compared when the stream runs)
        return None
    if getattr(probe, "core", None) is not None:
        probe.shutdown()
    return why


#: The engine whose EngineCore is being built (read by ScriptedExecutor._init_executor).
_STARTING: list = [None]


class VllmCoreEngine(VllmEngine):
    """vLLM 0.11.0's EngineCore, stepped as EngineCoreProc steps it."""

    name = "vllm-core"

    def refuses(self, stream: Stream) -> str | None:
        return unsupported(stream) or start_up_refusal(stream)

    def start(self, stream: Stream) -> None:
        why = unsupported(stream)
        if why is not None:
            raise ValueError(f"the vllm-core engine does not take this stream: {why}")
        self.by_id = {r.id: r for r in stream.requests}
        super().start(stream)

    def _build(self, stream: Stream):
        c = stream.config
        vc, encoder = build_vllm_config(c, largest_mm_item(stream), self.script)
        if c.kv_cache_groups is not None and c.kv_role is None:
            # The hybrid KV cache manager, as on a CUDA GPU (vLLM turns it off on the CPU).
            # Not with a KV connector: start-up turns it off for one on any device (a
            # stream's connector has a single group, which needs no hybrid manager), and
            # later releases (0.14.0 does) refuse a connector without hybrid support then.
            vc.scheduler_config.disable_hybrid_kv_cache_manager = False
        # vLLM's own Scheduler class; with images, with the multimodal registry stand-in
        # bound as its mm_registry argument, as the vllm engine passes it.
        scheduler, name = ((AsyncScheduler, ASYNC_SCHEDULER) if c.async_scheduling
                           else (Scheduler, V1_SCHEDULER))
        vc.scheduler_config.scheduler_cls = (functools.partial(scheduler, **encoder)
                                             if encoder else name)
        # EngineCore checks the pool against the model config's max_model_len, which a
        # server sets from --max-model-len; the model config is shared by the streams.
        mc = vc.model_config
        model_max, mc.max_model_len = mc.max_model_len, c.max_model_len
        _STARTING[0] = self
        try:
            with compat.multimodal_while_sizing(mc, bool(encoder)):
                self.core = EngineCore(vllm_config=vc, executor_class=ScriptedExecutor,
                                       log_stats=c.log_stats)
        except ValueError as e:
            if raised_by_sizing(e):
                raise StartUpRefusal(f"vLLM's start-up refuses this pool: {advice_cut(e)}") from e
            raise
        finally:
            _STARTING[0] = None
            mc.max_model_len = model_max
        # (The scheduler's own block size is the groups' common multiple with several
        # groups, in the vllm engine too; the cache config's is the stream's.)
        block_size = self.core.vllm_config.cache_config.block_size
        if block_size != c.block_size:
            raise StartUpRefusal(
                f"EngineCore's start-up sets the block size to {block_size} tokens (its "
                f"smallest KV cache group page), not the stream's block_size {c.block_size}")
        self.core.structured_output_manager.executor = GrammarCompiler(self)
        pool = self.core.scheduler.kv_cache_manager.block_pool
        if pool.num_gpu_blocks != c.num_gpu_blocks:
            raise RuntimeError(f"EngineCore sized the pool at {pool.num_gpu_blocks} pages, "
                               f"vLLM's sizing function at {c.num_gpu_blocks}")
        sched = self.core.scheduler
        real_schedule, real_reset = sched.schedule, sched.reset_prefix_cache
        # (0.34.0's EngineCore passes schedule() arguments, e.g. throttle_prefills)
        sched.schedule = lambda *args, **kwargs: self.observed_schedule(
            lambda: real_schedule(*args, **kwargs))
        sched.reset_prefix_cache = lambda *args, **kwargs: self._keep_reset_answer(
            real_reset(*args, **kwargs))  # 0.34.0's EngineCore passes two flags
        self.batch_queue = c.batch_queue
        if (self.core.batch_queue is not None) != self.batch_queue:
            raise RuntimeError("EngineCore's batch queue does not follow the stream "
                               "(async_scheduling, pipeline_parallel_size)")
        self.step = 0  # the step loop's step, idle steps included
        # A KV connector: the worker's side, reporting transfers in the executor's output
        # (the step loop keeps its own, and update() compares the two), and the connector
        # calls of each phase of the step (before the model ran, during the update).
        self.transfers = TransferReports(stream) if c.kv_role is not None else None
        self._calls: list[list] = []
        self._reported: tuple[list[str], list[str]] = ([], [])
        self._stepped = False  # whether EngineCore stepped in this step
        self._executed = False
        # The batches (and the executor's tokens) whose output EngineCore took this step.
        self.applied: list[tuple[Scheduled, dict]] = []
        self._scheduled: Scheduled | None = None
        self._sampled: dict[str, list[int]] | None = None
        return sched

    # -- the executor's side -----------------------------------------------------------

    def run_model(self, scheduler_output):
        """``execute_model``: the scripted model's answer to what was scheduled, with the
        worker's report of the KV transfers done by this step."""
        self._scheduled = self.translate(scheduler_output)
        self._sampled = scripted_model.sample(self._scheduled, self.by_id)
        recving, sending = [], []
        if self.transfers is not None:
            calls = self.script.take_calls()  # aborts and schedule() so far
            self._calls.append(calls)
            self.transfers.note(self.step, calls)
            recving, sending = self.transfers.due(self.step)
        self._reported = (recving, sending)
        return self.runner_output(self._scheduled, self._sampled, recving, sending)

    # -- the engine interface ------------------------------------------------------------

    def add(self, spec, arrival_index: int) -> None:
        params = sampling_params(spec)
        if spec.structured_output is not None:
            compat.set_structured_output_backend(params)
        request = EngineCoreRequest(
            request_id=spec.id, prompt_token_ids=list(spec.prompt),
            mm_features=mm_features(spec), sampling_params=params,
            pooling_params=pooling_params(spec), arrival_time=float(arrival_index),
            lora_request=self.lora_request(spec), cache_salt=spec.cache_salt,
            data_parallel_rank=None, priority=spec.priority,
            **compat.request_eos_kwargs(params, spec.eos_token_id))
        req, wave = self.core.preprocess_add_request(request)
        self._admit(spec, arrival_index, req)
        self.core.add_request(req, wave)

    def abort(self, req_id: str) -> None:
        self.core.abort_requests([req_id])

    def reset_prefix_cache(self) -> bool:
        self.core.reset_prefix_cache()
        return self._reset_answer

    def _keep_reset_answer(self, done: bool) -> bool:
        """EngineCore.reset_prefix_cache drops the scheduler's answer; the trace keeps it."""
        self._reset_answer = bool(done)
        return done

    def schedule(self) -> Scheduled:
        """One call of EngineCore's step function: it schedules, and (without async
        scheduling, or when the batch queue says so) applies a batch's output."""
        self._scheduled, self._sampled = None, None
        self._core_step()
        return self._scheduled or nothing_scheduled()

    def _core_step(self) -> None:
        self._calls, self._reported = [], ([], [])
        outputs, self._executed = self.core.step_fn()
        self._stepped = True
        self._stats = scheduler_stats(outputs) if outputs else None
        if self.transfers is not None:
            if not self._calls:  # the model did not run: nothing was taken yet
                self._calls.append(self.script.take_calls())
            finished = self.script.take_calls()  # during the update
            self._calls.append(finished)
            self.transfers.note(self.step, finished)

    def connector_calls(self) -> list[list]:
        """The calls made before the model ran, then (asked again) those of the update."""
        return self._calls.pop(0) if self._calls else []

    def update(self, scheduled: Scheduled, sampled: dict[str, list[int]],
               finished_recving=(), finished_sending=()) -> None:
        """EngineCore applied this batch's output already (or does now, in a step that
        schedules nothing); the step loop's model must have said what the executor said."""
        if self.batch_queue:
            if not self._stepped:
                self._core_step()
            if not self.applied or self.applied[0][0] is not scheduled:
                raise RuntimeError("the step loop applies a batch EngineCore does not apply "
                                   "in this step")
            expected = self.applied.pop(0)[1]
        else:
            expected = self._sampled or {}
        if sampled != expected:
            raise RuntimeError(f"the step loop's model sampled {sampled}, "
                               f"the executor {expected}")
        if (list(finished_recving), list(finished_sending)) != self._reported:
            raise RuntimeError(f"the step loop's worker reports transfers "
                               f"{finished_recving, finished_sending}, the executor "
                               f"{self._reported}")

    def set_drafts(self, drafts: dict[str, list[int]]) -> None:
        ids = list(drafts)
        self.core.model_executor.drafts = DraftTokenIds(
            req_ids=ids, draft_token_ids=[list(drafts[r]) for r in ids])

    def end_step(self) -> None:
        """``post_step`` after a step that ran (the drafts are known by then); an idle
        step calls the step function as vLLM's in-process client does, and EngineCore
        must do nothing."""
        if not self._stepped:
            outputs, executed = self.core.step_fn()
            if outputs or executed:
                raise RuntimeError("EngineCore stepped in a step the step loop found idle")
        else:
            self.core.post_step(self._executed)
        if self.applied:
            raise RuntimeError("EngineCore applied a batch's output the step loop did not")
        self._stepped = False
        self.step += 1

    def shutdown(self) -> None:
        """EngineCore's own shutdown, less the process-wide clean-up that 0.34.0 adds to it
        (``cleanup_dist_env_and_memory``: process groups, which the harness never makes,
        and the device's memory cache, through a torch call the base torch lacks)."""
        from vllm.v1.engine import core as core_module
        cleanup = getattr(core_module, "cleanup_dist_env_and_memory", None)
        if cleanup is None:
            self.core.shutdown()
            return
        core_module.cleanup_dist_env_and_memory = lambda *args, **kwargs: None
        try:
            self.core.shutdown()
        finally:
            core_module.cleanup_dist_env_and_memory = cleanup
