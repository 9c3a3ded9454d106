"""Vidur 0.0.26's replica schedulers (vLLM and Sarathi) plugged in through the adapter kit.

    .venvs/sim-vidur/bin/python -m harness profile --engine examples.simulators.vidur:VidurVllm \\
        --fields scheduled,computed_before,num_computed_tokens,status,preempted,finished

Install (a side environment without vLLM; Vidur's scheduler path imports no third-party
package, so none of its 16 declared dependencies is installed)::

    python3.11 -m venv .venvs/sim-vidur
    .venvs/sim-vidur/bin/pip install -c constraints.txt -e .
    .venvs/sim-vidur/bin/pip install --no-deps -r examples/simulators/vidur_requirements.txt

``vidur.scheduler``'s ``__init__`` imports the global schedulers and, through them, the
execution-time predictors (scikit-learn, pandas); the replica schedulers need neither, so
when that import fails :func:`_vidur` registers bare package modules for
``vidur.scheduler`` and ``vidur.execution_time_predictor`` and loads only the replica
scheduler modules.

The map (one Vidur batch per harness step, no execution-time model):

* build: ``CacheConfig(block_size, num_blocks=num_pages)`` with Vidur's default
  ``watermark_blocks_fraction`` 0.01 (the stream has no watermark to translate -- vLLM
  0.11.0 has none -- so Vidur keeps its own: 0 pages below 100), the replica scheduler
  with ``batch_size_cap = max_num_seqs``, one stage, and ``max_tokens_in_batch`` (vLLM)
  or ``chunk_size`` (Sarathi: its per-iteration token budget) = ``max_num_batched_tokens``;
  a ``ReplicaConfig`` (Vidur's default model, TP 1, one stage) and a request generator
  config (``max_tokens = max_model_len``) that only its unused memory planner reads;
* admit: ``Request(arrived_at=arrival index, num_prefill_tokens=len(prompt),
  num_decode_tokens=num_outputs_to_stop)``;
* decide: ``on_schedule(time)``, ``Batch.on_schedule``; the batch's requests and
  ``num_q_tokens`` in its order; preempted: the requests ``restart()``-ed, in order;
* advance: what Vidur's events do when a batch ends (zero execution time):
  ``BatchStage.on_schedule/on_stage_end``, ``on_stage_end(0, ...)``,
  ``Batch.on_batch_end``, ``on_batch_end``; finished: the batch's completed requests.

Vidur keeps block counts, not ids: no :meth:`pages`; :meth:`free_pages` is
``num_blocks - num_allocated_blocks``.  Vidur names no vLLM release; it is held to
0.11.0, the harness's base.  ``features``: none for VidurVllm (no EOS or stop tokens --
a request decodes a known number of tokens --, no prefix cache, no abort, no chunked
prefill), ``chunked_prefill`` for VidurSarathi.  Findings: vidur_NOTES.md.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import types

from harness.engines.kit import Adapter, Decision, Request, SimConfig


def _vidur() -> types.SimpleNamespace:
    """Vidur's config, entity and replica scheduler classes, loaded without its heavy
    package ``__init__``s where they fail to import."""
    try:
        import vidur.scheduler  # noqa: F401  (full dependencies installed)
    except ImportError:
        root = os.path.dirname(importlib.util.find_spec("vidur").origin)
        for name in ("vidur.scheduler", "vidur.execution_time_predictor"):
            module = types.ModuleType(name)
            module.__path__ = [os.path.join(root, name.split(".")[1])]
            sys.modules[name] = module
        from vidur.execution_time_predictor.base_execution_time_predictor import \
            BaseExecutionTimePredictor
        sys.modules["vidur.execution_time_predictor"].BaseExecutionTimePredictor = \
            BaseExecutionTimePredictor
    from vidur import config
    from vidur.entities import ExecutionTime, Replica, Request as VRequest
    from vidur.scheduler.replica_scheduler.sarathi_replica_scheduler import \
        SarathiReplicaScheduler
    from vidur.scheduler.replica_scheduler.vllm_replica_scheduler import VLLMReplicaScheduler
    return types.SimpleNamespace(config=config, ExecutionTime=ExecutionTime, Replica=Replica,
                                 Request=VRequest, Vllm=VLLMReplicaScheduler,
                                 Sarathi=SarathiReplicaScheduler)


class _Vidur(Adapter):
    release = "0.11.0"

    def scheduler(self, v, config: SimConfig):
        """The replica scheduler class and its config."""
        raise NotImplementedError

    def request_class(self, v):
        """Vidur's Request, with ``restart`` observed (the order of preemptions)."""
        log = self._restarted

        class Observed(v.Request):
            def restart(self):
                log.append(self)
                super().restart()
        return Observed

    def build(self, config: SimConfig) -> None:
        v = self._v = _vidur()
        replica = v.config.ReplicaConfig(num_pipeline_stages=1, tensor_parallel_size=1)
        cache = v.config.CacheConfig(block_size=config.block_size, num_blocks=config.num_pages)
        generator = v.config.TraceRequestGeneratorConfig(max_tokens=config.max_model_len)
        cls, sched_config = self.scheduler(v, config)
        self.sched = cls(replica, sched_config, cache, generator, v.Replica(replica), 1, None)
        self._restarted: list = []
        self._Request = self.request_class(v)
        self.ids: dict[int, str] = {}
        self.batch = None
        self.time = 0.0

    def admit(self, request: Request) -> None:
        r = self._Request(float(request.arrival_index), len(request.prompt),
                          request.num_outputs_to_stop)
        self.ids[r.id] = request.id
        self.sched.add_request(r)

    def decide(self) -> Decision:
        self._restarted.clear()
        self.batch = self.sched.on_schedule(self.time)
        d = Decision(preempted=[self.ids[r.id] for r in self._restarted])
        if self.batch:
            self.batch.on_schedule(self.time)
            d.scheduled = [(self.ids[r.id], n)
                           for r, n in zip(self.batch.requests, self.batch.num_q_tokens)]
        return d

    def advance(self, decision: Decision, sampled: dict[str, list[int]],
                stopping: set[str]) -> set[str]:
        batch, t = self.batch, self.time
        self.time += 1.0
        if not batch:
            return set()
        zero = self._v.ExecutionTime(1, *[0.0] * 14)
        stage = batch.to_batch_stage(0, zero)
        stage.on_schedule(t)
        stage.on_stage_end(t)
        self.sched.on_stage_end(0, stage)
        batch.on_batch_end(t)
        self.sched.on_batch_end(batch)
        return {self.ids[r.id] for r in batch.requests if r.completed}

    def free_pages(self) -> int:
        return self.sched._cache_config.num_blocks - self.sched.num_allocated_blocks


class VidurVllm(_Vidur):
    """Vidur's ``VLLMReplicaScheduler``: whole prompts, prefill-only or decode-only steps."""

    name = "vidur-vllm"
    features = frozenset()

    def scheduler(self, v, config: SimConfig):
        return v.Vllm, v.config.VllmSchedulerConfig(
            batch_size_cap=config.max_num_seqs,
            max_tokens_in_batch=config.max_num_batched_tokens)


class VidurSarathi(_Vidur):
    """Vidur's ``SarathiReplicaScheduler``: chunked prefill, chunk size = the step's
    token budget (``max_num_batched_tokens``)."""

    name = "vidur-sarathi"
    features = frozenset({"chunked_prefill"})
    always_on = frozenset({"chunked_prefill"})  # it chunks every prompt the budget cuts

    def scheduler(self, v, config: SimConfig):
        return v.Sarathi, v.config.SarathiSchedulerConfig(
            batch_size_cap=config.max_num_seqs, chunk_size=config.max_num_batched_tokens)


class _RestartPatched:
    """Patch: ``Request.restart()`` also resets the stage counters it leaves set
    (``_num_stage_processed_tokens = 0``, ``_is_prefill_stage_complete = False``), as it
    resets ``_num_processed_tokens`` and ``_is_prefill_complete``.  Nothing else changes."""

    def request_class(self, v):
        base = super().request_class(v)

        class Patched(base):
            def restart(self):
                super().restart()
                self._num_stage_processed_tokens = 0
                self._is_prefill_stage_complete = False
        return Patched


class VidurVllmPatched(_RestartPatched, VidurVllm):
    """VidurVllm with ``Request.restart()`` patched (_RestartPatched): unpatched, a preempted
    request fails an assertion (vidur/entities/request.py:300) once prefilled again."""

    name = "vidur-vllm-patched"


class VidurSarathiPatched(_RestartPatched, VidurSarathi):
    """VidurSarathi with ``Request.restart()`` patched (see _RestartPatched)."""

    name = "vidur-sarathi-patched"
