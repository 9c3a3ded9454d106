"""The conformance profile of an engine: how it fares on each family of vLLM's rules.

For an engine of one's own (``module:Class``, ``cmd:<command>``) or any other,
each conformance property of :mod:`harness.checks.properties` -- one per family of
rules: preemption, prefix caching, chunked prefill, speculative decoding, stops
and aborts, hybrid groups, LoRA, ... -- draws streams from its strategy, seeded
by its name.  Every stream runs through the engine and through what it is judged
against (the reference, the exact model of vLLM 0.11.0, or vLLM itself), and the
two traces are compared on every step field, or on the fields asked for (a
simulator that only models token counts compares ``scheduled`` and leaves block
ids free).  Per family the profile gives the streams that conform, diverge, or
that the engine does not take; the first divergence; a shrunk counterexample;
and the rules of vLLM the engine breaks.

A rule is *named* when one of the reference's one-rule mutants
(:mod:`harness.checks.mutants`) gives exactly the engine's trace on a divergent
stream: that mutant's rule is one the engine does not follow.  Streams that no
single mutant explains are tried with two at once (a rule named so far and any
other);
what is still unexplained is counted, so a profile says when the engine breaks
something the catalogue has no mutant for.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis.errors import Flaky

from harness.checks.diff import first_divergence, only_fields
from harness.engines import get_engine
from harness.checks.mutants import REFERENCE_MUTANTS
from harness.formats.mutant import Mutant
from harness.formats.paths import write_json
from harness.checks.properties import PROPERTIES, Property
from harness.loop.runner import run
from harness.formats.stream import Stream, parse_stream
from harness.formats.text import markdown_table

#: Divergent streams per family whose rules are looked for (each costs a run per mutant).
EXPLAINED_PER_FAMILY = 3

_QUIET = dict(deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck), report_multiple_bugs=False)


@dataclass
class Family:
    """One family's row of the profile."""

    name: str
    streams: int = 0
    conform: int = 0
    diverge: int = 0
    not_taken: int = 0
    first: str = ""  # "stream 3, step 0, new_block_ids"
    example: str = ""  # where the shrunk counterexample was written
    rules: Counter = field(default_factory=Counter)  # rule (or "a + b") -> streams it explains
    unexplained: int = 0
    why_not_taken: str = ""

    def row(self) -> list[str]:
        rules = ", ".join(f"{r} ({n})" for r, n in sorted(self.rules.items())) or "-"
        if self.unexplained:
            rules += f"; {self.unexplained} unexplained"
        return [self.name, str(self.streams), str(self.conform), str(self.diverge),
                str(self.not_taken), self.first or "-", rules if self.diverge else "-"]


@dataclass
class Profile:
    engine: str
    against: str
    fields: tuple[str, ...] | None
    families: list[Family]

    @property
    def rules(self) -> list[str]:
        """Every rule named in some family, each alone (pairs split)."""
        named = {r for f in self.families for key in f.rules for r in key.split(" + ")}
        return sorted(named)

    @property
    def conforms(self) -> bool:
        return not any(f.diverge for f in self.families)

    def text(self) -> str:
        compared = "every step field" if self.fields is None else ", ".join(self.fields)
        header = ["family", "streams", "conform", "diverge", "not taken", "first divergence",
                  "rules broken (streams they explain)"]
        lines = [f"engine {self.engine} against {self.against}; compared: {compared}", "",
                 markdown_table([header, *(f.row() for f in self.families)]), ""]
        lines.append("rules broken: " + (", ".join(self.rules) or "none found"))
        unexplained = sum(f.unexplained for f in self.families)
        if unexplained:
            lines.append(f"{unexplained} divergent stream(s) explained by no mutant or pair "
                         "of mutants: the engine breaks a rule the catalogue does not name")
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        return {"engine": self.engine, "against": self.against,
                "fields": list(self.fields) if self.fields else None,
                "rules_broken": self.rules, "conforms": self.conforms,
                "families": [{**f.__dict__, "rules": dict(f.rules)} for f in self.families]}


def draw(prop: Property, n: int) -> list[dict[str, Any]]:
    """``n`` streams of the property's strategy, the same on every run."""
    drawn: list[dict[str, Any]] = []

    @seed(prop.seed)
    @settings(max_examples=n, phases=[Phase.generate], **_QUIET)
    @given(prop.strategy())
    def collect(data):
        drawn.append(data)

    collect()
    return drawn[:n]


class _Diverged(Exception):
    pass


def shrink(prop: Property, n: int, diverges) -> dict[str, Any] | None:
    """The smallest stream of the property's that still diverges, as hypothesis shrinks
    it from the first of its ``n`` streams that does."""
    last: dict[str, Any] = {}

    @seed(prop.seed)
    @settings(max_examples=n, phases=[Phase.generate, Phase.shrink], **_QUIET)
    @given(prop.strategy())
    def hunt(data):
        if diverges(data):
            last["stream"] = data
            raise _Diverged

    try:
        hunt()
    except (_Diverged, Flaky):
        pass
    return last.get("stream")


class Judge:
    """Runs the engine and what it is judged against on a stream; compares the traces."""

    def __init__(self, engine: str, against: str, fields: Sequence[str] | None):
        self.engine = get_engine(engine)
        self.against = get_engine("reference", "0.11.0") if against == "reference" \
            else get_engine(against)
        self.reference = get_engine("reference", "0.11.0")
        self.fields = tuple(fields) if fields else None

    def view(self, trace) -> dict[str, Any]:
        data = trace.to_json()
        return only_fields(data, self.fields) if self.fields else data

    def refuses(self, stream: Stream) -> str | None:
        return self.engine.refuses(stream) or self.against.refuses(stream)

    def compare(self, stream: Stream):
        mine = self.view(run(self.engine, stream))
        return first_divergence(self.view(run(self.against, stream)), mine), mine

    def explained_by(self, stream: Stream, mine: dict, mutants: Iterable[Mutant]) -> bool:
        """Whether the reference with ``mutants`` all applied gives the engine's trace."""
        from contextlib import ExitStack
        with ExitStack() as stack:
            for m in mutants:
                stack.enter_context(m.patch())
            theirs = self.view(run(self.reference, stream))
        return first_divergence(theirs, mine) is None


def candidates(stream: Stream) -> list[Mutant]:
    """The reference's mutants of vLLM 0.11.0's rules that could change this stream."""
    return [m for m in REFERENCE_MUTANTS
            if m.patch is not None and not m.equivalent and m.release is None
            and m.checked_by == "streams" and (m.applies is None or m.applies(stream))]


def explain_alone(judge: Judge, stream: Stream, mine: dict) -> str | None:
    """The rule whose mutant alone reproduces the engine's trace, if one does."""
    return next((m.name for m in candidates(stream) if judge.explained_by(stream, mine, [m])),
                None)


def explain_pair(judge: Judge, stream: Stream, mine: dict, named: set[str]) -> str | None:
    """``a + b``: a named rule and another whose mutants together reproduce the trace."""
    pool = candidates(stream)
    for first in [m for m in pool if m.name in named]:
        for other in pool:
            if other is not first and judge.explained_by(stream, mine, [first, other]):
                return " + ".join(sorted((first.name, other.name)))
    return None


def profile(engine: str, streams: int = 50, fields: Sequence[str] | None = None,
            against: str = "reference", families: Sequence[str] | None = None,
            folder: Path | None = None, shrink_examples: bool = True,
            on_family=None) -> Profile:
    judge = Judge(engine, against, fields)
    props = [p for p in PROPERTIES if families is None or p.name in families]
    result = Profile(engine, against, judge.fields, [])
    named: set[str] = set()
    for prop in props:
        fam = Family(prop.name)
        divergent: list[tuple[Stream, dict]] = []
        for index, data in enumerate(draw(prop, streams)):
            stream = parse_stream(data)
            fam.streams += 1
            why = judge.refuses(stream)
            if why is not None:
                fam.not_taken += 1
                fam.why_not_taken = fam.why_not_taken or why
                continue
            d, mine = judge.compare(stream)
            if d is None:
                fam.conform += 1
                continue
            fam.diverge += 1
            if not fam.first:
                fam.first = f"stream {index}, step {d.step}, {d.field}"
            if len(divergent) < EXPLAINED_PER_FAMILY:
                divergent.append((stream, mine))
        # Single rules first, over all the family's divergent streams; then pairs with a
        # rule named so far (here or in an earlier family) for the streams left over.
        left = []
        for stream, mine in divergent:
            rule = explain_alone(judge, stream, mine)
            if rule is None:
                left.append((stream, mine))
            else:
                fam.rules[rule] += 1
                named.add(rule)
        for stream, mine in left:
            rule = explain_pair(judge, stream, mine, named)
            if rule is None:
                fam.unexplained += 1
            else:
                fam.rules[rule] += 1
                named.update(rule.split(" + "))
        if fam.diverge and shrink_examples and folder is not None:
            def diverges(data, judge=judge):
                s = parse_stream(data)
                return judge.refuses(s) is None and judge.compare(s)[0] is not None
            small = shrink(prop, streams, diverges)
            if small is not None:
                path = folder / f"{prop.name}.json"
                write_json(path, small)
                fam.example = str(path)
        result.families.append(fam)
        if on_family is not None:
            on_family(fam)
    return result
