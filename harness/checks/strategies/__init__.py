"""Hypothesis strategies for request streams.

Every strategy here generates plain JSON-able stream dicts, the format that
:func:`harness.formats.stream.parse_stream` accepts, and every value it generates is a
*valid* stream: the rules of ``harness.formats.stream`` (``_check_config`` and
``_check_stream``) are built into the draws, nothing is filtered away.  A
generated stream can therefore be written out as a fixture, pinned with
``@example`` and replayed offline as it is.

Streams are small on purpose (a few requests, models of at most a few dozen
tokens, token ids from a small alphabet) so that one run takes milliseconds
in the reference and shared prefixes, stop tokens and draft matches happen by
themselves.

Public strategies:

* :func:`configs` -- engine configs; any field can be fixed or drawn from a
  strategy of your own.
* :func:`streams` -- streams for a config, with knobs that switch features
  (shared prefixes, stop rules, aborts, salts, drafts, ...) on or off.
* Area-focused variants: :func:`preemption_streams`,
  :func:`prefix_cache_streams`, :func:`chunked_prefill_streams`,
  :func:`spec_decode_streams`, :func:`stop_and_abort_streams`;
* targeted variants for rules that need a rare combination (the rule report,
  ``harness.jobs.rule_report``, shows they are needed): :func:`crowd_streams` (up to 72
  requests, ties), :func:`set_aside_streams`, :func:`priority_victim_streams`;
* :func:`hybrid_streams`, for models with several KV cache groups
  (:func:`kv_cache_groups` draws them); :func:`window_hit_streams`, their
  prefix hits after windows have slid; :func:`draft_window_streams`, drafts
  that decide their pages;
* :func:`lora_streams` (LoRA adapters), :func:`grammar_streams`
  (structured output) and :func:`mm_streams` (images), as servers send them;
  :func:`encoder_pressure_streams`, :func:`encoder_preemption_streams` and
  :func:`mm_hash_streams` for the encoder cache's and the image hashes' rarer rules;
* :func:`repeated_image_streams`, :func:`encoder_handoff_streams`,
  :func:`connector_idle_streams` and :func:`passed_over_victim_streams` for rules of
  later releases that the others never decide;
* :func:`any_stream`, which mixes all of them.

Shrinking, in general: fewer requests, shorter prompts and outputs, earlier
arrivals, features switched off (no drafts, no aborts, no salt, no prompt
logprobs, no resets), the first entry of every choice list and the lower
bound of every integer range.  Each strategy's docstring says where its own
values shrink to.

The strategies live in modules by family (:mod:`.draws`, :mod:`.configs`, :mod:`.streams`,
:mod:`.scheduling`, :mod:`.kv_groups`, :mod:`.inputs`, :mod:`.engine_loop`,
:mod:`.whole_space`; the real-traffic property's in :mod:`.real_workloads`); this package
gives them under one name.
"""

from __future__ import annotations

from harness.checks.strategies.configs import configs, kv_cache_groups
from harness.checks.strategies.draws import DEFAULT_MAX_STEPS, DEFAULT_VOCAB_SIZE, STOP_MODES, st
from harness.checks.strategies.engine_loop import (async_streams, connector_idle_streams,
                                                   connector_send_streams, pipeline_streams)
from harness.checks.strategies.inputs import (encoder_handoff_streams, encoder_preemption_streams,
                                              encoder_pressure_streams, grammar_streams,
                                              lora_encoder_skip_streams, lora_streams,
                                              mm_hash_streams, mm_streams, pooling_streams,
                                              repeated_image_streams)
from harness.checks.strategies.kv_groups import (draft_window_streams, hybrid_streams,
                                                 window_hit_streams)
from harness.checks.strategies.scheduling import (chunked_prefill_streams, crowd_streams,
                                                  passed_over_victim_streams, preemption_streams,
                                                  prefix_cache_streams,
                                                  priority_victim_draft_streams,
                                                  priority_victim_streams,
                                                  priority_victim_window_streams,
                                                  set_aside_streams, set_aside_threshold_streams,
                                                  spec_decode_streams, stop_and_abort_streams)
from harness.checks.strategies.streams import request_ids, streams
from harness.checks.strategies.whole_space import any_stream

# Helpers that the real-traffic strategy and the tests draw with too.
from harness.checks.strategies.draws import (_draw_ready_steps, _likely_steps,  # noqa: I001
                                             _memo_key, _memoized, _one_in, _rarely)

__all__ = [
    "STOP_MODES", "configs", "streams", "preemption_streams", "prefix_cache_streams",
    "chunked_prefill_streams", "spec_decode_streams", "stop_and_abort_streams",
    "crowd_streams", "set_aside_streams", "set_aside_threshold_streams",
    "priority_victim_streams", "priority_victim_draft_streams", "hybrid_streams",
    "window_hit_streams", "draft_window_streams", "lora_streams", "grammar_streams",
    "mm_streams", "encoder_pressure_streams", "encoder_preemption_streams", "mm_hash_streams",
    "repeated_image_streams", "encoder_handoff_streams", "connector_idle_streams",
    "passed_over_victim_streams", "kv_cache_groups", "any_stream", "request_ids",
]
