"""Traces: what an engine decided at every step, as canonical JSON.

The format is documented in ``docs/trace-format.md``.  A trace is
deterministic: the same stream gives the same bytes in every run and process
(keys sorted, no timestamps, no hash values).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

from harness.formats.steps import Scheduled, StepStates, translated
from harness.formats.stream import Stream, canonical_json

COMPLETED = "completed"
MAX_STEPS = "max_steps"
ENGINE_FAILURE = "engine_failure"

# Fields of a step record that are compared between engines, in report order.
STEP_FIELDS = (
    "scheduled", "computed_before", "new_block_ids", "preempted", "finished", "prefix_hit_tokens",
    "spec_tokens", "emitted", "num_computed_tokens", "status", "free_blocks",
    "evicted", "slots", "prefix_cache_reset", "set_aside", "grammar_index", "bitmask_rows",
    "encoder_inputs", "encoder_frees", "stats", "kv_events", "kv_connector",
    "updated", "output_placeholders",
)


#: Step fields that only streams using a feature carry (see optional_fields).
OPTIONAL_STEP_FIELDS = frozenset({"set_aside", "grammar_index", "bitmask_rows",
                                  "encoder_inputs", "encoder_frees", "stats", "kv_events",
                                  "kv_connector", "updated", "output_placeholders"})


def optional_fields(stream: Stream) -> frozenset[str]:
    """The step fields only streams using a feature carry (so that the traces of streams
    written before the feature keep their bytes): ``set_aside`` with LoRA adapters,
    structured output or a KV connector, ``grammar_index`` and ``bitmask_rows`` with structured output,
    ``encoder_inputs`` and ``encoder_frees`` with multimodal inputs, ``stats`` with
    ``log_stats``, ``kv_events`` with ``kv_cache_events``, ``kv_connector`` with
    ``kv_role``, ``updated`` and ``output_placeholders`` with ``async_scheduling``,
    ``updated`` with ``pipeline_parallel_size`` > 1."""
    fields = set()
    if stream.config.kv_role is not None or any(
            r.lora is not None or r.structured_output is not None for r in stream.requests):
        fields.add("set_aside")
    if any(r.structured_output is not None for r in stream.requests):
        fields |= {"grammar_index", "bitmask_rows"}
    if any(r.mm_inputs for r in stream.requests):
        fields |= {"encoder_inputs", "encoder_frees"}
    if stream.config.log_stats:
        fields.add("stats")
    if stream.config.kv_cache_events:
        fields.add("kv_events")
    if stream.config.kv_role is not None:
        fields.add("kv_connector")
    if stream.config.async_scheduling:
        fields |= {"updated", "output_placeholders"}
    if stream.config.pipeline_parallel_size > 1:
        fields.add("updated")
    return frozenset(fields)


@dataclass
class Trace:
    engine: str
    vllm_version: str
    stream: Stream
    steps: list[dict[str, Any]] = field(default_factory=list)
    verdict: str = ""
    failure: dict[str, Any] | None = None
    # The pool start-up made of kv_cache_memory_bytes (Engine.kv_cache_header); None
    # for a stream that gives num_gpu_blocks (its traces keep their bytes).
    kv_cache: dict[str, Any] | None = None

    def complete(self) -> None:
        self.verdict = COMPLETED

    def fail(self, step: int, message: str, verdict: str = ENGINE_FAILURE) -> None:
        self.verdict = verdict
        self.failure = {"step": step, "message": message}

    def to_json(self, stream_json: dict[str, Any] | None = None) -> dict[str, Any]:
        """The trace as JSON data; ``stream_json``: the stream's own, where the caller
        has it already (the traces of one stream may share it)."""
        out = {
            "engine": self.engine,
            "vllm_version": self.vllm_version,
            "stream": self.stream.to_json() if stream_json is None else stream_json,
            "stream_sha256": self.stream.sha256(),
            "verdict": self.verdict,
            "failure": self.failure,
            "steps": self.steps,
        }
        if self.kv_cache is not None:
            out["kv_cache"] = self.kv_cache
        return out

    def dumps(self) -> str:
        return canonical_json(self.to_json())


def step_record(step: int, s: Scheduled, emitted: dict[str, list[int]],
                states: StepStates, free_blocks: int,
                prefix_cache_reset: bool | None,
                optional: frozenset[str] = frozenset(),
                stats: dict[str, Any] | None = None,
                kv_events: list[dict] | None = None,
                kv_connector: dict[str, Any] | None = None,
                updated: int | None = None) -> dict[str, Any]:
    """One step of a trace, as plain JSON-able data (``optional``: see optional_fields;
    ``stats`` and ``kv_events``: see harness.formats.steps.Engine.stats and .kv_events;
    ``kv_connector``: the connector's calls and the worker's transfer report;
    ``updated``: async scheduling, the step whose batch's output this step applied).

    The record holds the step's :class:`~harness.formats.steps.Translated` values
    themselves (a Scheduled made by hand is copied first), the dicts of ``states``, and
    ``stats``, ``kv_events`` and ``kv_connector`` as given: each is made for this step
    alone."""
    s = translated(s)
    record = {
        "step": step,
        "scheduled": s.scheduled,
        "computed_before": s.computed_before,
        "new_block_ids": s.new_block_ids,
        "preempted": s.preempted,
        "finished": s.finished,
        "prefix_hit_tokens": s.prefix_hit_tokens,
        "spec_tokens": s.spec_tokens,
        "emitted": {rid: list(t) for rid, t in emitted.items()} if emitted else {},
        "num_computed_tokens": states.num_computed_tokens,
        "status": states.status,
        "free_blocks": free_blocks,
        "evicted": s.evicted,
        "slots": s.slots,
        "prefix_cache_reset": prefix_cache_reset,
    }
    if optional:
        given = {"stats": stats, "kv_events": kv_events, "kv_connector": kv_connector,
                 "updated": updated}
        for k in _in_order(optional):
            record[k] = given[k] if k in given else _FROM_STEP[k](s, states)
    return record


@functools.lru_cache(maxsize=None)
def _in_order(optional: frozenset[str]) -> tuple[str, ...]:
    """The optional fields a step record holds, in their order."""
    return tuple(k for k in _OPTIONAL_ORDER if k in optional)


#: The optional fields made from the step's Scheduled record and the requests' states.
_FROM_STEP = {
    "set_aside": lambda s, states: s.set_aside,
    "grammar_index": lambda s, states: s.grammar_index,
    "bitmask_rows": lambda s, states: s.bitmask_rows,
    "encoder_inputs": lambda s, states: s.encoder_inputs,
    "encoder_frees": lambda s, states: s.encoder_frees,
    "output_placeholders": lambda s, states: states.num_output_placeholders,
}
#: The optional fields in the order a step record holds them.
_OPTIONAL_ORDER = tuple(f for f in STEP_FIELDS if f in OPTIONAL_STEP_FIELDS)

