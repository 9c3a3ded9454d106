"""Hunting mutants: run the conformance properties against each until one fails.

``python -m harness mutants`` reports, for each mutant, whether it was killed,
after how many generated streams, by which property, and the size of the
shrunk counterexample.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass

from hypothesis import HealthCheck, Phase, given, settings

from harness.conformance import Divergent, assert_conforms
from harness.engines import get_engine
from harness.mutants import catalogue
from harness.patches import Mutant
from harness.properties import PROPERTIES
from harness.runner import run
from harness.stream import parse_stream


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
    if mutant.side.startswith("release "):
        return _hunt_on_recorded(mutant, mutant.side.split()[1])
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
                    assert_conforms(data, label=f"mutant-{mutant.name}", reference=ref, vllm=vllm,
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
    from harness.conformance import compare
    from harness.paths import STREAMS_DIR
    from harness.stream import load_stream
    for path in sorted(STREAMS_DIR.glob("*.json")):
        stream = load_stream(path)
        seen += 1
        with mutant.patch():
            c = compare(stream, reference=ref, vllm=vllm)
        if not c.equal:
            from harness.diff import report
            text = report(c.vllm, c.reference, c.divergence) if c.divergence else ""
            return Result(mutant, True, seen, len(stream.requests), len(c.vllm["steps"]),
                          f"bundled {stream.name}", time.monotonic() - started, text)
    return Result(mutant, False, seen, None, None, "-", time.monotonic() - started)


def _hunt_on_recorded(mutant: Mutant, release: str) -> Result:
    """A later release's rule change: killed when a recorded trace of that release no
    longer replays (the reference with that release's rules, minus the change)."""
    from harness.golden import replay_one
    from harness.paths import golden_dir
    started = time.monotonic()
    paths = sorted(golden_dir(release).glob("*.json"))
    for i, path in enumerate(paths, 1):
        with mutant.patch():
            d, golden, mine = replay_one(path)
        if d is not None:
            from harness.diff import report
            return Result(mutant, True, i, len(golden["stream"]["requests"]), len(golden["steps"]),
                          f"replay {release}/{path.stem}", time.monotonic() - started,
                          report(golden, mine, d))
    return Result(mutant, False, len(paths), None, None, "-", time.monotonic() - started)


def table(results: list[Result]) -> str:
    rows = [("mutant", "side", "killed", "examples", "shrunk reqs", "shrunk steps", "killed by",
             "rule broken", "vLLM module")]
    for r in results:
        killed = "yes" if r.killed else "equivalent" if r.mutant.equivalent else "NO"
        rows.append((r.mutant.name, r.mutant.side, killed, str(r.examples),
                     str(r.shrunk_requests or "-"), str(r.shrunk_steps or "-"), r.by,
                     r.mutant.rule, r.mutant.mirrors))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["| " + " | ".join(c.ljust(w) for c, w in zip(row, widths)) + " |" for row in rows]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


def main(budget: float | None = None, names: list[str] | None = None,
         show_reports: bool = False) -> int:
    mutants = [m for m in catalogue() if not names or m.name in names]
    if names and len(mutants) != len(set(names)):
        known = {m.name for m in catalogue()}
        print(f"error: unknown mutant(s): {', '.join(sorted(set(names) - known))}", file=sys.stderr)
        return 2
    results = []
    for m in mutants:
        if m.equivalent:
            results.append(Result(m, False, 0, None, None, "equivalent", 0.0))
            print(f"{m.name}: equivalent, not hunted ({m.equivalent})", file=sys.stderr)
            continue
        r = hunt(m, budget=budget)
        results.append(r)
        print(f"{m.name}: {'killed' if r.killed else 'SURVIVED'} after {r.examples} stream(s) "
              f"({r.seconds:.1f} s)", file=sys.stderr)
    print(table(results))
    if show_reports:
        for r in results:
            if r.report:
                print(f"\n### {r.mutant.name}\n\n{r.report}")
    survivors = [r.mutant.name for r in results if not r.killed and not r.mutant.equivalent]
    equivalents = [r.mutant for r in results if r.mutant.equivalent]
    hunted = len(results) - len(equivalents)
    print(f"\n{hunted - len(survivors)}/{hunted} mutants killed"
          + (f"; survivors: {', '.join(survivors)}" if survivors else ""))
    for m in equivalents:
        print(f"equivalent (cannot be killed): {m.name}: {m.equivalent}")
    return 1 if survivors else 0
