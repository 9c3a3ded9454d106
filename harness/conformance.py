"""Comparing the reference with the installed vLLM: one stream, a campaign, the main job.

``assert_conforms(data)`` is what the property tests call for each generated
stream: it runs both engines and, on a divergence, writes the stream to
``counterexamples/<label>.json`` (overwritten on every failing call, so after
hypothesis has shrunk it holds the smallest stream) and raises with a report
and the command that replays it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from harness.stream import Stream, parse_stream

COUNTEREXAMPLES = Path("counterexamples")
_ENGINES: dict[str, Any] = {}


def engine(name: str):
    """One engine of each kind per process: vLLM is imported once."""
    if name not in _ENGINES:
        from harness.cli import get_engine
        _ENGINES[name] = get_engine(name)
    return _ENGINES[name]


class Divergent(AssertionError):
    """The reference and vLLM disagree on a stream."""


class KnownDivergent(Divergent):
    """A divergence that harness.known names and explains."""

    def __init__(self, message: str, known):
        super().__init__(message)
        self.known = known


def compare(stream: Stream, reference=None, vllm=None):
    """(divergence or None, vLLM trace, reference trace)."""
    from harness.diff import first_divergence
    from harness.runner import run
    left = run(vllm or engine("vllm"), stream).to_json()
    right = run(reference or engine("reference"), stream).to_json()
    return first_divergence(left, right), left, right


def save_counterexample(data: dict[str, Any], label: str) -> Path:
    COUNTEREXAMPLES.mkdir(exist_ok=True)
    path = COUNTEREXAMPLES / f"{label}.json"
    path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    return path


def assert_conforms(data: dict[str, Any], label: str = "counterexample", reference=None,
                    vllm=None, stats: "Stats | None" = None) -> None:
    """Raise Divergent (with a report and a replay command) if the engines disagree."""
    from harness.diff import report
    stream = parse_stream(data)
    d, left, right = compare(stream, reference, vllm)
    if stats is not None:
        stats.add(left)
    failures = [t for t in (left, right) if t["verdict"] == "engine_failure"]
    if d is None and not failures:
        return
    path = save_counterexample(stream.to_json(), label)
    text = report(left, right, d) if d else "\n".join(
        f"ENGINE FAILURE ({t['engine']}) at step {t['failure']['step']}: {t['failure']['message']}"
        for t in failures)
    message = (f"{text}\n\n{len(stream.requests)} request(s); stream written to {path}\n"
               f"replay: python -m harness check {path}")
    from harness import known
    match = None if known.strict() else known.matching(left["vllm_version"], left["stream"])
    if match is not None:
        raise KnownDivergent(f"known divergence {match.name}: {match.reason}\n{message}", match)
    raise Divergent(message)


class Stats:
    """What a campaign reached, counted on vLLM's traces."""

    KEYS = ("streams", "steps", "preemptions_fcfs", "preemptions_priority", "prefix_hits",
            "hits_after_preemption", "evictions", "chunked_prefills", "spec_tokens",
            "spec_rejections", "aborted_waiting", "aborted_running", "aborted_preempted",
            "max_steps_verdicts")

    def __init__(self) -> None:
        self.counts = dict.fromkeys(self.KEYS, 0)

    def add(self, trace: dict[str, Any]) -> None:
        c = self.counts
        stream = trace["stream"]
        policy = stream["config"]["policy"]
        prompts = {r["id"]: len(r["prompt"]) for r in stream["requests"]}
        c["streams"] += 1
        c["steps"] += len(trace["steps"])
        c["max_steps_verdicts"] += trace["verdict"] == "max_steps"
        preempted_once: set[str] = set()
        last_status: dict[str, str] = {}
        for step in trace["steps"]:
            c[f"preemptions_{policy}"] += len(step["preempted"])
            for rid, n in step["prefix_hit_tokens"].items():
                if n:
                    c["prefix_hits"] += 1
                    c["hits_after_preemption"] += rid in preempted_once
            preempted_once.update(step["preempted"])
            c["evictions"] += len(step["evicted"])
            for rid, n in step["scheduled"]:
                before = step["computed_before"][rid]
                if before + n < prompts[rid] and not step["preempted"].count(rid):
                    c["chunked_prefills"] += 1
            for rid, drafts in step["spec_tokens"].items():
                c["spec_tokens"] += len(drafts)
                if len(step["emitted"].get(rid, [])) < len(drafts) + 1:
                    c["spec_rejections"] += 1
            for rid, status in step["status"].items():
                if status == "FINISHED_ABORTED":
                    kind = {"RUNNING": "running", "PREEMPTED": "preempted"}.get(
                        last_status.get(rid, "WAITING"), "waiting")
                    c[f"aborted_{kind}"] += 1
                last_status[rid] = status

    def unreached(self) -> list[str]:
        return [k for k, v in self.counts.items() if v == 0 and k != "max_steps_verdicts"]

    def summary(self) -> str:
        return "  ".join(f"{k}={v}" for k, v in self.counts.items())


def check_bundled(folder: Path) -> tuple[int, int]:
    from harness.cli import check_one
    from harness.stream import load_stream
    streams = [load_stream(p) for p in sorted(folder.glob("*.json"))]
    engines = [engine("vllm"), engine("reference")]
    ok = sum(check_one(s, engines, quiet=True) for s in streams)
    return ok, len(streams)


def main(examples: int = 300) -> int:
    """make conformance: bundled scenarios, a short campaign, the seed table, a verdict."""
    from harness.fuzz import fuzz
    from harness.golden import STREAMS_DIR
    from harness.runner import run
    from harness.stream import load_stream
    from harness.table import render
    print("== bundled scenarios (fixtures/streams): vLLM vs reference")
    ok, total = check_bundled(STREAMS_DIR)
    print(f"{ok}/{total} streams equal")
    print(f"\n== hypothesis campaign ({examples} streams)")
    fuzz_status = fuzz(examples=examples, seed=0, profile=None)
    seed = STREAMS_DIR / "seed_eos_4_1_1.json"
    if seed.exists():
        print("\n== the seed example, step by step (real vLLM)")
        print(render(run(engine("vllm"), load_stream(seed)).to_json()))
    good = ok == total and fuzz_status == 0
    import vllm
    print(f"\nVERDICT: {'CONFORMS' if good else 'DIVERGES'} -- reference vs vLLM {vllm.__version__}: "
          f"{ok}/{total} bundled streams equal, campaign of {examples} streams "
          f"{'clean' if fuzz_status == 0 else 'found a divergence'}")
    sys.stdout.flush()
    return 0 if good else 1
