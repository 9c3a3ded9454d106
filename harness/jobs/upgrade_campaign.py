"""The upgrade check: which of vLLM 0.11.0's rules a newer release changed, and nothing else.

(Or of any older release the reference describes: ``FROM``.  Below, 0.11.0 stands for
it; a release other than 0.11.0 is represented by its recorded traces where the bundled
streams have them, and by the reference with its rules otherwise.)

Runs inside a process whose vLLM is the newer release (``harness.jobs.side_env``
starts it).  vLLM 0.11.0 is represented twice, both proven equal to it: by the
recorded 0.11.0 traces of the bundled streams, and by the reference with
0.11.0's rules for generated streams.  For every stream:

* the new vLLM's trace is compared with 0.11.0's: *same* or *different*;
* a difference is explained, when it can be, by the named rule changes of
  ``reference/releases.py``: the reference with 0.11.0's rules plus one change
  that gives the new vLLM's trace exactly names that change as the cause;
  when no single change does, the reference with all of the release's changes
  is tried; what still differs is an *unexplained* cause, grouped by the
  first field that differs;
* a campaign goes on past an explained divergence, so the second and third
  cause are found in the same run; each cause gets a minimal example
  (the smallest stream seen with that cause and no other, shrunk further).

The same run checks that the reference with the new release's rules conforms
exactly.  The result is a Markdown report, ``docs/upgrades/<version>.md``.
"""

from __future__ import annotations

import collections
import contextlib
import datetime
import functools
import json
import multiprocessing
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as fixed_seed

from harness.checks import profiles
from harness.jobs.chunks import Chunk, chunks_of
from harness.checks.diff import first_divergence, side_by_side
from harness.engines import EngineUnavailable, get_engine, installed_vllm_version
from harness.engines.reference_engine import ReferenceEngine
from harness.checks.golden import read_trace
from harness.formats.paths import STREAMS_DIR, golden_dir, write_atomic
from harness.checks.properties import by_name
from harness.loop.runner import UNLIKE, run
from harness.formats.rule_counters import Stats
from harness.formats.stream import Stream, canonical_json, load_stream, parse_stream
from harness.formats.trace import Trace
from harness.jobs import suspects
from reference import releases

BASE = "0.11.0"
SAME, DIFFERENT, COULD_NOT_RUN = "same", "different", "could not run"


@dataclass
class Cause:
    """One rule change (or one unexplained kind of difference) and the streams it showed on."""

    key: tuple[str, ...]  # (rule change name,) or ("unexplained", field)
    count: int = 0  # streams it showed on, alone or with other changes
    alone: int = 0  # streams that it alone explains
    together: collections.Counter = field(default_factory=collections.Counter)
    bundled: list[str] = field(default_factory=list)
    features: collections.Counter = field(default_factory=collections.Counter)
    example: dict[str, Any] | None = None
    example_size: tuple[int, int] = (1 << 30, 0)
    example_alone: bool = False  # the example shows this cause and no other
    shrunk: bool = False
    suspects: list = field(default_factory=list)  # suspects.Suspect, for an unexplained cause
    suspects_error: str = ""

    @property
    def explained(self) -> bool:
        return self.key[0] != "unexplained"

    def title(self) -> str:
        if not self.explained:
            return f"unexplained: first difference in '{self.key[1]}'"
        return self.key[0]

    def offer(self, data: dict[str, Any], steps: int, alone: bool) -> None:
        """Keep the smallest example, preferring one this cause alone explains."""
        size = (len(data["requests"]), steps)
        if (not alone, size) < (not self.example_alone, self.example_size):
            self.example, self.example_size, self.example_alone = data, size, alone


class Checker:
    """The engines of one upgrade check, and the classification of one stream.

    ``old`` is the release upgraded from (0.11.0 unless told); the reference must describe
    it.  Its rules are the starting point: a change is tried by turning it over (on when
    ``old`` lacks it, off when ``old`` has it).
    """

    def __init__(self, version: str, old: str = BASE, forget: str | None = None):
        self.version = version
        self.old = old
        self.forget = forget  # a rule change left out of the reference, as if it were new
        self.vllm = get_engine("vllm")
        self.base = ReferenceEngine(old)
        newest = releases.newest_described(version)
        self.target = ReferenceEngine(newest, releases.rules_of(newest) - {forget})
        self.candidates = [c.name for c in releases.CHANGES if c.name != forget]
        self._with: dict[frozenset[str], ReferenceEngine] = {}
        self._single = {name: self.base_with({name}) for name in self.candidates}
        self._target_asked: tuple[Stream, frozenset[str]] | None = None

    def base_with(self, changes: set[str]) -> ReferenceEngine:
        """The reference with ``old``'s rules and ``changes`` turned over (built once each)."""
        key = frozenset(changes)
        if key not in self._with:
            self._with[key] = ReferenceEngine(self.old, self.base.rules ^ key)
        return self._with[key]

    def traces(self, stream: Stream) -> tuple[dict, dict, dict]:
        """The new vLLM's trace of ``stream``, and the reference's with ``old``'s rules and
        with the release's.  What the release's run asked about is kept: the cut to the
        fewest changes starts from that run (:meth:`_fewest_that_explain`)."""
        new = run(self.vllm, stream).to_json()
        old = run(self.base, stream).to_json()
        target, asked = self.asking(self.target, stream)
        self._target_asked = stream, asked
        return new, old, target.to_json()

    def cause_of(self, stream: Stream, new: dict, old: dict, target: dict) -> tuple[str, ...] | None:
        """None when the new vLLM behaves as ``old``; else the names of the rule changes
        that explain it, or ``("unexplained", field)``.

        One change that explains the new trace alone is named alone.  Else, when the
        reference with the release's rules gives the new trace, the changes between the
        two releases are cut down one at a time, in the order of reference.releases,
        to a set from which no change can be left out (a run per change, where trying
        every pair took a run per pair: some 4,000 runs a stream from 0.11.0 to 0.34.0).

        A change that a run never asks about (:class:`AskedRules`) cannot alter that run,
        so it is settled without running: it cannot explain the new trace alone when
        ``old``'s run never asks about it, and it can be left out when the run of the
        changes kept so far never asks about it.
        """
        d = first_divergence(new, old)
        if d is None:
            return None
        # Held to ``new``, 0.11.0's run stops where it leaves it: a change not asked about
        # by then leaves the run as it is up to there, so it still leaves ``new`` there.
        _, asked = self.asking(self.base, stream, new)
        for name in self.active:
            if name in asked and self.reproduces(self._single[name], stream, new):
                return (name,)
        left = first_divergence(new, target)
        if left is None:
            return self._fewest_that_explain(stream, new)
        # Grouped by what the release's known rules leave unexplained: the first field in
        # which the new vLLM differs from the reference with those rules, not from ``old``.
        return ("unexplained", left.field)

    @functools.cached_property
    def active(self) -> list[str]:
        """The rule changes between the two releases, in the order of reference.releases."""
        return [n for n in self.candidates if (n in self.target.rules) != (n in self.base.rules)]

    def _fewest_that_explain(self, stream: Stream, new: dict) -> tuple[str, ...]:
        """The changes between the releases, all of which explain ``new``, less each one
        that the others still explain without: a set none of whose changes can be left out."""
        kept = list(self.active)
        start = self.base_with(set(kept))
        made = self._target_asked  # (stream, asked) of the last run traces() made
        if start.rules == self.target.rules and made is not None and made[0] is stream:
            asked = made[1]  # the release's run is this one
        else:
            _, asked = self.asking(start, stream)
        for name in self.active:
            rest = [n for n in kept if n != name]
            if not rest:
                continue
            if name not in asked:  # the run with ``kept`` is the run with ``rest``
                kept = rest
                continue
            trace, asked_rest = self.asking(self.base_with(set(rest)), stream, new)
            if gives(trace, new):
                kept, asked = rest, asked_rest
        return tuple(kept)

    def reproduces(self, engine: ReferenceEngine, stream: Stream, new: dict) -> bool:
        """Whether ``engine`` gives the trace ``new`` on ``stream`` (its run stops at the
        first step that differs)."""
        return gives(run(engine, stream, like=held_to(new, stream)), new)

    @staticmethod
    def asking(engine: ReferenceEngine, stream: Stream, new: dict | None = None
               ) -> tuple[Trace, frozenset[str]]:
        """The reference's trace of ``stream``, and the rule changes the run asked about;
        held to the trace ``new`` when given (the run stops where it leaves it, having asked
        about what it asked about up to there)."""
        rules = engine.rules
        engine.rules = noted = AskedRules(rules)
        try:
            trace = run(engine, stream, like=None if new is None else held_to(new, stream))
        finally:
            engine.rules = rules
        return trace, frozenset(noted.asked)


def held_to(trace: dict, stream: Stream) -> Trace:
    """A trace (as JSON) to hold a run to (:func:`harness.loop.runner.run`'s ``like``)."""
    return Trace(trace["engine"], trace["vllm_version"], stream, trace["steps"],
                 kv_cache=trace.get("kv_cache"))


def gives(run_trace: Trace, trace: dict) -> bool:
    """Whether a run (held to ``trace`` or not) gave ``trace``: it did not leave it, and
    it ended as ``trace`` ended."""
    return run_trace.verdict != UNLIKE and first_divergence(trace, run_trace.to_json()) is None


class AskedRules(frozenset):
    """A reference's rule changes that note each one a run asks about.

    The reference reads its rules only through ``Config.has`` (a membership test on
    this set), so a change never asked about in a run cannot have altered it: the
    run with that change turned over is the same run.  ``Config.rules`` is declared an
    abstract set, so the compiled reference's test calls ``__contains__`` below too.
    """

    def __new__(cls, rules):
        noted = super().__new__(cls, rules)
        noted.asked = set()
        return noted

    def __contains__(self, name) -> bool:
        self.asked.add(name)
        return frozenset.__contains__(self, name)


def _features(stream: Stream) -> list[str]:
    c = stream.config
    out = [f"policy {c.policy}", f"chunked prefill {'on' if c.enable_chunked_prefill else 'off'}",
           f"prefix caching {'on' if c.enable_prefix_caching else 'off'}"]
    if c.num_speculative_tokens:
        out.append(f"speculative ({c.speculative_method})")
    if c.long_prefill_token_threshold:
        out.append("long-prefill threshold")
    if any(r.eos_token_id is not None or r.stop_token_ids for r in stream.requests):
        out.append("EOS or stop tokens")
    return out


def attribute(causes: dict, key: tuple[str, ...], counted: bool = True) -> list[Cause]:
    """The causes a stream's explanation names: one per rule change in it (counted for a
    campaign stream, only listed for a bundled one)."""
    if key[0] == "unexplained":
        names = [key]
    else:
        names = [(name,) for name in key]
    found = []
    for k in names:
        cause = causes.setdefault(k, Cause(k))
        found.append(cause)
        if not counted:
            continue
        cause.count += 1
        if len(names) == 1:
            cause.alone += 1
        else:
            cause.together.update(n[0] for n in names if n != k)
    return found


# -- the parts of the check ------------------------------------------------------------

@dataclass
class BundledResult:
    name: str
    outcome: str
    cause: tuple[str, ...] | None = None
    detail: str = ""
    conforms: bool = True  # the reference with the release's rules gives the new trace


def check_bundled(checker: Checker, causes: dict, folder: Path = STREAMS_DIR) -> list[BundledResult]:
    """The streams of ``folder`` (the bundled ones unless told): each against ``old``'s
    recorded trace where there is one, else against the reference with ``old``'s rules."""
    results = []
    for path in sorted(folder.glob("*.json")):
        stream = load_stream(path)
        golden_path = golden_dir(checker.old) / path.name
        old = read_trace(golden_path) if golden_path.exists() else run(checker.base, stream).to_json()
        new = run(checker.vllm, stream).to_json()
        target = run(checker.target, stream).to_json()
        conforms = first_divergence(new, target) is None
        # A crash 0.11.0 also had (a quirk's stream), or one the release's rules state,
        # is behaviour to compare; any other crash means the adapter cannot follow.
        if (new["verdict"] == "engine_failure" and not conforms
                and first_divergence(new, old) is not None):
            results.append(BundledResult(stream.name, COULD_NOT_RUN,
                                         detail=new["failure"]["message"], conforms=conforms))
            continue
        d = first_divergence(new, old)
        if d is None:
            results.append(BundledResult(stream.name, SAME, conforms=conforms))
            continue
        key = checker.cause_of(stream, new, run(checker.base, stream).to_json(), target) \
            or ("unexplained", d.field)
        for cause in attribute(causes, key, counted=False):
            cause.bundled.append(stream.name)
            if not cause.explained:  # its suspect lines need an example, campaign or not
                cause.offer(stream.to_json(), len(new["steps"]), alone=True)
        detail = (f"step {d.step}, field `{d.field}`: {checker.old} `{json.dumps(d.right)}`, "
                  f"{checker.version} `{json.dumps(d.left)}`")
        ctx = side_by_side(_relabel(old, checker.old), _relabel(new, checker.version), d.step or 0)
        results.append(BundledResult(stream.name, DIFFERENT, key, detail + "\n\n```\n" + ctx + "\n```",
                                     conforms))
    return results


def _relabel(trace: dict, label: str) -> dict:
    return {**trace, "engine": f"vLLM {label}"}


@dataclass
class CampaignResult:
    examples: int
    seed: int
    same: int = 0
    different: int = 0
    conform: int = 0
    stats: Stats = field(default_factory=Stats)
    nonconforming: list[dict] = field(default_factory=list)
    seconds: float = 0.0


@dataclass
class Checked:
    """One generated stream's outcome, as the chunk that drew it hands it back."""

    data: dict[str, Any]
    counts: dict[str, int]  # its Stats counters (harness.formats.rule_counters)
    conforms: bool  # the reference with the release's rules gives the new trace
    key: tuple[str, ...] | None  # None: same as the old release; else its explanation
    steps: int
    features: list[str]


def check_chunk(checker: Checker, chunk: Chunk) -> list[Checked]:
    """The streams of one chunk of the campaign (harness.jobs.chunks: what it draws depends on
    the campaign's seed and the chunk's index alone), each checked."""
    profiles.pin_local_constants()  # else a side environment's vLLM would feed the draws
    checked: list[Checked] = []

    @fixed_seed(chunk.seed)
    @settings(max_examples=chunk.examples, database=None, deadline=None, derandomize=False,
              suppress_health_check=list(HealthCheck), phases=[Phase.generate])
    @given(by_name("whole_space").strategy())
    def each(data):
        stream = parse_stream(data)
        new, old, target = checker.traces(stream)
        stats = Stats()
        stats.add(new)
        checked.append(Checked(data, stats.counts, first_divergence(new, target) is None,
                               checker.cause_of(stream, new, old, target), len(new["steps"]),
                               _features(stream)))

    each()
    return checked


def campaign(checker: Checker, causes: dict, examples: int, seed: int,
             workers: int = 1) -> CampaignResult:
    """``examples`` streams of the whole space from ``seed``, in chunks of
    ``harness.jobs.chunks.CHUNK_STREAMS``: the same streams and the same report whether one
    process checks them or ``workers`` processes forked from this one."""
    result = CampaignResult(examples, seed)
    started = time.monotonic()
    chunks = chunks_of(examples, seed)
    for i, checked in enumerate(_checked_in_order(checker, chunks, workers), 1):
        for c in checked:
            _account(result, causes, c)
        if i % max(len(chunks) // 10, 1) == 0 or i == len(chunks):
            n = result.same + result.different
            print(f"  {n}/{examples} streams, {result.different} different from {checker.old}, "
                  f"{n - result.conform} not conforming to the {checker.target.release} rules",
                  file=sys.stderr, flush=True)
    result.seconds = time.monotonic() - started
    return result


def _account(result: CampaignResult, causes: dict, c: Checked) -> None:
    for k, v in c.counts.items():
        result.stats.counts[k] += v
    if c.conforms:
        result.conform += 1
    elif len(result.nonconforming) < 5:
        result.nonconforming.append(c.data)
    if c.key is None:
        result.same += 1
        return
    result.different += 1
    alone = len(c.key) == 1 or c.key[0] == "unexplained"
    for cause in attribute(causes, c.key):
        cause.features.update(c.features)
        if alone or cause.alone == 0:
            cause.offer(c.data, c.steps, alone=alone)


_FORKED_CHECKER: Checker | None = None


def _check_forked(chunk: Chunk) -> list[Checked]:
    return check_chunk(_FORKED_CHECKER, chunk)


def _checked_in_order(checker: Checker, chunks: list[Chunk], workers: int):
    """Each chunk's outcomes, in chunk order, from this process or from forked workers
    (vLLM is imported and the engines built before the fork, as in harness.jobs.workers)."""
    if workers <= 1 or len(chunks) <= 1:
        for chunk in chunks:
            yield check_chunk(checker, chunk)
        return
    global _FORKED_CHECKER
    _FORKED_CHECKER = checker
    with multiprocessing.get_context("fork").Pool(min(workers, len(chunks))) as pool:
        yield from pool.imap(_check_forked, chunks)


def shrink(checker: Checker, cause: Cause, seconds: float = 60) -> None:
    """Make the cause's smallest example smaller while it still shows that cause, and no other.

    Greedy and deterministic (delta debugging on the stream): drop whole
    requests, then shorten prompts and outputs, then reset optional fields and
    arrival steps, repeating until nothing more goes or ``seconds`` have passed.
    """
    if cause.example is None:
        return
    started = time.monotonic()
    single = checker._single.get(cause.key[0]) if cause.explained else None

    def shows(data) -> bool:
        try:
            stream = parse_stream(data)
        except Exception:  # a cut that breaks a rule of the stream format
            return False
        new = run(checker.vllm, stream).to_json()
        old = run(checker.base, stream).to_json()
        if first_divergence(new, old) is None:
            return False
        if cause.example_alone and single is not None:  # this change alone explains it
            return first_divergence(new, run(single, stream).to_json()) is None
        key = checker.cause_of(stream, new, old, run(checker.target, stream).to_json())
        return key is not None and (cause.key == key if not cause.explained else cause.key[0] in key)

    best = json.loads(json.dumps(cause.example))
    changed = True
    while changed and time.monotonic() - started < seconds:
        changed = False
        for candidate in _smaller(best):
            if time.monotonic() - started > seconds:
                break
            if shows(candidate):
                best, changed = candidate, True
                break
    if best != cause.example:
        cause.example, cause.shrunk = best, True
        cause.example_size = (len(best["requests"]), len(run(checker.vllm, parse_stream(best)).steps))


def shrink_all(checker: Checker, causes: dict, seconds: float, workers: int = 1) -> None:
    """Shrink every cause's example (:func:`shrink`), ``workers`` causes at a time in
    processes forked from this one; each example comes back to its cause."""
    todo = [c for c in causes.values() if c.example is not None]
    print(f"== shrinking the examples of {len(todo)} cause(s), up to {seconds:g} s each, "
          f"{min(max(workers, 1), max(len(todo), 1))} at a time", file=sys.stderr)
    if workers <= 1 or len(todo) <= 1:
        for cause in todo:
            shrink(checker, cause, seconds=seconds)
        return
    global _FORKED_CHECKER, _FORKED_CAUSES
    _FORKED_CHECKER, _FORKED_CAUSES = checker, causes
    with multiprocessing.get_context("fork").Pool(min(workers, len(todo))) as pool:
        for key, example, shrunk, size in pool.imap_unordered(
                _shrink_forked, [(c.key, seconds) for c in todo]):
            cause = causes[key]
            cause.example, cause.shrunk, cause.example_size = example, shrunk, size


_FORKED_CAUSES: dict = {}


def _shrink_forked(job: tuple[tuple[str, ...], float]):
    key, seconds = job
    cause = _FORKED_CAUSES[key]
    shrink(_FORKED_CHECKER, cause, seconds=seconds)
    return key, cause.example, cause.shrunk, cause.example_size


_OPTIONAL_DEFAULTS = {"drafts": [], "abort_step": None, "cache_salt": None, "prompt_logprobs": None,
                      "stop_token_ids": [], "priority": 0, "ignore_eos": False}


def _smaller(data: dict[str, Any]):
    """Candidate streams one step smaller than ``data``, biggest cuts first."""
    reqs = data["requests"]
    for i in range(len(reqs)):
        if len(reqs) > 1:
            yield {**data, "requests": reqs[:i] + reqs[i + 1:]}
    for i, r in enumerate(reqs):
        for key in ("prompt", "output"):
            for keep in (len(r[key]) // 2, len(r[key]) - 1):
                if 1 <= keep < len(r[key]):
                    yield _with_request(data, i, {**r, key: r[key][:keep]})
        for key, default in _OPTIONAL_DEFAULTS.items():
            if key in r and r[key] != default:
                yield _with_request(data, i, {**r, key: default})
        if r.get("arrival_step", 0) > 0:
            yield _with_request(data, i, {**r, "arrival_step": r["arrival_step"] - 1})


def _with_request(data: dict[str, Any], i: int, new: dict[str, Any]) -> dict[str, Any]:
    reqs = list(data["requests"])
    reqs[i] = new
    return {**data, "requests": reqs}


# -- the report ---------------------------------------------------------------------------

def find_suspects(checker: Checker, causes: dict, bundled: list[BundledResult],
                  folder: Path, camp: CampaignResult | None = None) -> Inexact | None:
    """For each unexplained cause with an example: the hunks of vLLM's diff behind it
    (:mod:`harness.jobs.suspects`), the example's near misses and the streams that behaved
    as before serving as the passing runs.  And when the reference with the release's
    rules is not exact on some stream: the hunks behind that, the streams where it is
    exact serving as the passing runs (returned)."""
    unchanged = [load_stream(folder / f"{b.name}.json") for b in bundled if b.outcome == SAME]
    for cause in causes.values():
        if cause.explained or cause.example is None:
            continue
        print(f"== suspect lines of {cause.title()}", file=sys.stderr)

        def fails(stream, new, old, target, key=cause.key):
            if first_divergence(new, old) is None:
                return False
            return True if checker.cause_of(stream, new, old, target) == key else None

        near_failing, near_passing = neighbours(checker, cause.example, fails)
        failing = [parse_stream(cause.example), *near_failing] + [
            load_stream(folder / f"{name}.json") for name in cause.bundled]
        cause.suspects, cause.suspects_error = _ranked(failing, near_passing, unchanged,
                                                       checker.old)
    return _inexact_suspects(checker, bundled, folder, camp)


def _ranked(failing: list[Stream], near: list[Stream], passing: list[Stream],
            old: str) -> tuple[list, str]:
    """:func:`harness.jobs.suspects.suspects`, and what stopped it ("" when nothing did:
    no environment for the old release, say)."""
    try:
        return suspects.suspects(failing, near, passing, old), ""
    except (RuntimeError, OSError) as exc:
        return [], str(exc)


@dataclass
class Inexact:
    """Streams on which the reference with the release's rules is not exact, and the
    hunks of vLLM's diff behind that: a change the records miss even where the new
    release behaves as the old one (two changes that cancel out on a stream)."""

    streams: list[str]
    example: dict[str, Any]
    suspects: list = field(default_factory=list)
    error: str = ""


def _inexact_suspects(checker: Checker, bundled: list[BundledResult], folder: Path,
                      camp: CampaignResult | None) -> Inexact | None:
    off = [load_stream(folder / f"{b.name}.json") for b in bundled if not b.conforms]
    off += [parse_stream(d) for d in (camp.nonconforming if camp else [])]
    if not off:
        return None
    off.sort(key=lambda s: (len(s.requests), sum(len(r.prompt) + len(r.output)
                                                  for r in s.requests), s.name))
    print(f"== suspect lines of the reference not exact ({len(off)} stream(s))", file=sys.stderr)
    exact_ones = [load_stream(folder / f"{b.name}.json") for b in bundled if b.conforms]

    def fails(stream, new, old, target):
        return first_divergence(new, target) is not None

    near_failing, near_passing = neighbours(checker, off[0].to_json(), fails)
    found, error = _ranked([off[0], *near_failing, *off[1:]], near_passing, exact_ones,
                           checker.old)
    return Inexact([s.name for s in off], off[0].to_json(), found, error)


def neighbours(checker: Checker, example: dict[str, Any], fails) -> tuple[list[Stream], list[Stream]]:
    """The streams one cut away from ``example`` (:func:`_smaller`): those that still fail
    as it does, and those that pass.  ``fails(stream, new, old, target)`` says which (True,
    False, or None for neither).  The near misses are the passing runs that tell the most:
    they run what the example runs but the rule that changed."""
    showing, passing = [], []
    for candidate in _smaller(example):
        try:
            stream = parse_stream(candidate)
        except Exception:  # a cut that breaks a rule of the stream format
            continue
        verdict = fails(stream, *checker.traces(stream))
        if verdict is not None:
            (showing if verdict else passing).append(stream)
    return showing, passing


def save_candidate(out: Path, report_name: str, label: str, example: dict[str, Any],
                   found: list) -> None:
    """Beside the report: an example no named change explains (a bundled-stream candidate
    for the rule change that will name it), ``<report>.<label>.json``, and its whole
    ranking of suspect hunks, ``<report>.<label>.suspects.json``."""
    stem = f"{report_name.removesuffix('.md')}.{label}"
    write_atomic(out / f"{stem}.json", canonical_json(example) + "\n")
    write_atomic(out / f"{stem}.suspects.json",
                 json.dumps([s.to_json() for s in found], indent=1) + "\n")


def report_text(version: str, checker: Checker, bundled: list[BundledResult],
                camp: CampaignResult, causes: dict, folder: Path = STREAMS_DIR,
                inexact: Inexact | None = None) -> str:
    different = [b for b in bundled if b.outcome == DIFFERENT]
    unexplained = [c for c in causes.values() if not c.explained]
    target = checker.target.release
    old = checker.old
    from_arg = "" if old == BASE else f"FROM={old} "
    kind = "bundled" if folder == STREAMS_DIR else "your"
    conform_bundled = sum(b.conforms for b in bundled)
    lines = [
        f"# vLLM {version} against vLLM {old}'s rules",
        "",
        f"Checked {datetime.date.today().isoformat()} with "
        + (f"`make upgrade-check {from_arg}VLLM={version}` " if kind == "bundled" else
           f"`python -m harness upgrade-check {version} {folder.name}/ --from {old}` ")
        + f"(vLLM {version} from a wheel overlay on the base torch; see `harness/jobs/side_env.py`)"
        + (f", with the rule change `{checker.forget}` left out of the reference as if it were "
           f"new (`--forget {checker.forget}`)." if checker.forget else "."),
        "",
        "## Verdict",
        "",
        f"* **{'SAME' if not causes else 'DIFFERENT'}**: "
        + (f"{len(causes)} cause(s) of divergence from {old}"
           + (f", {len(unexplained)} of them not explained by a named rule change" if unexplained
              else ", every one a named rule change of `reference/releases.py`")
           if causes else "no stream behaves differently from 0.11.0") + ".",
        f"* {kind.capitalize()} streams: {sum(b.outcome == SAME for b in bundled)} same, "
        f"{len(different)} different, {sum(b.outcome == COULD_NOT_RUN for b in bundled)} could not run.",
        (f"* Campaign (seed {camp.seed}): {camp.same + camp.different} streams, {camp.different} "
         f"different from {old} ({camp.seconds:.0f} s)." if camp.examples else
         f"* No generated streams: the streams of `{folder.name}/` only."),
        f"* The reference with the rules of {target} conforms on "
        + (f"{camp.conform}/{camp.same + camp.different} generated and " if camp.examples else "")
        + f"{conform_bundled}/{len(bundled)} {kind} streams"
        + (" (exact)." if exact(bundled, camp) else "."),
        "",
        "## Causes",
        "",
    ]
    if not causes:
        lines += ["None.", ""]
    for cause in sorted(causes.values(), key=lambda c: (-c.count, c.key)):
        lines += [f"### {cause.title()}", ""]
        for name in cause.key if cause.explained else ():
            ch = releases.change(name)
            pr = f"vLLM PR {ch.pr}" if ch.pr else "PR not identified"
            lines += [f"* `{name}` (since {ch.since}"
                      + (f", until {ch.until}" if ch.until else "") + f"; {pr}): {ch.summary}"]
        together = ", ".join(f"`{n}` ({k})" for n, k in cause.together.most_common())
        seen = (f"* Seen on {cause.count} of {camp.same + camp.different} generated streams: "
                f"{cause.alone} explained by it alone"
                + (f", the others together with {together}" if together else "")
                + (f"; and on {kind} streams: {', '.join(cause.bundled)}" if cause.bundled else "")
                + ".")
        if not camp.examples:
            seen = f"* Seen on {kind} streams: {', '.join(cause.bundled)}."
        lines += [seen]
        if cause.features:
            top = ", ".join(f"{k} ({v})" for k, v in cause.features.most_common(6))
            lines += [f"* Config features of those streams: {top}."]
        if cause.example is not None:
            ex_stream = parse_stream(cause.example)
            new_trace, old_trace, _ = checker.traces(ex_stream)
            d = first_divergence(new_trace, old_trace)
            what = "it alone explains" if cause.example_alone else "it shows with another change"
            lines += ["", f"{'Shrunk' if cause.shrunk else 'Smallest seen'} example, a stream {what} "
                      f"({cause.example_size[0]} request(s), {cause.example_size[1]} steps):", "",
                      "```json", json.dumps(ex_stream.to_json(), sort_keys=True), "```", ""]
            if d is not None and d.step is not None:
                lines += [f"First difference: step {d.step}, field `{d.field}`.", "", "```",
                          side_by_side(_relabel(old_trace, old), _relabel(new_trace, version), d.step),
                          "```"]
        if not cause.explained and cause.example is not None:
            lines += ["", "#### Suspect lines", "",
                      f"The diff of vLLM {old} to {version} (their wheels' `vllm/` trees), cut to "
                      "the hunks the example ran, ranked (`harness/jobs/suspects.py`).", ""]
            lines += ([f"Not found: {cause.suspects_error}"] if cause.suspects_error
                      else suspects.markdown(cause.suspects))
            lines += ["", "A rule change to start from (the example is saved beside this report "
                      "as a bundled-stream candidate):", "", "```python",
                      suspects.stub(version, cause.key[1], cause.suspects), "```"]
        lines.append("")
    if inexact is not None:
        lines += ["## Where the reference is not exact", "",
                  f"The reference with the rules of {target} differs from vLLM {version} on "
                  f"{len(inexact.streams)} stream(s) ({', '.join(inexact.streams[:5])}"
                  + (", ..." if len(inexact.streams) > 5 else "") + "): a rule change the "
                  "records miss, even where it leaves a stream as it was in "
                  f"{old}.  Suspect lines of the smallest:", ""]
        lines += ([f"Not found: {inexact.error}"] if inexact.error
                  else suspects.markdown(inexact.suspects))
        lines += [""]
    lines += [f"## {kind.capitalize()} streams", "",
              f"| stream | vs {old} | cause | reference ({target} rules) |", "|---|---|---|---|"]
    for b in bundled:
        cause = " + ".join(b.cause) if b.cause else ""
        lines.append(f"| {b.name} | {b.outcome} | {cause} | {'equal' if b.conforms else 'DIFFERENT'} |")
    for b in bundled:
        if b.outcome != SAME:
            lines += ["", f"### {b.name}: {b.outcome}", "", b.detail]
    lines += ["", "## Campaign", "", f"`python -m harness upgrade-check {version} --examples "
              f"{camp.examples} --seed {camp.seed}`; rules reached (on vLLM {version}):", "",
              "```", camp.stats.summary(), "```", ""]
    if camp.nonconforming:
        lines += ["Streams where the reference with the release's rules differs (first 5):", ""]
        lines += ["```json\n" + json.dumps(d, sort_keys=True) + "\n```" for d in camp.nonconforming]
    return "\n".join(lines).rstrip() + "\n"


def exact(bundled: list[BundledResult], camp: CampaignResult) -> bool:
    """The reference with the release's rules gave the new vLLM's trace on every stream."""
    return camp.conform == camp.same + camp.different and all(b.conforms for b in bundled)


def verdict(version: str, checker: Checker, bundled: list[BundledResult], camp: CampaignResult,
            causes: dict) -> tuple[int, str]:
    """(exit code, one line) under ``--fail-on unexplained``: 0 when nothing differs or
    every cause is a named rule change, the reference with the release's rules exact and
    every stream run; else 1, the line naming what is left unexplained."""
    unexplained = [c.title().removeprefix("unexplained: ") for c in causes.values()
                   if not c.explained]
    failed = [b.name for b in bundled if b.outcome == COULD_NOT_RUN]
    target = checker.target.release
    problems = ([f"{len(unexplained)} unexplained ({'; '.join(sorted(unexplained))})"]
                if unexplained else []) \
        + ([] if exact(bundled, camp) else [f"the reference with {target}'s rules not exact"]) \
        + ([f"{len(failed)} stream(s) could not run ({', '.join(failed[:3])}"
            + (", ...)" if len(failed) > 3 else ")")] if failed else [])
    found = (f"{len(causes)} cause(s) of divergence" if causes else "no divergence") \
        + ("" if problems or not causes else ", every one a named rule change")
    line = f"verdict: vLLM {version} against {checker.old}: {found}"
    if problems:
        return 1, f"{line}; {'; '.join(problems)}: fails --fail-on unexplained"
    return 0, f"{line}; the reference with {target}'s rules exact: passes --fail-on unexplained"


@contextlib.contextmanager
def _slots_checked_by_vllms_kernel():
    """Where the release maps slots with a Triton kernel, the bundled streams also run it,
    under Triton's interpreter, and stop at any slot it maps otherwise than the harness's
    rule (``vllm_compat.slot_mapping``); the campaign uses the rule alone."""
    saved = os.environ.get("HARNESS_SLOT_KERNEL")
    os.environ["HARNESS_SLOT_KERNEL"] = "verify"
    try:
        yield
    finally:
        if saved is None:
            del os.environ["HARNESS_SLOT_KERNEL"]
        else:
            os.environ["HARNESS_SLOT_KERNEL"] = saved


def report(version: str, examples: int, seed: int, out: Path | None, record: bool,
           old: str = BASE, streams: Path | None = None, shrink_seconds: float = 20,
           workers: int = 1, fail_on: str = "different", forget: str | None = None) -> int:
    """The check inside the new release's process: 0 same, 1 different, 3 could not drive;
    with ``fail_on="unexplained"``, 1 only when ``verdict`` finds something unexplained.

    ``old``: the release upgraded from.  ``streams``: a folder of the user's own streams,
    checked instead of the bundled ones and without a campaign; the report then goes to
    ``out`` when given, else to standard output.  ``workers``: processes checking the
    campaign's chunks (the report does not depend on it).
    """
    installed = installed_vllm_version()
    if installed is None or installed.split("+")[0] != version:
        raise EngineUnavailable(f"vLLM {version} is not the one on the import path ({installed})")
    checker = Checker(version, old, forget)  # imports vLLM: EngineUnavailable names what is missing
    causes: dict[tuple[str, ...], Cause] = {}
    folder = STREAMS_DIR if streams is None else streams
    print(f"== streams of {folder}: vLLM {version} against vLLM {old}", file=sys.stderr)
    with _slots_checked_by_vllms_kernel():
        bundled = check_bundled(checker, causes, folder)
    if streams is not None:
        examples = 0
    print(f"== campaign: {examples} streams, seed {seed}, {workers} worker(s)", file=sys.stderr)
    camp = campaign(checker, causes, examples, seed, workers) if examples \
        else CampaignResult(0, seed)
    shrink_all(checker, causes, shrink_seconds, workers)
    inexact = find_suspects(checker, causes, bundled, folder, camp)
    if record:
        from harness.checks.golden import record as record_traces
        bundled_streams = [load_stream(p) for p in sorted(STREAMS_DIR.glob("*.json"))]
        record_traces(bundled_streams, golden_dir(version))
    name = f"{version}.md" if old == BASE and streams is None else f"{old}-to-{version}.md"
    if forget:
        name = f"without-{forget}-{old}-to-{version}.md"  # ends as the check expects
    text = report_text(version, checker, bundled, camp, causes, folder, inexact)
    if out is None:
        sys.stdout.write(text)
    else:
        for cause in causes.values():
            if not cause.explained and cause.example is not None:
                save_candidate(out, name, cause.key[1], cause.example, cause.suspects)
        if inexact is not None:
            save_candidate(out, name, "not-exact", inexact.example, inexact.suspects)
        write_atomic(out / name, text)
        print(f"report: {out / name}")
    for cause in sorted(causes.values(), key=lambda c: -c.count):
        print(f"cause: {cause.title()} ({cause.count} streams)")
    if fail_on == "unexplained":
        code, line = verdict(version, checker, bundled, camp, causes)
        print(line)
        return code
    return 1 if causes else 0
