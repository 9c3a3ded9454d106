"""``python -m harness``: trace, check, table, record, replay, fuzz, mutants, conformance.

Exit codes: 0 equal / done, 1 a divergence or an engine failure, 2 bad input
(one line naming the field and the rule, nothing written).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Sequence

from harness.stream import Stream, StreamError, load_stream

EXIT_OK, EXIT_DIFF, EXIT_BAD_INPUT = 0, 1, 2
FAILURES_DIR = Path("counterexamples")


class UsageError(Exception):
    """Bad command-line input: reported in one line, exit 2."""


def get_engine(name: str):
    """An engine by name; the reference engine never imports vLLM."""
    if name == "reference":
        from harness.engines.reference_engine import ReferenceEngine
        return ReferenceEngine()
    if name == "vllm":
        from harness.engines.vllm_adapter import VllmEngine
        return VllmEngine()
    raise UsageError(f"--engine: unknown engine {name!r} (vllm or reference)")


def stream_paths(args: Sequence[str]) -> list[Path]:
    """Files named, and every *.json in folders named (sorted)."""
    paths: list[Path] = []
    for arg in args:
        p = Path(arg)
        if p.is_dir():
            found = sorted(p.glob("*.json"))
            if not found:
                raise UsageError(f"{arg}: folder holds no *.json stream")
            paths += found
        elif p.exists():
            paths.append(p)
        else:
            raise UsageError(f"{arg}: no such file or folder")
    return paths


def load_all(args: Sequence[str]) -> list[Stream]:
    """Validate every stream before any engine runs."""
    return [load_stream(p) for p in stream_paths(args)]


def write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def save_stream(stream: Stream, tag: str, folder: Path = FAILURES_DIR) -> Path:
    """Keep a stream that an engine failed on or that diverged, for replay."""
    path = folder / f"{stream.name or 'stream'}-{tag}-{stream.sha256()[:10]}.json"
    write_atomic(path, json.dumps(stream.to_json(), indent=1, sort_keys=True) + "\n")
    return path


# -- commands -------------------------------------------------------------------


def cmd_trace(ns) -> int:
    from harness.runner import run
    streams = load_all(ns.streams)
    engine = get_engine(ns.engine)
    status = EXIT_OK
    for stream in streams:
        trace = run(engine, stream)
        if trace.failure and trace.verdict == "engine_failure":
            saved = save_stream(stream, f"{engine.name}-failure")
            print(f"{stream.name}: {engine.name} failed at step {trace.failure['step']}: "
                  f"{trace.failure['message']} (stream saved to {saved})", file=sys.stderr)
            status = EXIT_DIFF
        if ns.output:
            write_atomic(Path(ns.output) / f"{stream.name}.json", trace.dumps() + "\n")
        else:
            sys.stdout.write(trace.dumps() + "\n")
    return status


def check_one(stream: Stream, engines, quiet: bool = False) -> bool:
    """Run both engines on one stream; print a report when they differ."""
    from harness.conformance import compare
    from harness.diff import report
    d, *traces = compare(stream, vllm=engines[0], reference=engines[1])
    ok = True
    for t in traces:
        if t["verdict"] == "engine_failure":
            saved = save_stream(stream, f"{t['engine']}-failure")
            print(f"{stream.name}: ENGINE FAILURE ({t['engine']}) at step {t['failure']['step']}: "
                  f"{t['failure']['message']}\n  stream saved: {saved}")
            ok = False
    if d is not None:
        saved = save_stream(stream, "divergence")
        print(f"{stream.name}: {report(traces[0], traces[1], d)}\n"
              f"  stream saved: {saved}\n  replay: python -m harness check {saved}")
        ok = False
    elif ok and not quiet:
        print(f"{stream.name}: equal ({len(traces[0]['steps'])} steps, {traces[0]['verdict']})")
    return ok


def cmd_check(ns) -> int:
    streams = load_all(ns.streams)
    engines = [get_engine("vllm"), get_engine("reference")]
    results = [check_one(s, engines) for s in streams]
    bad = results.count(False)
    print(f"{len(results) - bad} equal, {bad} different")
    return EXIT_OK if not bad else EXIT_DIFF


def cmd_table(ns) -> int:
    from harness.runner import run
    from harness.table import render
    stream = load_stream(ns.stream)
    trace = run(get_engine(ns.engine), stream)
    print(render(trace.to_json()))
    return EXIT_OK if trace.verdict == "completed" else EXIT_DIFF


def cmd_record(ns) -> int:
    from harness.golden import record
    streams = load_all(ns.streams)
    return record(streams, Path(ns.output))


def cmd_replay(ns) -> int:
    from harness.golden import replay
    return replay(Path(ns.traces), verbose=True)


def cmd_fuzz(ns) -> int:
    from harness.fuzz import fuzz
    return fuzz(examples=ns.examples, seed=ns.seed, profile=ns.profile)


def cmd_mutants(ns) -> int:
    from harness.mutants import main as mutants_main
    return mutants_main(budget=ns.budget, names=ns.only, show_reports=ns.reports)


def cmd_conformance(ns) -> int:
    from harness.conformance import main as conformance_main
    return conformance_main(examples=ns.examples)


def cmd_bench(ns) -> int:
    from harness.bench import main as bench_main
    return bench_main(num_blocks=ns.blocks, num_requests=ns.requests)


def _run_with_mutant(name: str, ns) -> int:
    """HARNESS_MUTANT=<name>: run the command against one mutant (see harness.mutants)."""
    from harness.mutants import catalogue
    found = [m for m in catalogue() if m.name == name]
    if not found:
        raise UsageError(f"HARNESS_MUTANT: unknown mutant {name!r}")
    print(f"note: running with mutant {name} applied ({found[0].rule} is broken)", file=sys.stderr)
    with found[0].patch():
        return ns.func(ns)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m harness", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)

    t = sub.add_parser("trace", help="write one engine's trace per stream")
    t.add_argument("--engine", required=True, choices=["vllm", "reference"])
    t.add_argument("streams", nargs="+")
    t.add_argument("-o", "--output", help="folder: one <name>.json per stream (default: JSON Lines on stdout)")
    t.set_defaults(func=cmd_trace)

    c = sub.add_parser("check", help="run vLLM and the reference, diff step by step")
    c.add_argument("streams", nargs="+")
    c.set_defaults(func=cmd_check)

    tb = sub.add_parser("table", help="per-step table of one stream")
    tb.add_argument("stream")
    tb.add_argument("--engine", default="vllm", choices=["vllm", "reference"])
    tb.set_defaults(func=cmd_table)

    r = sub.add_parser("record", help="record vLLM golden traces with an _info block")
    r.add_argument("streams", nargs="+")
    r.add_argument("-o", "--output", required=True)
    r.set_defaults(func=cmd_record)

    rp = sub.add_parser("replay", help="replay the reference against recorded traces (no vLLM)")
    rp.add_argument("traces", nargs="?", default="fixtures/traces/vllm-0.11.0")
    rp.set_defaults(func=cmd_replay)

    f = sub.add_parser("fuzz", help="hypothesis campaign: reference vs vLLM")
    f.add_argument("--examples", type=int, default=200)
    f.add_argument("--seed", type=int, default=None)
    f.add_argument("--profile", default=None)
    f.set_defaults(func=cmd_fuzz)

    m = sub.add_parser("mutants", help="check that every mutant of the reference is killed")
    m.add_argument("--budget", type=float, default=None, help="seconds per mutant")
    m.add_argument("--only", nargs="*", default=None)
    m.add_argument("--reports", action="store_true", help="print each killed mutant's divergence report")
    m.set_defaults(func=cmd_mutants)

    cf = sub.add_parser("conformance", help="the main job: bundled scenarios, a short campaign, the seed table")
    cf.add_argument("--examples", type=int, default=300)
    cf.set_defaults(func=cmd_conformance)
    b = sub.add_parser("bench", help="step speed: reference vs vLLM on a large pool")
    b.add_argument("--blocks", type=int, default=1_000_000)
    b.add_argument("--requests", type=int, default=512)
    b.set_defaults(func=cmd_bench)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    ns = parser.parse_args(argv)
    try:
        mutant = os.environ.get("HARNESS_MUTANT")
        if mutant:
            return _run_with_mutant(mutant, ns)
        return ns.func(ns)
    except (StreamError, UsageError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except BrokenPipeError:
        return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
