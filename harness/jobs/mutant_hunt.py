"""Hunting mutants: is each mutant killed by the ci profile and by the main job?

``python -m harness mutants`` (``make mutants``) gives two kill tables:

* **ci profile** -- what ``pytest -k conformance`` runs under the ci profile:
  the streams of every conformance property (exactly those the tests
  generate, ``harness.checks.properties.given_property``), the bundled streams, the
  KV sizing check and the replay of every release's recorded traces;
* **main job** -- what ``make conformance`` runs: the campaign's streams
  (``harness.jobs.chunks.given_campaign``, seed 0), the bundled streams, the KV
  sizing check and the same replay.

For each generated stream vLLM runs once, unpatched; a reference mutant kills
the stream when the reference under the mutant gives a different trace from
vLLM's (a stream on which the unpatched reference already differs would be a
conformance failure: it is reported and counted for no mutant).  A vLLM
mutant runs patched vLLM against the unpatched reference, until its first
kill.  The stream sets are split over worker processes, one vLLM each.

:func:`hunt` is the older single-mutant search, with shrinking: the fast
mutant tests and ``--reports`` use it.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from typing import Any

from hypothesis import HealthCheck, Phase, given, settings

from harness.checks.conformance import Divergent, assert_conforms
from harness.checks.rule_watch import Watch
from harness.engines import get_engine
from harness.checks.mutants import catalogue
from harness.formats.mutant import Mutant
from harness.checks.properties import PROPERTIES
from harness.jobs.rule_report import BASE_RELEASE, Rule
from harness.loop.runner import run
from harness.formats.stream import parse_drawn_stream, parse_stream
from harness.formats.text import markdown_table


@dataclass
class Result:
    mutant: Mutant
    killed: bool
    examples: int  # streams generated before the first divergence
    shrunk_requests: int | None
    shrunk_steps: int | None
    by: str  # which property killed it
    seconds: float
    report: str = ""  # the divergence report on the shrunk stream


def hunt(mutant: Mutant, max_examples: int = 200, budget: float | None = None,
         shrink: bool = True) -> Result:
    """Run the conformance properties against one mutant until one of them fails.

    Without ``shrink`` the first failing stream is reported as found (faster).
    """
    if mutant.release:
        return _hunt_on_recorded(mutant, mutant.release)
    vllm, ref = get_engine("vllm"), get_engine("reference")
    started = time.monotonic()
    seen = 0
    for prop in PROPERTIES:
        if budget is not None and time.monotonic() - started > budget:
            break
        first_failure: list[int] = []
        last_failing: list[dict] = []
        last_report: list[str] = []

        phases = [Phase.explicit, Phase.generate] + ([Phase.shrink] if shrink else [])

        @settings(max_examples=max_examples, deadline=None, database=None, derandomize=True,
                  suppress_health_check=list(HealthCheck), print_blob=False, phases=phases)
        @given(prop.strategy())
        def check(data):
            nonlocal seen
            seen += 1
            try:
                with mutant.patch():
                    assert_conforms(parse_drawn_stream(data), label=f"mutant-{mutant.name}",
                                    reference=ref, vllm=vllm,
                                    replay_env=f"HARNESS_MUTANT={mutant.name}")
            except Divergent as exc:
                if not first_failure:
                    first_failure.append(seen)
                last_failing[:] = [data]
                last_report[:] = [str(exc)]
                raise

        try:
            check()
        except Divergent:
            data = last_failing[0]
            with mutant.patch():
                steps = len(run(vllm, parse_stream(data)).steps)
            return Result(mutant, True, first_failure[0], len(data["requests"]), steps, prop.name,
                          time.monotonic() - started, last_report[0])
    return _hunt_on_bundled(mutant, vllm, ref, seen, started)


def _hunt_on_bundled(mutant: Mutant, vllm, ref, seen: int, started: float) -> Result:
    """The bundled streams are part of the suite too (test_conformance_bundled_stream)."""
    from harness.checks.conformance import compare
    from harness.formats.paths import STREAMS_DIR
    from harness.formats.stream import load_stream
    for path in sorted(STREAMS_DIR.glob("*.json")):
        stream = load_stream(path)
        seen += 1
        with mutant.patch():
            c = compare(stream, reference=ref, vllm=vllm)
        if not c.equal:
            from harness.checks.diff import report
            text = report(c.vllm, c.reference, c.divergence) if c.divergence else ""
            return Result(mutant, True, seen, len(stream.requests), len(c.vllm["steps"]),
                          f"bundled {stream.name}", time.monotonic() - started, text)
    return Result(mutant, False, seen, None, None, "-", time.monotonic() - started)


def _hunt_on_recorded(mutant: Mutant, release: str) -> Result:
    """A later release's rule change: killed when a recorded trace of that release no
    longer replays (the reference with that release's rules, minus the change)."""
    from harness.checks.golden import replay_one
    from harness.formats.paths import golden_dir
    started = time.monotonic()
    paths = sorted(golden_dir(release).glob("*.json"))
    for i, path in enumerate(paths, 1):
        with mutant.patch():
            d, golden, mine = replay_one(path)
        if d is not None:
            from harness.checks.diff import report
            return Result(mutant, True, i, len(golden["stream"]["requests"]), len(golden["steps"]),
                          f"replay {release}/{path.stem}", time.monotonic() - started,
                          report(golden, mine, d))
    return Result(mutant, False, len(paths), None, None, "-", time.monotonic() - started)


def _kills_in_set(set_name: str, profile: str, names: list[str]) -> dict[str, Any]:
    """One stream set's kills: for each mutant, the streams that kill it (indices, 1-based)."""
    from harness.checks import profiles
    from harness.jobs.campaign import MAIN_JOB_EXAMPLES, MAIN_JOB_SEED
    from harness.jobs.chunks import given_campaign
    from harness.checks.diff import first_divergence
    from harness.checks.properties import by_name, given_property
    profiles.load(profile)
    chosen = [m for m in catalogue() if m.name in names]
    vllm, ref = get_engine("vllm"), get_engine("reference")
    streams: list[dict] = []

    def collect(data: dict) -> None:
        streams.append(data)

    if set_name == MAIN_JOB:
        given_campaign(collect, MAIN_JOB_EXAMPLES, MAIN_JOB_SEED)()
    else:
        given_property(by_name(set_name), collect)()
    kills: dict[str, list[int]] = {m.name: [] for m in chosen}
    diverged: list[int] = []
    # The reference runs with its mutants' sites watched: a mutant whose rule the run
    # did not decide gives the reference's own trace, which is vLLM's (harness.checks.rule_watch).
    watch = Watch([Rule(m, BASE_RELEASE) for m in chosen if m.side == "reference"])
    for i, data in enumerate(streams, 1):
        stream = parse_drawn_stream(data)
        theirs = run(vllm, stream).to_json()
        trace, decided = watch.decided_during(lambda: run(ref, stream))
        mine = trace.to_json()
        if first_divergence(theirs, mine) is not None:
            diverged.append(i)
            continue
        for m in chosen:
            if m.side == "vllm":
                if kills[m.name]:
                    continue  # one kill is enough: each vLLM run costs more
                with m.patch():
                    patched = run(vllm, stream).to_json()
                if first_divergence(patched, mine) is not None:
                    kills[m.name].append(i)
                continue
            if (m.applies is not None and not m.applies(stream)) or m.name not in decided:
                continue
            with m.patch():
                mutated = run(ref, stream).to_json()
            if first_divergence(theirs, mutated) is not None:
                kills[m.name].append(i)
    return {"set": set_name, "streams": len(streams), "kills": kills, "diverged": diverged}


MAIN_JOB = "main job"


@dataclass
class KillRow:
    mutant: Mutant
    ci_streams: list[str]  # killing streams of the ci profile: "<property> #<index>"
    ci_total: int
    main_streams: list[str]  # killing streams of the main job's campaign: "#<index>"
    main_total: int
    bundled: str = ""  # the first bundled stream that kills it
    other: str = ""  # the KV sizing check or a recorded trace that kills it

    @property
    def killed_ci(self) -> bool:
        return bool(self.ci_streams or self.bundled or self.other)

    @property
    def killed_main(self) -> bool:
        return bool(self.main_streams or self.bundled or self.other)


def kill_rows(mutants: list[Mutant], profile: str = "ci", workers: int | None = None,
              progress=None) -> tuple[list[KillRow], list[str]]:
    """Every mutant against the ci profile's and the main job's checks; also the lines
    of any stream on which the unpatched reference already diverges."""
    import concurrent.futures
    import multiprocessing
    import os

    hunted = [m for m in mutants if not m.equivalent]
    on_streams = [m.name for m in hunted if m.checked_by == "streams" and not m.release]
    # The sets with the most streams first, so that no worker is left with a long one at
    # the end while the others idle (async_scheduling and priority_victim_drafts have three
    # times a property's streams).
    sets = [p.name for p in sorted(PROPERTIES, key=lambda p: -p.scale)] + [MAIN_JOB]
    results: dict[str, dict] = {}
    workers = max(1, min(workers or os.cpu_count() or 1, len(sets)))
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(workers, mp_context=context) as pool:
        futures = {pool.submit(_kills_in_set, name, profile, on_streams): name for name in sets}
        for f in concurrent.futures.as_completed(futures):
            results[futures[f]] = f.result()
            if progress:
                progress(f"{futures[f]}: {results[futures[f]]['streams']} streams checked")
    problems = [f"{name}: stream {i} diverges without any mutant (a conformance failure)"
                for name, r in results.items() for i in r["diverged"]]
    ci_sets = [p.name for p in PROPERTIES]
    ci_total = sum(results[n]["streams"] for n in ci_sets)
    rows = []
    for m in hunted:
        ci = [f"{n} #{i}" for n in ci_sets for i in results[n]["kills"].get(m.name, [])]
        main = [f"#{i}" for i in results[MAIN_JOB]["kills"].get(m.name, [])]
        row = KillRow(m, ci, ci_total, main, results[MAIN_JOB]["streams"])
        if m.release:
            row.other = _replay_kill(m, m.release)
        elif m.checked_by == "kv sizing":
            row.other = _kv_sizing_kill(m)
        else:
            row.bundled = _first_bundled_kill(m)
        rows.append(row)
    return rows, problems


def _first_bundled_kill(m: Mutant) -> str:
    r = _hunt_on_bundled(m, get_engine("vllm"), get_engine("reference"), 0, time.monotonic())
    return r.by.removeprefix("bundled ") if r.killed else ""


def _kv_sizing_kill(m: Mutant) -> str:
    from harness.checks.kv_sizing import differences
    with m.patch():
        found = differences()
    # The model and the field only: a field can hold a whole group layout.
    return f"KV sizing: {found[0].model}: {found[0].field}" if found else ""


def _replay_kill(m: Mutant, release: str) -> str:
    r = _hunt_on_recorded(m, release)
    return r.by if r.killed else ""


def _killed(streams: list[str], total: int, vllm_side: bool) -> str:
    if not streams:
        return "none"
    if vllm_side:  # the hunt stops at the first kill of each stream set
        return f"yes (first: {streams[0]})"
    return f"{len(streams)}/{total} (first: {streams[0]})"


def kill_table(rows: list[KillRow]) -> str:
    head = ("mutant", "side", "ci profile: streams killing", "main job: streams killing",
            "bundled / other check", "killed (ci, main job)")
    lines = [head]
    for r in rows:
        m = r.mutant
        other = r.bundled and f"bundled {r.bundled}" or r.other or "-"
        if m.release:
            ci = main = "not run: vLLM 0.11.0 is installed"
        elif m.checked_by == "kv sizing":
            ci = main = "not a stream rule"
        else:
            ci = _killed(r.ci_streams, r.ci_total, m.side == "vllm")
            main = _killed(r.main_streams, r.main_total, m.side == "vllm")
        verdict = ", ".join("yes" if k else "NO" for k in (r.killed_ci, r.killed_main))
        lines.append((m.name, m.side, ci, main, other, verdict))
    return markdown_table(lines)


def main(budget: float | None = None, names: list[str] | None = None,
         show_reports: bool = False) -> int:
    mutants = [m for m in catalogue() if not names or m.name in names]
    if names and len(mutants) != len(set(names)):
        known = {m.name for m in catalogue()}
        print(f"error: unknown mutant(s): {', '.join(sorted(set(names) - known))}", file=sys.stderr)
        return 2
    get_engine("vllm")  # an undrivable vLLM stops here, in one line
    rows, problems = kill_rows(mutants, progress=lambda line: print(line, file=sys.stderr))
    print(kill_table(rows))
    for line in problems:
        print(line)
    if show_reports:
        for r in rows:
            if r.mutant.checked_by == "streams" and not r.mutant.release:
                found = hunt(r.mutant, budget=budget)
                if found.report:
                    print(f"\n### {r.mutant.name} (shrunk, by {found.by})\n\n{found.report}")
    survivors = [r.mutant.name for r in rows if not (r.killed_ci and r.killed_main)]
    print(f"\n{len(rows) - len(survivors)}/{len(rows)} mutants killed under both the ci profile "
          f"and the main job" + (f"; survivors: {', '.join(survivors)}" if survivors else ""))
    for m in mutants:
        if m.equivalent:
            print(f"equivalent (cannot be killed): {m.name}: {m.equivalent}")
    return 1 if survivors or problems else 0
