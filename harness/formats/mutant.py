"""Mutants as data: a named, one-rule deviation and the patch that applies it.

A mutant breaks one rule for the duration of a ``with mutant.patch():`` block
(no source is edited).  This module only defines the record and the patch
helpers; the reference's mutants are in :mod:`harness.checks.mutants`, vLLM's in
:mod:`harness.engines.vllm_mutants`.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Callable
from unittest import mock

Patch = Callable[[], contextlib.AbstractContextManager]

# The vLLM 0.11.0 modules a mutant's rule lives in.
SCHEDULER = "vllm/v1/core/sched/scheduler.py"
ENGINE_CORE = "vllm/v1/engine/core.py"
KV_CACHE_MANAGER = "vllm/v1/core/kv_cache_manager.py"
KV_CACHE_COORDINATOR = "vllm/v1/core/kv_cache_coordinator.py"
BLOCK_POOL = "vllm/v1/core/block_pool.py"
REQUEST_QUEUE = "vllm/v1/core/sched/request_queue.py"
SCHED_UTILS = "vllm/v1/core/sched/utils.py"
SINGLE_TYPE = "vllm/v1/core/single_type_kv_cache_manager.py"
KV_CACHE_UTILS = "vllm/v1/core/kv_cache_utils.py"
REQUEST = "vllm/v1/request.py"
WORKER_BLOCK_TABLE = "vllm/v1/worker/block_table.py"
MODEL_CONFIG = "vllm/config/model.py"
KV_CACHE_INTERFACE = "vllm/v1/kv_cache_interface.py"
HYBRID_MODEL_CONFIG = "vllm/model_executor/models/config.py"
VLLM_CONFIG = "vllm/config/__init__.py"
STRUCTURED_OUTPUT = "vllm/v1/structured_output/__init__.py"


@dataclass(frozen=True)
class Mutant:
    name: str
    rule: str  # the rule it breaks, as the original states it
    mirrors: str  # the vLLM 0.11.0 module the rule lives in
    patch: Patch | None  # None only for an equivalent mutant
    side: str = "reference"  # or "vllm"
    # Why no stream can tell this mutant from the original, when that is so.
    equivalent: str = ""
    # The reference.quirks entry whose behaviour it takes away, when it is one.
    quirk: str = ""
    # What can tell it from the original: "streams" (traces), "kv sizing"
    # (harness.checks.kv_sizing, over the bundled model configs) or "recorded traces" (a
    # later release's rule change judged only by replaying that release's traces).
    checked_by: str = "streams"
    # A stream on which the mutant cannot change the trace (no drafts for a draft
    # rule, no grammar for a grammar rule, ...) makes this False; the rule report
    # (harness.jobs.rule_report) and the mutant hunt then skip the run.  None: it may change any
    # stream.  tests/test_reach.py checks the claim.
    applies: Callable[[Any], bool] | None = None

    @property
    def release(self) -> str | None:
        """The later release whose rule change it takes out (side "release X"), else None."""
        return self.side.split()[1] if self.side.startswith("release ") else None


class Replacement:
    """The patch of a mutant that puts ``new`` in place of ``owner.attr``.

    It names the mutant's *site*: a run that never goes through ``owner.attr`` runs
    the same under the mutant, which the rule report (``harness.checks.rule_watch``) relies on
    to skip it.  ``question``: the site and ``new`` only answer a question from what
    they are given and change nothing, so the two answers can be compared call by
    call on the original run.
    """

    def __init__(self, owner, attr: str, new, question: bool = False) -> None:
        self.owner, self.attr, self.new, self.question = owner, attr, new, question

    def __call__(self) -> contextlib.AbstractContextManager:
        return mock.patch.object(self.owner, self.attr, self.new)


def replace(obj, attr: str, new, question: bool = False) -> Replacement:
    """Patch ``obj.attr`` with ``new`` while the mutant is active."""
    return Replacement(obj, attr, new, question)

