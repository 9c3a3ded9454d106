"""Structured output: what the scheduler does for grammar-constrained requests.

Mirrors: vllm/v1/structured_output/__init__.py (StructuredOutputManager:
grammar_bitmask, should_advance), vllm/v1/structured_output/request.py, and
the structured-output parts of vllm/v1/core/sched/scheduler.py.

vLLM compiles a request's grammar in the background; until it is ready the
request waits in WAITING_FOR_FSM and is set aside each step (the scheduler
only notices a ready grammar when it reaches the request in the waiting
queue).  Once running:

* its drafts are cut before the first token the grammar rejects, when they
  are handed to the scheduler;
* each step that schedules it gets bitmask rows: one per scheduled draft plus
  one for the token after them, filled from the grammar's state advanced
  draft by draft (and rolled back afterwards);
* the tokens it emits advance the grammar.

The grammar here is the harness's scripted stand-in for a compiled one (see
docs/stream-format.md): it rejects a fixed set of tokens, never terminates,
and its state is the number of tokens it has accepted, which is what it
writes into a bitmask row.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Grammar:
    """A scripted grammar: rejects ``rejected`` tokens, counts the tokens it accepted."""

    rejected: frozenset[int] = frozenset()
    ready: bool = False
    num_accepted: int = 0

    def validate(self, tokens: list[int]) -> list[int]:
        """The longest prefix the grammar accepts, without advancing it."""
        for i, token in enumerate(tokens):
            if token in self.rejected:
                return tokens[:i]
        return list(tokens)

    def accept(self, tokens: list[int]) -> None:
        self.num_accepted += len(tokens)

    def rollback(self, num_tokens: int) -> None:
        self.num_accepted -= num_tokens


@dataclass
class BitmaskRow:
    request_id: str
    grammar_state: int


@dataclass
class GrammarBatch:
    """The step's grammar part of the output: the batch index of every constrained
    request (vLLM's ``structured_output_request_ids``) and the bitmask rows."""

    batch_index: dict[str, int] = field(default_factory=dict)
    rows: list[BitmaskRow] = field(default_factory=list)


def grammar_batch(batch: list, spec_tokens: dict[str, list[int]],
                  index_among_constrained: bool = False,
                  invalid_drafts: bool = False,
                  last_row_after_placeholder: bool = True) -> GrammarBatch:
    """Index the constrained requests of ``batch`` and fill their rows, in that order.

    0.11.0 indexes a request by its place in the whole batch, whose order is the
    one vLLM lists requests in for the worker (new, running, resumed).  From 0.11.1
    (grammar_rows_in_grant_order) the batch is in ``num_scheduled_tokens`` order and
    the index counts constrained requests only (``index_among_constrained``).
    """
    out = GrammarBatch()
    constrained = [r for r in batch if r.grammar is not None]
    for request in constrained:
        position = constrained if index_among_constrained else batch
        out.batch_index[request.request_id] = position.index(request)
    for request in constrained:
        out.rows += rows_of(request, spec_tokens.get(request.request_id, []), invalid_drafts,
                            last_row_after_placeholder)
    return out


#: The state of a row left unfilled (the grammar does not constrain it).
UNFILLED_ROW = -1


def rows_of(request, drafts: list[int], invalid_drafts: bool = False,
            last_row_after_placeholder: bool = True) -> list[BitmaskRow]:
    """One row per draft plus one: the grammar steps through the drafts, then back.

    A placeholder draft (-1: the padding of new_decode_padded_with_drafts, from 0.25.0
    the only drafts that can be one) gets its row in the state reached so far; the
    grammar stops there and the rows of the drafts after it are left unfilled, while the
    last row, the token sampled after the drafts, is filled in the state reached; from
    0.30.0 (placeholder_leaves_last_row_unfilled, ``last_row_after_placeholder`` false)
    it is left unfilled too.

    ``invalid_drafts`` (from 0.34.0, grammar_keeps_first_invalid_draft): the drafts may end
    with one the grammar rejects, or hold placeholders (-1); the rows after such a draft
    are left unfilled."""
    grammar = request.grammar
    if invalid_drafts:
        return rows_up_to_invalid(request.request_id, grammar, drafts)
    rows, advanced, stopped = [], 0, False
    for token in drafts:
        rows.append(BitmaskRow(request.request_id,
                               UNFILLED_ROW if stopped else grammar.num_accepted))
        if token == -1:
            stopped = True
        elif not stopped:
            grammar.accept([token])
            advanced += 1
    last_unfilled = stopped and not last_row_after_placeholder
    rows.append(BitmaskRow(request.request_id,
                           UNFILLED_ROW if last_unfilled else grammar.num_accepted))
    grammar.rollback(advanced)
    return rows


def rows_up_to_invalid(request_id: str, grammar: Grammar, drafts: list[int]) -> list[BitmaskRow]:
    rows, advanced, invalid = [], 0, False
    for token in drafts + [None]:
        rows.append(BitmaskRow(request_id, UNFILLED_ROW if invalid else grammar.num_accepted))
        if token is None or invalid:
            continue
        if token < 0 or not grammar.validate([token]):
            invalid = True
        else:
            grammar.accept([token])
            advanced += 1
    grammar.rollback(advanced)
    return rows
