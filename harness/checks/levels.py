"""Fidelity levels: what of a trace an engine is held to, graded.

A simulator that keeps token counts but no page ids cannot match vLLM's traces
exactly, yet its token counts can be exact.  The levels name what is compared, each
including the one before:

``tokens``
    the tokens each request computes per step, before and after it, the tokens the
    model samples, the drafts (the mission's first question);
``preemptions``
    and whom each step preempts, which requests finish and every request's status;
``prefix_hits``
    and the tokens each admitted request finds in the prefix cache;
``exact``
    and every other field: pages handed out, KV slots, free pages, evictions, the
    pool, stats, events, the feature fields (the mission's second question).

A verdict says the highest level that held (:func:`level_held`).  The number of steps
and how the run ended are compared at every level.  ``exact`` is what every check of
vLLM itself uses, unchanged.
"""

from __future__ import annotations

from typing import Any, Sequence

from harness.checks.diff import Divergence, first_divergence, only_fields
from harness.formats.trace import STEP_FIELDS

TOKENS = ("scheduled", "computed_before", "num_computed_tokens", "emitted", "spec_tokens",
          "updated", "output_placeholders")
PREEMPTIONS = TOKENS + ("preempted", "finished", "status")
PREFIX_HITS = PREEMPTIONS + ("prefix_hit_tokens",)

#: Each level's fields; ``exact``: every step field and the pool (None).
LEVELS: dict[str, tuple[str, ...] | None] = {
    "tokens": TOKENS, "preemptions": PREEMPTIONS, "prefix_hits": PREFIX_HITS, "exact": None,
}
EXACT = "exact"


class LevelError(ValueError):
    """A ``--level`` or ``--fields`` that names nothing comparable: one line."""


def fields_of(level: str | None = None, fields: str | Sequence[str] | None = None
              ) -> tuple[str, ...] | None:
    """The fields compared for ``--level`` or ``--fields`` (not both); None: every field."""
    if level is not None and fields is not None:
        raise LevelError("--fields: not with --level (a level names its fields)")
    if fields is not None:
        names = [f.strip() for f in fields.split(",")] if isinstance(fields, str) else list(fields)
        names = [f for f in names if f]
        unknown = [f for f in names if f not in (*STEP_FIELDS, "kv_cache")]
        if unknown or not names:
            raise LevelError(f"--fields: {', '.join(unknown) or 'none given'} not a step field "
                             f"({', '.join(STEP_FIELDS)}, kv_cache)")
        return tuple(names)
    if level is None:
        return None
    if level not in LEVELS:
        raise LevelError(f"--level: {level[:40]!r} is not a level ({', '.join(LEVELS)})")
    return LEVELS[level]


def divergence(a: dict[str, Any], b: dict[str, Any],
               fields: Sequence[str] | None = None) -> Divergence | None:
    """The first divergence of two traces on ``fields`` (None: every field)."""
    if fields is None:
        return first_divergence(a, b)
    return first_divergence(only_fields(a, fields), only_fields(b, fields))


def level_held(a: dict[str, Any], b: dict[str, Any]) -> tuple[str | None, Divergence | None]:
    """The highest level at which two traces agree (None: not even ``tokens``), and the
    first divergence at the level above it (None when ``exact`` held)."""
    held = None
    for level, fields in LEVELS.items():
        d = divergence(a, b, fields)
        if d is not None:
            return held, d
        held = level
    return held, None


def describe(held: str | None, d: Divergence | None) -> str:
    """A graded verdict in words: ``exact``, or the level held and where the next fails."""
    if d is None:
        return "exact"
    where = "at the end of the run" if d.step is None else f"at step {d.step}"
    next_level = list(LEVELS)[0 if held is None else list(LEVELS).index(held) + 1]
    return (f"{'no level' if held is None else 'holds at ' + held}; {next_level} fails "
            f"{where}, field {d.field}")


def label(fields: Sequence[str] | None) -> str:
    """What is compared, in words: a level's name, or the fields."""
    for level, named in LEVELS.items():
        if named == (None if fields is None else tuple(fields)):
            return f"level {level}" if level != EXACT else "every field"
    return "fields " + ", ".join(fields)
