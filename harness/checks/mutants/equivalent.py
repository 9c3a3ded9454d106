"""Equivalent mutants: no stream can tell them from the original, and each says why."""

from __future__ import annotations

from harness.checks.mutants.registry import MUTANTS
from harness.formats.mutant import SCHEDULER, WORKER_BLOCK_TABLE, Mutant, replace
from reference import encoder_cache as renc
from reference import slot_mapping as rslots

_add_row = rslots.WorkerBlockTable.add_row


def _fresh_row(self, block_ids, row):
    self.rows[row] = [0] * self.width
    _add_row(self, block_ids, row)


def _evict_past_the_end(self, needed):
    while self.num_free_slots < needed:
        mm_hash = next(iter(self.freeable))  # StopIteration, not vLLM's KeyError
        self.num_free_slots += self.freeable.pop(mm_hash)
        del self.holders[mm_hash]
        self.lengths.pop(mm_hash, None)
        self.freed.append(mm_hash)


MUTANTS += [
    Mutant("worker_rows_cleared", "a rewritten worker row keeps its older entries",
           WORKER_BLOCK_TABLE, replace(rslots.WorkerBlockTable, "add_row", _fresh_row),
           quirk="STALE_WORKER_ROWS",
           equivalent="the harness's worker keeps one row per request and rewrites it only "
                      "when the request is new or resumed, with its whole table; every position "
                      "looked up after that lies inside the pages the scheduler allocated, so an "
                      "older entry past the new length is never read (no stream of 10,000 "
                      "generated, priority victims included, shows it)"),
    Mutant("encoder_eviction_of_nothing_raises_keyerror",
           "an eviction with nothing freeable raises KeyError, as vLLM's does",
           "vllm/v1/core/encoder_cache_manager.py",
           replace(renc.EncoderCacheManager, "evict_until", _evict_past_the_end),
           quirk="ENCODER_DECODER_FREEABLE_COUNTED_TWICE",
           equivalent="only an encoder-decoder model schedules an item whose output is "
                      "freeable without looking it up, and the reference's scheduler has no "
                      "encoder-decoder path: no stream evicts with nothing freeable.  The "
                      "encoder cache's own property holds the quirk to vLLM and shows this "
                      "mutant caught (tests/test_encoder_cache_conformance.py)"),
    Mutant("break_on_zero_tokens", "a running request with 0 tokens is skipped (continue)",
           SCHEDULER, None,
           equivalent="with synchronous scheduling a running request always has >= 1 token to "
                      "compute (it holds num_tokens - 1 computed, and num_tokens < max_model_len); "
                      "0 needs async scheduling, pipeline parallelism or encoder budgets"),
    Mutant("threshold_after_budget", "long-prefill threshold applies before the budget",
           SCHEDULER, None,
           equivalent="a positive threshold caps like min(n, threshold), and min commutes with "
                      "the budget's min: both orders give the same count"),
]
