"""nano-vllm (PyPI ``nano-vllm-fork==20260210``) plugged in through the adapter kit.

    python3.11 -m venv .venvs/sim-nano-vllm
    .venvs/sim-nano-vllm/bin/pip install -c constraints.txt -e .
    .venvs/sim-nano-vllm/bin/pip install --no-deps -r examples/simulators/nano_vllm_requirements.txt
    .venvs/sim-nano-vllm/bin/python -m harness replay --engine examples.simulators.nano_vllm:NanoVllm

(the requirements file is ``nano-vllm-fork==20260210``, ``xxhash``, ``numpy``: no torch,
triton nor transformers).  The package's ``__init__`` imports the GPU model runner, so
:func:`load` registers bare ``nanovllm`` and ``nanovllm.engine`` packages and a
``nanovllm.config`` without transformers, then imports only ``sequence``,
``block_manager`` and ``scheduler``; the scheduler is built from a plain object with
the five attributes it reads.  ``Sequence.block_size`` is a class attribute (256, the
flash-attention page): it is set to the stream's block size for each stream.

``release = "0.11.0"``: nano-vllm names no vLLM release; it is a from-scratch re-creation
of vLLM's v1 scheduler and paged prefix cache of 2025 (0.8-0.11 era), and 0.11.0 is the
oldest release this harness holds, so its rules are the nearest to compare with.

Features: ``prefix_caching`` (always on in nano-vllm: streams drawn for it have it on; a
stream with it off is refused when two requests could share a full page) and ``eos`` (one
EOS per engine, ``Config.eos``, so not ``eos_per_request``; ``ignore_eos`` per request).  No chunked prefill (a prompt is prefilled whole), no stop
tokens, no abort.  See examples/simulators/nano_vllm_NOTES.md for what differs from vLLM.
The adapter translates; :class:`NanoVllmPatched` is the one that changes nano-vllm.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import types

from harness.engines.kit import Adapter, Decision, Request, SimConfig, record_calls


def load():
    """nano-vllm's ``(Sequence, SamplingParams, Scheduler)`` without its package ``__init__``."""
    if "nanovllm.engine.scheduler" not in sys.modules:
        root = importlib.util.find_spec("nanovllm").submodule_search_locations[0]
        for name, path in (("nanovllm", root), ("nanovllm.engine", os.path.join(root, "engine"))):
            if name not in sys.modules:
                sys.modules[name] = types.ModuleType(name)
                sys.modules[name].__path__ = [path]
        if "nanovllm.config" not in sys.modules:  # the real one imports transformers
            sys.modules["nanovllm.config"] = types.ModuleType("nanovllm.config")
            sys.modules["nanovllm.config"].Config = types.SimpleNamespace
    seq = importlib.import_module("nanovllm.engine.sequence")
    params = importlib.import_module("nanovllm.sampling_params")
    return seq.Sequence, params.SamplingParams, importlib.import_module(
        "nanovllm.engine.scheduler").Scheduler


class NanoVllm(Adapter):
    name = "nano-vllm"
    release = "0.11.0"
    features = frozenset({"prefix_caching", "eos"})  # one EOS per engine: no eos_per_request
    always_on = frozenset({"prefix_caching"})

    def refuses(self, stream) -> str | None:
        reqs, bs = stream.requests, stream.config.block_size
        firsts = [tuple([*r.prompt, *r.output][:bs]) for r in reqs
                  if len(r.prompt) + len(r.output) >= bs]
        if not stream.config.enable_prefix_caching and len(set(firsts)) < len(firsts):
            return f"{self.name} always caches prefixes; requests here share a full page"
        return None

    def build(self, config: SimConfig) -> None:
        self.Sequence, self.SamplingParams, Scheduler = load()
        self.Sequence.block_size = config.block_size
        eos = {r.get("eos_token_id") for r in config.stream["requests"]
               if not r.get("ignore_eos")} - {None}
        self.sched = Scheduler(types.SimpleNamespace(
            max_num_seqs=config.max_num_seqs, max_num_batched_tokens=config.max_num_batched_tokens,
            max_model_len=config.max_model_len, eos=eos.pop() if eos else -1,
            num_kvcache_blocks=config.num_pages, kvcache_block_size=config.block_size))
        self.seqs, self.ids, self.victims, self.last = {}, {}, [], []
        record_calls(self.sched, "preempt", self.victims)  # observes; changes nothing

    def admit(self, request: Request) -> None:
        seq = self.Sequence(list(request.prompt), self.SamplingParams(
            max_tokens=request.max_tokens, ignore_eos=request.ignore_eos))
        self.seqs[request.id], self.ids[seq.seq_id] = seq, request.id
        self.sched.add(seq)

    def decide(self) -> Decision:
        self.victims.clear()
        if self.sched.is_finished():
            return Decision()
        seqs, prefill = self.sched.schedule()
        self.last = seqs
        d = Decision(preempted=[self.ids[s.seq_id] for s in self.victims])
        for s in seqs:
            rid = self.ids[s.seq_id]
            if prefill:
                d.hits[rid] = s.num_cached_tokens
            d.scheduled.append((rid, len(s) - s.num_cached_tokens if prefill else 1))
        return d

    def advance(self, decision: Decision, sampled: dict[str, list[int]],
                stopping: set[str]) -> set[str]:
        seqs = [s for s in self.last if sampled.get(self.ids[s.seq_id])]
        self.sched.postprocess(seqs, [sampled[self.ids[s.seq_id]][0] for s in seqs])
        return {self.ids[s.seq_id] for s in seqs if s.is_finished}

    def free_pages(self) -> int:
        return len(self.sched.block_manager.free_block_ids)

    def pages(self, req_id: str) -> list[int] | None:
        return list(self.seqs[req_id].block_table)


class NanoVllmPatched(NanoVllm):
    """nano-vllm with one patch: ``Scheduler.preempt`` also removes the victim from
    ``Scheduler.running``.  The fork's decode loop (scheduler.py:150-157) preempts
    ``temp_running.pop(0)``, a copy's entry, and leaves the victim in ``running`` with an
    empty block table; the next decode of it raises IndexError in
    ``BlockManager.may_append`` (``block_table[-1]``).  Upstream nano-vllm preempted
    ``self.running.pop()``, which removed it.  The choice of victim is not changed."""

    name = "nano-vllm-patched"

    def build(self, config: SimConfig) -> None:
        super().build(config)
        recording, running = self.sched.preempt, self.sched.running

        def preempt(seq):
            recording(seq)
            if seq in running:
                running.remove(seq)  # the patch
        self.sched.preempt = preempt
