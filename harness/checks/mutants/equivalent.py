"""Equivalent mutants: no stream can tell them from the original, and each says why."""

from __future__ import annotations

from harness.checks.mutants.registry import MUTANTS
from harness.formats.mutant import SCHEDULER, WORKER_BLOCK_TABLE, Mutant, replace
from reference import slot_mapping as rslots

_add_row = rslots.WorkerBlockTable.add_row


def _fresh_row(self, block_ids, row):
    self.rows[row] = [0] * self.width
    _add_row(self, block_ids, row)


MUTANTS += [
    Mutant("worker_rows_cleared", "a rewritten worker row keeps its older entries",
           WORKER_BLOCK_TABLE, replace(rslots.WorkerBlockTable, "add_row", _fresh_row),
           quirk="STALE_WORKER_ROWS",
           equivalent="the harness's worker keeps one row per request and rewrites it only "
                      "when the request is new or resumed, with its whole table; every position "
                      "looked up after that lies inside the pages the scheduler allocated, so an "
                      "older entry past the new length is never read (no stream of 10,000 "
                      "generated, priority victims included, shows it)"),
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
