"""The rule report: how often each named rule of the reference decided a stream.

A rule is *reached* by a stream when breaking that one rule changes the
stream's trace: the reference with the rule's mutant (``harness.checks.mutants``)
gives a different trace from the reference without it.  Such a stream is one
that would catch a vLLM release, or a reference, that got the rule wrong; a
rule no generated stream reaches is a blind spot of the campaign, whatever it
prints.

Rules are the reference's non-equivalent mutants, judged on vLLM 0.11.0's
rules (each quirk of ``reference.quirks`` is one of them), and the rule
changes of later releases (``reference.releases``), each judged on the first
release that has it.  Only the reference runs: a stream costs one run per
rule, about 3 ms each.

``reach_of_profile("ci")`` generates, per property, exactly the streams the
conformance tests generate under that profile (``harness.checks.properties.given_property``)
and counts; ``python -m harness reach`` prints the table, and the suite fails
when a rule is reached fewer than :data:`FLOOR` times under the ci profile.
"""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import os
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Iterable

from hypothesis import event, settings

from harness.checks import profiles
from harness.checks.rule_watch import Watch
from harness.engines import get_engine
from harness.checks.mutants import REFERENCE_MUTANTS
from harness.formats.mutant import Mutant
from harness.checks.properties import PROPERTIES, Property, by_name, given_property
from harness.loop.runner import run
from harness.formats.stream import Stream, parse_drawn_stream
from harness.formats.text import markdown_table
from reference.releases import RELEASES

#: Streams of the ci profile that must reach each rule.
FLOOR = 20

#: The release whose rules the reference's modules state.
BASE_RELEASE = RELEASES[0]


@dataclass(frozen=True)
class Rule:
    """One named rule, known by the mutant that breaks it."""

    mutant: Mutant
    release: str  # the reference release it is judged on

    @property
    def name(self) -> str:
        return self.mutant.name

    @property
    def states(self) -> str:
        return self.mutant.rule


def named_rules() -> list[Rule]:
    """Every named rule: the reference's mutants that a stream can tell, and the
    rule changes of later releases."""
    rules = []
    for m in REFERENCE_MUTANTS:
        if m.equivalent or m.patch is None:
            continue
        rules.append(Rule(m, m.release or BASE_RELEASE))
    return rules


def _outcome(trace) -> tuple:
    """What the conformance comparison (harness.checks.diff) compares: the pool of the header,
    the step records, the verdict and the step an engine failed at."""
    return trace.kv_cache, trace.steps, trace.verdict, trace.failure and trace.failure["step"]


def rules_reached(stream: Stream, rules: Iterable[Rule], skip_undecided: bool = True) -> list[str]:
    """The rules (judged by streams) whose mutant changes ``stream``'s trace in the reference.

    The reference runs once per release with the rules' sites watched
    (:mod:`harness.checks.rule_watch`); a rule whose site that run never went through cannot
    change the trace, and its mutant is not run (``skip_undecided=False`` runs it
    anyway: the check that skipping changes no count).
    """
    live = [r for r in rules if r.mutant.checked_by == "streams"
            # applies: it cannot change this stream (tests/test_reach.py checks the claim)
            and (r.mutant.applies is None or r.mutant.applies(stream))]
    reached = set()
    for release, group in _by_release(live).items():
        engine = get_engine("reference", release=release)
        trace, decided = Watch(group).decided_during(lambda: run(engine, stream))
        original = _outcome(trace)
        for rule in group:
            if skip_undecided and rule.name not in decided:
                continue
            with rule.mutant.patch():
                # Held to the trace: a mutant run stops at its first different step.
                if _outcome(run(engine, stream, like=trace)) != original:
                    reached.add(rule.name)
    return [r.name for r in live if r.name in reached]


def _by_release(rules: Iterable[Rule]) -> dict[str, list[Rule]]:
    """The rules grouped by the release they are judged on, in their order."""
    groups: dict[str, list[Rule]] = {}
    for rule in rules:
        groups.setdefault(rule.release, []).append(rule)
    return groups


def broken_skips(stream: Stream, rules: Iterable[Rule]) -> list[str]:
    """The claims behind every skipped mutant run, checked on one stream: watching the
    sites changes no trace, and a rule that does not apply to the stream or that the
    watched run did not decide keeps the trace as it is under its mutant.  Each claim
    that fails is named."""
    broken = []
    for release, group in _by_release(r for r in rules if r.mutant.checked_by == "streams").items():
        engine = get_engine("reference", release=release)
        original = _outcome(run(engine, stream))
        trace, decided = Watch(group).decided_during(lambda: run(engine, stream))
        if _outcome(trace) != original:
            broken.append(f"watching the sites of {release}'s rules changed the trace")
        for rule in group:
            applies = rule.mutant.applies is None or rule.mutant.applies(stream)
            if applies and rule.name in decided:
                continue
            with rule.mutant.patch():
                if _outcome(run(engine, stream)) != original:
                    broken.append(f"{rule.name}: " + ("undecided" if applies else
                                                      "applies() is False") + ", yet its "
                                  "mutant changes the trace")
    return broken


def kv_sizing_reach(rules: Iterable[Rule]) -> dict[str, int]:
    """For each KV sizing rule: how many of the KV sizing check's numbers (the
    reference's side, every bundled model) its mutant changes."""
    from harness.checks.kv_sizing import block_sizes_of, model_dirs, reference_values, side_values
    sizes = block_sizes_of()

    def values() -> list:
        return [side_values(reference_values, model, sizes) for model in model_dirs()]

    def changed(a, b) -> int:  # a side's numbers, or the one-line error it failed with
        if isinstance(a, dict) and isinstance(b, dict):
            return sum(a[field] != b.get(field) for field in a)
        return int(a != b)

    original = values()
    counts = {}
    for rule in rules:
        if rule.mutant.checked_by != "kv sizing":
            continue
        with rule.mutant.patch():
            mutated = values()
        counts[rule.name] = sum(changed(a, b) for a, b in zip(original, mutated))
    return counts


@dataclass
class Reach:
    """Streams seen and, per rule, the streams that reached it."""

    rules: list[str]  # the rules judged by streams
    streams: int = 0
    counts: Counter = field(default_factory=Counter)
    by_property: dict[str, Counter] = field(default_factory=dict)
    # KV sizing rules: how many numbers of the KV sizing check each one changes.
    kv_sizing: dict[str, int] = field(default_factory=dict)

    def add(self, reached: Iterable[str], prop: str = "") -> None:
        self.streams += 1
        reached = list(reached)
        self.counts.update(reached)
        if prop:
            self.by_property.setdefault(prop, Counter()).update(reached)

    def merge(self, other: "Reach") -> None:
        self.streams += other.streams
        self.counts.update(other.counts)
        for prop, counts in other.by_property.items():
            self.by_property.setdefault(prop, Counter()).update(counts)

    def below(self, floor: int = FLOOR) -> list[tuple[str, int]]:
        """The rules reached by fewer than ``floor`` streams (KV sizing rules: that
        change no number), with their counts."""
        return ([(r, self.counts[r]) for r in self.rules if self.counts[r] < floor]
                + [(r, n) for r, n in self.kv_sizing.items() if n == 0])

    def to_json(self) -> dict[str, Any]:
        return {"streams": self.streams, "rules": {r: self.counts[r] for r in self.rules},
                "by_property": {p: {r: c[r] for r in self.rules if c[r]}
                                for p, c in self.by_property.items()},
                "kv_sizing_numbers_changed": dict(self.kv_sizing)}

    def table(self, floor: int | None = FLOOR) -> str:
        """One row per rule: streams that reached it, per property and in all."""
        props = list(self.by_property)
        by_name = {r.name: r for r in named_rules()}
        head = ["rule", "judged on", *props, "all"] + (["floor"] if floor else [])
        rows = [head]
        for name in self.rules:
            rule = by_name.get(name)
            release = rule.release if rule else "?"
            cells = [name, release, *(str(self.by_property[p][name]) for p in props),
                     str(self.counts[name])]
            if floor:
                cells.append("ok" if self.counts[name] >= floor else f"BELOW {floor}")
            rows.append(cells)
        lines = [markdown_table(rows)]
        if self.kv_sizing:
            lines.append("\nKV sizing rules (no stream shows them; judged by the KV sizing "
                         "check): numbers of the reference's side each one changes")
            lines += [f"  {name}: {n}" + ("" if n else "  NOT REACHED")
                      for name, n in self.kv_sizing.items()]
        return "\n".join(lines)


def reach_of_property(prop: Property, rules: list[Rule], examples: int | None = None,
                      enough: int | None = None, skip_undecided: bool = True,
                      so_far: "Reach | None" = None) -> Reach:
    """The reach of one property's streams under the loaded profile (as its test sees them).

    With ``enough``, a rule that has been reached ``enough`` times is no longer judged:
    its count stops there.  Reached where: by this property's streams, plus those counted
    in ``so_far`` (the properties before it, when the report runs them one after
    another).  A property's own targets stay judged until it reaches them once.  A floor
    check stays exact (a total below the floor is made of counts that were never cut) and
    costs far fewer runs, since most rules are reached within the first few dozen streams.
    """
    result = Reach([r.name for r in rules if r.mutant.checked_by == "streams"])
    before = so_far.counts if so_far is not None else Counter()

    def judged(rule: Rule) -> bool:
        if enough is None:
            return True
        if rule.name in prop.targets and result.counts[rule.name] == 0:
            return True
        return before[rule.name] + result.counts[rule.name] < enough

    def body(data):
        reached = rules_reached(parse_drawn_stream(data), [r for r in rules if judged(r)],
                                skip_undecided)
        for name in reached:
            event(f"reaches {name}")
        result.add(reached, prop.name)

    test = given_property(prop, body)
    if examples is not None:
        test = settings(max_examples=examples)(test)
    test()
    return result


def _reach_in_worker(profile: str, prop_name: str, rule_names: list[str],
                     examples: int | None, skip_undecided: bool) -> Reach:
    profiles.load(profile)
    rules = [r for r in named_rules() if r.name in rule_names]
    return reach_of_property(by_name(prop_name), rules, examples,
                             skip_undecided=skip_undecided)


def reach_of_profile(profile: str = "ci", properties: Iterable[Property] | None = None,
                     rule_names: Iterable[str] | None = None, examples: int | None = None,
                     workers: int | None = None, enough: int | None = None,
                     skip_undecided: bool = True) -> Reach:
    """Every property's streams under ``profile``; counts add up the same in any order.

    Without ``enough``, one worker process per property (at most ``workers``, default
    the CPU count).  With ``enough`` (the floor check), or with one worker, the
    properties run one after another in this process, in their order, and a rule is no
    longer judged once the streams so far have reached it ``enough`` times (see
    :func:`reach_of_property`): each count is the full one cut at ``enough``, plus at
    most one per property that targets the rule, and the same on every run.
    ``skip_undecided=False``: every mutant runs on every stream it applies to (the check
    that skipping the undecided ones changes no count).
    """
    props = list(PROPERTIES if properties is None else properties)
    wanted = set(rule_names) if rule_names is not None else None
    rules = [r for r in named_rules() if wanted is None or r.name in wanted]
    names = [r.name for r in rules if r.mutant.checked_by == "streams"]
    total = Reach(names, kv_sizing=kv_sizing_reach(rules))
    for p in props:
        total.by_property[p.name] = Counter()
    workers = workers or os.cpu_count() or 1
    if enough is not None or workers == 1 or len(props) == 1:
        with profiles.loaded(profile):
            for p in props:
                total.merge(reach_of_property(p, rules, examples, enough, skip_undecided,
                                              so_far=total))
        return total
    context = multiprocessing.get_context("spawn")  # no fork after torch may be loaded
    workers = min(workers, len(props))
    with concurrent.futures.ProcessPoolExecutor(workers, mp_context=context) as pool:
        # The properties with the most streams first, so that no worker is left with a
        # long one at the end while the others idle.
        futures = [pool.submit(_reach_in_worker, profile, p.name, names, examples,
                               skip_undecided)
                   for p in sorted(props, key=lambda p: -p.scale)]
        for f in futures:
            total.merge(f.result())
    return total


def floor_message(reach: Reach, floor: int = FLOOR, profile: str = "ci") -> str | None:
    """One line per rule below the floor, or None when every rule is reached often enough."""
    below = reach.below(floor)
    if not below:
        return None
    return "\n".join(f"rule {name}: reached by {n} of {reach.streams} streams of the {profile} "
                     f"profile (floor {floor})" for name, n in below)
