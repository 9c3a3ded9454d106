"""``python -m harness``: trace, check, table, record, replay, fuzz, mutants, conformance, bench.

Exit codes: 0 equal / done, 1 a divergence or an engine failure, 2 bad input
(one line naming the field and the rule, nothing written).

This module only parses arguments and dispatches; each command's work is a
function of the library module named in its handler.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Sequence

from harness.engines import ENGINE_NAMES, UnknownEngine, get_engine
from harness.stream import Stream, StreamError, load_stream

EXIT_OK, EXIT_DIFF, EXIT_BAD_INPUT = 0, 1, 2


class UsageError(Exception):
    """Bad command-line input: reported in one line, exit 2."""


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


# -- commands -------------------------------------------------------------------


def cmd_trace(ns) -> int:
    from harness.runner import trace_streams
    streams = load_all(ns.streams)
    return trace_streams(get_engine(ns.engine), streams, Path(ns.output) if ns.output else None)


def cmd_check(ns) -> int:
    from harness.conformance import check_streams
    ok, total = check_streams(load_all(ns.streams))
    print(f"{ok} equal, {total - ok} different")
    return EXIT_OK if ok == total else EXIT_DIFF


def cmd_table(ns) -> int:
    from harness.table import show
    text, completed = show(load_stream(ns.stream), ns.engine)
    print(text)
    return EXIT_OK if completed else EXIT_DIFF


def cmd_record(ns) -> int:
    from harness.golden import record
    return record(load_all(ns.streams), Path(ns.output))


def cmd_replay(ns) -> int:
    from harness.golden import replay
    return replay(Path(ns.traces), verbose=True)


def cmd_fuzz(ns) -> int:
    from harness.campaign import fuzz
    return fuzz(examples=ns.examples, seed=ns.seed, profile=ns.profile)


def cmd_mutants(ns) -> int:
    from harness.mutants.hunt import main as mutants_main
    return mutants_main(budget=ns.budget, names=ns.only, show_reports=ns.reports)


def cmd_conformance(ns) -> int:
    from harness.conformance_job import main as conformance_main
    return conformance_main(examples=ns.examples)


def cmd_bench(ns) -> int:
    from harness.bench import main as bench_main
    return bench_main(num_blocks=ns.blocks, num_requests=ns.requests)


def _run_with_mutant(name: str, ns) -> int:
    """HARNESS_MUTANT=<name>: run the command against one mutant (see harness.mutants)."""
    from harness.mutants import find
    mutant = find(name)
    if mutant is None or mutant.patch is None:
        raise UsageError(f"HARNESS_MUTANT: unknown mutant {name!r}")
    print(f"note: running with mutant {name} applied ({mutant.rule} is broken)", file=sys.stderr)
    with mutant.patch():
        return ns.func(ns)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m harness", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)

    t = sub.add_parser("trace", help="write one engine's trace per stream")
    t.add_argument("--engine", required=True, choices=ENGINE_NAMES)
    t.add_argument("streams", nargs="+")
    t.add_argument("-o", "--output", help="folder: one <name>.json per stream (default: JSON Lines on stdout)")
    t.set_defaults(func=cmd_trace)

    c = sub.add_parser("check", help="run vLLM and the reference, diff step by step")
    c.add_argument("streams", nargs="+")
    c.set_defaults(func=cmd_check)

    tb = sub.add_parser("table", help="per-step table of one stream")
    tb.add_argument("stream")
    tb.add_argument("--engine", default="vllm", choices=ENGINE_NAMES)
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
    except (StreamError, UsageError, UnknownEngine) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except BrokenPipeError:
        return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
