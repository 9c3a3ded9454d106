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
from typing import Any, Callable, Iterable, Sequence

from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis.errors import Flaky

from harness.checks.diff import first_divergence, only_fields
from harness.checks.levels import LEVELS, level_held
from harness.formats import features as feature_space
from harness.engines import get_engine
from harness.checks.designs import DESIGNS
from harness.checks.mutants import REFERENCE_MUTANTS
from harness.formats.mutant import Mutant
from harness.formats.paths import write_json
from harness.checks.properties import PROPERTIES, Property
from harness.loop.runner import run
from harness.formats.trace import ENGINE_FAILURE
from harness.formats.stream import Stream, StreamError, parse_stream
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
    # Not run: every stream of the family needs a feature the engine does not model.
    outside: str = ""
    # Why streams were not taken, with how many.
    refusals: Counter = field(default_factory=Counter)
    # The highest fidelity level each taken stream held (harness.checks.levels), counted.
    levels: Counter = field(default_factory=Counter)
    # The engine's own failures by exception and site, counted, and one message of each.
    crashes: Counter = field(default_factory=Counter)
    crash_examples: dict = field(default_factory=dict)
    # Where the divergent streams no catalogue entry explains first diverge.
    unexplained_at: list = field(default_factory=list)

    @property
    def taken(self) -> int:
        return self.streams - self.not_taken

    def held_at(self, level: str) -> int:
        """Taken streams that conform at ``level`` (or a higher one)."""
        order = list(LEVELS)
        return sum(n for held, n in self.levels.items()
                   if held is not None and order.index(held) >= order.index(level))

    def row(self) -> list[str]:
        if self.outside:
            return [self.name, "-", "-", "-", "-", "-", f"outside: {self.outside}", "-"]
        rules = ", ".join(f"{r} ({n})" for r, n in sorted(self.rules.items())) or "-"
        if self.unexplained:
            rules += f"; {self.unexplained} unexplained"
        return [self.name, str(self.streams), str(self.conform), str(self.diverge),
                str(self.not_taken), self.graded(), self.first or "-",
                rules if self.diverge else "-"]

    def graded(self) -> str:
        """The taken streams by the highest fidelity level each held, highest first."""
        order = [*reversed(LEVELS), None]
        return ", ".join(f"{level or 'none'} {self.levels[level]}" for level in order
                         if self.levels[level]) or "-"


@dataclass
class Profile:
    engine: str
    against: str
    fields: tuple[str, ...] | None
    families: list[Family]
    # The stream features the engine declares (None: undeclared; streams are drawn whole).
    features: frozenset[str] | None = None

    @property
    def rules(self) -> list[str]:
        """Every rule named in some family, each alone (pairs split)."""
        named = {r for f in self.families for key in f.rules for r in key.split(" + ")}
        return sorted(named)

    @property
    def conforms(self) -> bool:
        return not any(f.diverge for f in self.families)

    @property
    def generated(self) -> int:
        """Streams drawn in the families inside the engine's features."""
        return sum(f.streams for f in self.families if not f.outside)

    @property
    def taken(self) -> int:
        return sum(f.taken for f in self.families if not f.outside)

    @property
    def refusals(self) -> Counter:
        return sum((f.refusals for f in self.families), Counter())

    def text(self) -> str:
        compared = "every step field" if self.fields is None else ", ".join(self.fields)
        header = ["family", "streams", "conform", "diverge", "not taken", "level held",
                  "first divergence", "rules broken (streams they explain)"]
        lines = [f"engine {self.engine} against {self.against}; compared: {compared}", "",
                 markdown_table([header, *(f.row() for f in self.families)]), ""]
        lines.append("rules broken: " + (", ".join(self.rules) or "none found"))
        if self.generated:
            lines.append(f"taken: {self.taken} of {self.generated} streams "
                         f"({100 * self.taken / self.generated:.0f}%)")
        for why, n in self.refusals.most_common():
            lines.append(f"  not taken ({n}): {why}")
        unexplained = sum(f.unexplained for f in self.families)
        if unexplained:
            lines.append(f"{unexplained} divergent stream(s) explained by no mutant or pair "
                         "of mutants: the engine breaks a rule the catalogue does not name")
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        return {"engine": self.engine, "against": self.against,
                "fields": list(self.fields) if self.fields else None,
                "features": None if self.features is None else sorted(self.features),
                "rules_broken": self.rules, "conforms": self.conforms,
                "generated": self.generated, "taken": self.taken,
                "refusals": dict(self.refusals.most_common()),
                "families": [{**f.__dict__, "rules": dict(f.rules),
                              "refusals": dict(f.refusals.most_common()),
                              "crashes": dict(f.crashes.most_common()),
                              "levels": {str(k): v for k, v in sorted(
                                  f.levels.items(), key=lambda kv: str(kv[0]))}}
                             for f in self.families]}


def draw(prop: Property, n: int, inside: Callable[[dict], dict] = lambda d: d
         ) -> list[dict[str, Any]]:
    """``n`` streams of the property's strategy, the same on every run, each made to fit
    ``inside`` (an engine's declared features)."""
    drawn: list[dict[str, Any]] = []

    @seed(prop.seed)
    @settings(max_examples=n, phases=[Phase.generate], **_QUIET)
    @given(prop.strategy().map(inside))
    def collect(data):
        drawn.append(data)

    collect()
    return drawn[:n]


#: Features on by default in the stream format: a family using them is not about them.
_DEFAULTS = frozenset({"prefix_caching", "chunked_prefill", "eos", "stop_tokens"})


def outside(drawn: list[dict[str, Any]], declared: frozenset[str] | None) -> str:
    """Why a family is outside the declared features ("" when inside): every one of its
    streams needs a feature the engine does not model, one that is not a default of the
    format (fitting it away would leave nothing of the family)."""
    if declared is None or not drawn:
        return ""
    lacking = [set(feature_space.missing(d, declared)) - _DEFAULTS for d in drawn]
    common = set.intersection(*lacking)
    if not common:
        return ""
    return "needs " + ", ".join(feature_space.DESCRIBED[f] for f in feature_space.FEATURES
                                if f in common)


def crash_kind(message: str) -> str:
    """A failure message cut to its exception and site: ``ValueError (kit.py:288)``."""
    name = message.split(":", 1)[0]
    site = message.rsplit("(", 1)[-1].rstrip(")") if message.endswith(")") else "?"
    return f"{name} ({site})"


class _Diverged(Exception):
    pass


def shrink(prop: Property, n: int, diverges,
           inside: Callable[[dict], dict] = lambda d: d) -> dict[str, Any] | None:
    """The smallest stream of the property's that still diverges, as hypothesis shrinks
    it from the first of its ``n`` streams that does."""
    last: dict[str, Any] = {}

    @seed(prop.seed)
    @settings(max_examples=n, phases=[Phase.generate, Phase.shrink], **_QUIET)
    @given(prop.strategy().map(inside))
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

    def __init__(self, engine: str, against: str, fields: Sequence[str] | None,
                 release: str = "0.11.0"):
        self.engine = get_engine(engine)
        self.against = get_engine("reference", release) if against == "reference" \
            else get_engine(against)
        self.reference = get_engine("reference", release)
        self.fields = tuple(fields) if fields else None

    def view(self, data: dict[str, Any]) -> dict[str, Any]:
        """A trace's JSON as compared: the fields asked for, or all of it."""
        return only_fields(data, self.fields) if self.fields else data

    def refuses(self, stream: Stream) -> str | None:
        return self.engine.refuses(stream) or self.against.refuses(stream)

    @property
    def features(self) -> frozenset[str] | None:
        return getattr(self.engine, "features", None)

    def compare(self, stream: Stream):
        """The first divergence on the compared fields, the engine's trace as compared, the
        highest fidelity level the engine held on the stream, and the engine's own failure
        (its message, with the site) where it failed and what it is judged against did not."""
        mine, theirs = run(self.engine, stream).to_json(), run(self.against, stream).to_json()
        crash = mine["failure"]["message"] if mine["verdict"] == ENGINE_FAILURE \
            and theirs["verdict"] != ENGINE_FAILURE else None
        shown = self.view(mine)
        return (first_divergence(self.view(theirs), shown), shown,
                level_held(theirs, mine)[0], crash)

    def explained_by(self, stream: Stream, mine: dict, mutants: Iterable[Mutant]) -> bool:
        """Whether the reference with ``mutants`` all applied gives the engine's trace."""
        return self.reach(stream, mine, mutants) is None

    def reach(self, stream: Stream, mine: dict,
              mutants: Iterable[Mutant]) -> tuple[int, int] | None:
        """How far the reference with ``mutants`` all applied follows the engine's trace: the
        step of the first divergence (-1: the pool differs; the number of steps: only the
        ending) and how many of that step's fields are equal, or None when it gives the
        engine's trace."""
        from contextlib import ExitStack
        with ExitStack() as stack:
            for m in mutants:
                stack.enter_context(m.patch())
            theirs = self.view(run(self.reference, stream).to_json())
        d = first_divergence(theirs, mine)
        if d is None:
            return None
        if d.step is None:
            return (-1 if d.field == "kv_cache" else len(mine["steps"]), 0)
        if d.step >= min(len(theirs["steps"]), len(mine["steps"])):
            return (d.step, 0)
        a, b = theirs["steps"][d.step], mine["steps"][d.step]
        return d.step, sum(a.get(f) == b.get(f) for f in set(a) | set(b))


def candidates(stream: Stream) -> list[Mutant]:
    """The reference's mutants of vLLM 0.11.0's rules that could change this stream, then
    the design differences of simulators (harness.checks.designs)."""
    return [m for m in REFERENCE_MUTANTS
            if m.patch is not None and not m.equivalent and m.release is None
            and m.checked_by == "streams" and (m.applies is None or m.applies(stream))] \
        + list(DESIGNS)


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


#: At most this many catalogue entries together explain one stream.
MAX_COMBINED = 5


def explain_combined(judge: Judge, stream: Stream, mine: dict, named: set[str],
                     wide: bool = False) -> str | None:
    """``a + b + c ...``: catalogue entries added one at a time, each the one that carries
    the reference furthest along the engine's trace (a later first divergence, or more of
    that step's fields equal), until together they reproduce it: a simulator often differs
    in several designs at once.  The entries are the design differences and the rules named
    so far, or (``wide``) every candidate."""
    pool = list(DESIGNS) + [m for m in candidates(stream) if m.side != "design"
                            and (wide or m.name in named)]
    leads = [m for m in pool if m.side == "design" or m.name in named]
    chosen: list[Mutant] = []
    reach = judge.reach(stream, mine, chosen)
    while len(chosen) < MAX_COMBINED:
        steps = [(m,) for m in pool if m not in chosen]
        found = _furthest(judge, stream, mine, chosen, steps, reach)
        if found is None:  # no entry helps alone: two that only help together
            steps = [(a, b) for a in leads if a not in chosen
                     for b in pool if b not in chosen and b is not a]
            found = _furthest(judge, stream, mine, chosen, steps, reach)
        if found is None:
            return None
        reach, added = found
        chosen.extend(added)
        if reach is None:
            return " + ".join(sorted(x.name for x in chosen))
    return None


def _furthest(judge: Judge, stream: Stream, mine: dict, chosen: list[Mutant],
              steps: list[tuple[Mutant, ...]], reach) -> tuple | None:
    """The step (entries to add) that reproduces the trace, else carries the reference
    furthest past ``reach``; None when none gets past it."""
    best = None
    for step in steps:
        r = judge.reach(stream, mine, [*chosen, *step])
        if r is None:
            return None, step
        if r > reach and (best is None or r > best[0]):
            best = (r, step)
    return best


def profile(engine: str, streams: int = 50, fields: Sequence[str] | None = None,
            against: str = "reference", families: Sequence[str] | None = None,
            folder: Path | None = None, shrink_examples: bool = True,
            on_family=None, release: str = "0.11.0",
            explain_per_family: int = EXPLAINED_PER_FAMILY) -> Profile:
    judge = Judge(engine, against, fields, release)
    props = [p for p in PROPERTIES if families is None or p.name in families]
    declared = judge.features
    result = Profile(engine, against, judge.fields, [], declared)

    def inside(data: dict) -> dict:
        return feature_space.fit_for(data, judge.engine)
    named: set[str] = set()
    for prop in props:
        fam = Family(prop.name)
        divergent: list[tuple[Stream, dict, str]] = []  # stream, its trace, where it diverges
        drawn = draw(prop, streams)
        fam.outside = outside(drawn, declared)
        if fam.outside:
            result.families.append(fam)
            if on_family is not None:
                on_family(fam)
            continue
        for index, data in enumerate(map(inside, drawn)):
            fam.streams += 1
            try:
                stream = parse_stream(data)
            except StreamError as exc:  # fitting it to the features broke a rule
                why = f"fitted to the engine's features, the stream breaks {exc.errors[0]}"
                stream = None
            else:
                why = judge.refuses(stream)
            if why is not None:
                fam.not_taken += 1
                fam.why_not_taken = fam.why_not_taken or why
                fam.refusals[why] += 1
                continue
            d, mine, held, crash = judge.compare(stream)
            fam.levels[held] += 1
            if crash:
                kind = crash_kind(crash)
                fam.crashes[kind] += 1
                fam.crash_examples.setdefault(kind, crash)
            if d is None:
                fam.conform += 1
                continue
            fam.diverge += 1
            if not fam.first:
                fam.first = f"stream {index}, step {d.step}, {d.field}"
            if len(divergent) < explain_per_family and not crash:
                # a crash is a defect, not a design
                divergent.append((stream, mine, f"step {d.step}, {d.field}"))
        # Single rules first, over all the family's divergent streams; then pairs with a
        # rule named so far (here or in an earlier family) for the streams left over.
        left = []
        for stream, mine, where in divergent:
            rule = explain_alone(judge, stream, mine)
            if rule is None:
                left.append((stream, mine, where))
            else:
                fam.rules[rule] += 1
                named.add(rule)
        for stream, mine, where in left:
            rule = explain_pair(judge, stream, mine, named) \
                or explain_combined(judge, stream, mine, named) \
                or explain_combined(judge, stream, mine, named, wide=True)
            if rule is None:
                fam.unexplained += 1
                fam.unexplained_at.append(f"{stream.sha256()[:10]}: {where}")
            else:
                fam.rules[rule] += 1
                named.update(rule.split(" + "))
        if fam.diverge and shrink_examples and folder is not None:
            def diverges(data, judge=judge):
                try:
                    s = parse_stream(data)
                except StreamError:
                    return False
                return judge.refuses(s) is None and judge.compare(s)[0] is not None
            small = shrink(prop, streams, diverges, inside)
            if small is not None:
                path = folder / f"{prop.name}.json"
                write_json(path, small)
                fam.example = str(path)
        result.families.append(fam)
        if on_family is not None:
            on_family(fam)
    return result
