"""``python -m harness`` (or ``vllm-conformance``): trace, check, table, record, replay,
fuzz, coverage, reach, mutants, conformance, bench, race, serve, profile,
certify, compliance, export, import, workload.

Exit codes:

====  =====================================================================
0     equal, clean, done
1     a divergence, or an engine failed on a stream
2     bad input or usage: one line per error naming the field and the rule;
      nothing written
3     the installed vLLM cannot be driven: one line naming what is missing
130   interrupted (Ctrl-C or SIGTERM); a campaign prints its summary so far
====  =====================================================================

This module only parses arguments and dispatches; each command's work is a
function of the library module named in its handler."""

from __future__ import annotations

import argparse
import os
import sys
from typing import NoReturn, Sequence

from harness import __version__
from harness.cli import commands
from harness.cli.arguments import (
    EXIT_BAD_INPUT,
    EXIT_CANNOT_DRIVE,
    EXIT_INTERRUPTED,
    EXIT_OK,
    Parser,
    UsageError,
    engine_name,
    fraction,
    non_negative_int,
    positive_float,
    positive_int,
)
from harness.engines import EngineUnavailable, UnknownEngine
from harness.formats.stream import StreamError


def _compared_options(parser) -> None:
    """``--level`` and ``--fields``: what of the traces is compared (harness.checks.levels)."""
    parser.add_argument("--level", default=None,
                        help="compare up to this fidelity level: tokens, preemptions, "
                             "prefix_hits, exact (default: exact, every field)")
    parser.add_argument("--fields", default=None, metavar="F1,F2",
                        help="compare only these step fields (e.g. scheduled,preempted); "
                             "not with --level")


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="python -m harness", description=__doc__,
               formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version",
                   version=f"vllm-conformance {__version__} (reference of vLLM 0.11.0)")
    sub = p.add_subparsers(dest="command", required=True, parser_class=Parser)

    t = sub.add_parser("trace", help="write one engine's trace per stream")
    t.add_argument("--engine", required=True, type=engine_name,
                   help="vllm, vllm-core, reference, or module:Class (an engine of your own)")
    t.add_argument("streams", nargs="+")
    t.add_argument("-o", "--output", help="folder: one <name>.json per stream (default: JSON Lines on stdout)")
    t.set_defaults(func=commands.cmd_trace)

    c = sub.add_parser("check", help="run vLLM and the reference, diff step by step")
    c.add_argument("streams", nargs="+")
    c.add_argument("--json", action="store_true", help="one JSON object per stream on stdout")
    c.add_argument("--engines", "--engine", default="vllm",
                   help="the engines to compare with the reference, comma-separated: "
                        "vllm (the harness's step loop), vllm-core (vLLM's EngineCore), or "
                        "module:Class (an engine of your own); default vllm")
    _compared_options(c)
    c.add_argument("--fit", action="store_true",
                   help="fit each stream to the features an engine declares first (as its "
                        "profile draws them): a feature it lacks is taken out, not refused")
    c.add_argument("--counterexamples", default=None, metavar="DIR",
                   help="folder for the streams that diverge or make an engine fail "
                        "(default: $HARNESS_COUNTEREXAMPLES or counterexamples/)")
    c.set_defaults(func=commands.cmd_check)

    tb = sub.add_parser("table", help="per-step table of one stream")
    tb.add_argument("stream")
    tb.add_argument("--engine", default="vllm", type=engine_name)
    tb.set_defaults(func=commands.cmd_table)

    r = sub.add_parser("record", help="record vLLM golden traces with an _info block")
    r.add_argument("streams", nargs="+")
    r.add_argument("-o", "--output", required=True)
    r.set_defaults(func=commands.cmd_record)

    rp = sub.add_parser("replay", help="replay the reference against recorded traces (no vLLM)")
    rp.add_argument("traces", nargs="?", default=None,
                    help="folder of recorded traces (default: the bundled vLLM 0.11.0 traces)")
    rp.add_argument("--engine", default="reference", type=engine_name,
                    help="the engine replaying them: reference (default), or module:Class "
                         "(an engine of your own, against vLLM's recorded traces)")
    _compared_options(rp)
    rp.set_defaults(func=commands.cmd_replay)

    cf = sub.add_parser("certify", help="hold an engine to the reference of the vLLM release "
                                        "it claims: report.md, report.json, badge.svg")
    cf.add_argument("engine", type=engine_name,
                    help="module:Class, cmd:<command>, or any engine name")
    cf.add_argument("--release", default=None,
                    help="the vLLM release to hold it to (default: the one the engine claims)")
    cf.add_argument("--streams", type=positive_int, default=50, help="streams per family")
    cf.add_argument("--level", default="exact",
                    help="the fidelity level divergences are explained on: tokens, "
                         "preemptions, prefix_hits, exact (default); every level is reported")
    cf.add_argument("--families", nargs="+", default=None, metavar="FAMILY",
                    help="only these families (the conformance properties' names)")
    cf.add_argument("-o", "--output", required=True,
                    help="folder for the report, the badge and the counterexamples")
    cf.set_defaults(func=commands.cmd_certify)

    ct = sub.add_parser("compliance", help="the compliance table of certificates (Markdown)")
    ct.add_argument("reports", nargs="+", help="report.json files written by certify")
    ct.set_defaults(func=commands.cmd_compliance)

    pf = sub.add_parser("profile", help="an engine's conformance per family of rules, and the "
                                        "rules of vLLM it breaks")
    pf.add_argument("--engine", required=True, type=engine_name,
                    help="module:Class, cmd:<command>, or any engine name")
    pf.add_argument("--streams", type=positive_int, default=50, help="streams per family")
    _compared_options(pf)
    pf.add_argument("--against", default="reference",
                    help="what the engine is judged against: reference (default), vllm, vllm-core")
    pf.add_argument("--families", nargs="+", default=None, metavar="FAMILY",
                    help="only these families (the conformance properties' names)")
    pf.add_argument("-o", "--output", default=None,
                    help="folder for profile.json and each family's shrunk counterexample "
                         "(default: counterexamples/profile)")
    pf.add_argument("--no-shrink", action="store_true", help="no shrunk counterexamples")
    pf.add_argument("--json", action="store_true", help="the profile as JSON on stdout")
    pf.set_defaults(func=commands.cmd_profile)

    ex = sub.add_parser("export", help="a portable fixture set: streams and vLLM's traces of "
                                       "them, with JSON Schemas and a README")
    ex.add_argument("--vllm", required=True, metavar="VERSION",
                    help="the vLLM release: the installed one, or one made by make upgrade-check")
    ex.add_argument("-o", "--output", required=True, help="a new or empty folder")
    ex.add_argument("--generated", type=non_negative_int, default=200,
                    help="streams of the whole space to add to the bundled ones (default 200)")
    ex.add_argument("--seed", type=int, default=0, help="their seed (default 0)")
    ex.set_defaults(func=commands.cmd_export)

    sv = sub.add_parser("serve", help="answer the engine line protocol on stdin/stdout with "
                                      "an engine (docs/engine-interface.md)")
    sv.add_argument("engine", type=engine_name,
                    help="reference, vllm, vllm-core, or module:Class")
    sv.set_defaults(func=commands.cmd_serve)

    f = sub.add_parser("fuzz", help="hypothesis campaign: reference vs vLLM")
    f.add_argument("--examples", type=positive_int, default=None,
                   help="streams to check (default: the profile's max_examples)")
    f.add_argument("--seed", type=int, default=None)
    f.add_argument("--profile", choices=("ci", "dev", "nightly"), default=None,
                   help="hypothesis profile (default: ci when a CI system is detected, else dev)")
    f.add_argument("--property", default="whole_space", metavar="NAME",
                   help="whose streams: a conformance property (default whole_space, which "
                        "mixes the others; e.g. real_workloads: windows of real traces)")
    f.add_argument("--json", action="store_true", help="the result as one JSON object")
    f.add_argument("--engines", default="vllm",
                   help="the vLLM engines each stream is checked on against the reference, "
                        "comma-separated: vllm (vLLM's scheduler under the step loop), "
                        "vllm-core (vLLM's EngineCore; streams it does not take are skipped)")
    f.add_argument("--workers", type=positive_int, default=None,
                   help="processes checking chunks of the campaign at once (default: every "
                        "core); the same seed checks the same streams whatever the number")
    f.add_argument("--ray", nargs="?", const="local", default=None, metavar="ADDRESS",
                   help="run the chunks as tasks on a Ray cluster: ADDRESS (e.g. auto, or "
                        "ray://head:10001), or a local Ray instance when no ADDRESS is given")
    f.set_defaults(func=commands.cmd_fuzz)

    cv = sub.add_parser("coverage", help="a fuzz campaign under coverage.py: the share of "
                                         "vLLM's v1/core it executes, per file")
    cv.add_argument("--examples", type=positive_int, default=1000)
    cv.add_argument("--seed", type=int, default=0)
    cv.add_argument("--profile", choices=("ci", "dev", "nightly"), default=None)
    cv.add_argument("--missing", action="store_true", help="list the lines never run, per file")
    cv.add_argument("--json", action="store_true", help="the result as one JSON object")
    cv.add_argument("--engines", default="vllm",
                   help="the vLLM engines each stream is checked on against the reference, "
                        "comma-separated: vllm (vLLM's scheduler under the step loop), "
                        "vllm-core (vLLM's EngineCore; streams it does not take are skipped)")
    cv.set_defaults(func=commands.cmd_coverage)

    cc = sub.add_parser("capture-check", help="captures (traces whose model really sampled) "
                                              "turned into scripted streams and replayed")
    cc.add_argument("captures", nargs="+", help="capture files (traces) or folders of them")
    cc.add_argument("--engines", default="reference",
                    help="engines to replay the captures' streams on, comma-separated "
                         "(default: reference)")
    cc.add_argument("--streams-out", default=None, metavar="DIR",
                    help="also write each capture's stream to DIR/<capture name>.json")
    cc.set_defaults(func=commands.cmd_capture_check)

    g = sub.add_parser("gpu-check", help="make gpu-check: capture streams with a sampling "
                                         "model and check the captures (the CPU half without "
                                         "a GPU)")
    g.add_argument("streams", nargs="*", help="streams (default: the bundled ones)")
    g.add_argument("-o", "--output", default=None, metavar="DIR", help="keep the captures in DIR")
    g.set_defaults(func=commands.cmd_gpu_check)

    r = sub.add_parser("reach", help="the rule report: streams of a profile that reach each "
                                     "named rule (its mutant changes their trace)")
    r.add_argument("--profile", choices=("ci", "dev", "nightly"), default="ci")
    r.add_argument("--examples", type=positive_int, default=None,
                   help="streams per property (default: the profile's)")
    r.add_argument("--only", nargs="*", default=None, metavar="PROPERTY",
                   help="these properties' streams only")
    r.add_argument("--floor", type=positive_int, default=20,
                   help="exit 1 when a rule is reached by fewer streams (default 20)")
    r.add_argument("--quick", action="store_true",
                   help="the properties one after another, a rule no longer judged once "
                        "the streams so far reached it --floor times: the floor check is "
                        "the same, the counts are cut at the floor, the run much shorter")
    r.add_argument("--every-run", action="store_true",
                   help="run each mutant on every stream it applies to, also where the "
                        "watched run did not decide its rule (the same counts, far slower: "
                        "the check of the skipping)")
    r.add_argument("--json", action="store_true", help="the report as one JSON object")
    r.set_defaults(func=commands.cmd_reach)

    m = sub.add_parser("mutants", help="kill tables: every mutant under the ci profile and "
                                       "the main job")
    m.add_argument("--budget", type=positive_float, default=None, help="seconds per mutant")
    m.add_argument("--only", nargs="*", default=None)
    m.add_argument("--reports", action="store_true", help="print each killed mutant's divergence report")
    m.set_defaults(func=commands.cmd_mutants)

    cf = sub.add_parser("conformance", help="the main job: bundled scenarios, KV sizing, a short campaign, the seed table")
    cf.add_argument("--examples", type=positive_int, default=300)
    cf.set_defaults(func=commands.cmd_conformance)
    for name, func, text in (
            ("upgrade-check", commands.cmd_upgrade_check,
             "run a newer vLLM release (a cached side environment) against an older one's "
             "rules (0.11.0 unless --from) and write docs/upgrades/<version>.md"),
            ("upgrade-report", commands.cmd_upgrade_report, argparse.SUPPRESS)):
        u = sub.add_parser(name, help=text)
        u.add_argument("version", help="a vLLM release, e.g. 0.12.0, or latest: the newest "
                                       "release on the package index pip is set up with (no "
                                       "pre-release, none yanked); one line says which it took")
        u.add_argument("streams", nargs="?", default=None,
                       help="a folder of your own streams: each is reported same or different "
                            "between the two releases (no campaign; the report goes to "
                            "standard output unless --out is given)")
        u.add_argument("--from", dest="old", default=None, metavar="RELEASE",
                       help="the release upgraded from (default 0.11.0, or with --forget the "
                            "release before VERSION; one the reference describes)")
        u.add_argument("--forget", default=None, metavar="CHANGE",
                       help="leave this rule change of reference/releases.py out of the "
                            "reference, as if VERSION had brought it unnamed: the report shows "
                            "what the check and its suspect lines make of it (the report goes "
                            "to standard output unless --out is given; nothing recorded)")
        u.add_argument("--examples", type=non_negative_int, default=5000,
                       help="generated streams (default 5000; 0: the bundled streams only)")
        u.add_argument("--seed", type=int, default=1)
        u.add_argument("--shrink-seconds", type=positive_int, default=20,
                       help="time spent shrinking each cause's example, the causes shared "
                            "out among the workers (default 20; a check from 0.11.0 to "
                            "0.34.0 finds some 60 causes)")
        u.add_argument("--out", default=None,
                       help="folder of the reports (default: docs/upgrades; with a streams "
                            "folder, standard output)")
        u.add_argument("--no-record", action="store_true",
                       help="do not record the bundled streams' traces into fixtures/traces/")
        u.add_argument("--workers", type=positive_int, default=None,
                       help="processes checking chunks of the campaign at once (default: every "
                            "core); the same seed gives the same report whatever the number")
        u.add_argument("--fail-on", choices=("different", "unexplained"), default="different",
                       help="exit 1 on any difference (different, the default) or only on what "
                            "the check cannot explain (unexplained: a cause no named rule change "
                            "explains, the reference with the release's rules not exact, a "
                            "stream that could not run); a scheduled job passes when every "
                            "cause is named")
        u.set_defaults(func=func)

    rl = sub.add_parser("releases", help="the rules of one vLLM release as plain code "
                                          "(render), or docs/releases/ afresh (pages)")
    rl.add_argument("action", choices=("render", "pages"))
    rl.add_argument("version", nargs="?", default=None,
                    help="render: the release (default folder docs/releases/VERSION/)")
    rl.add_argument("--diff", nargs=2, metavar=("FROM", "TO"), default=None,
                    help="render: print the diff of two releases' rules, each hunk labelled "
                         "with the rule changes behind it")
    rl.add_argument("-o", "--output", default=None, help="the folder to write into")
    rl.set_defaults(func=commands.cmd_releases)

    cl = sub.add_parser("changelog", help="write docs/upgrades/changelog.md: vLLM's scheduling "
                                          "rules release by release, from reference/releases.py")
    cl.set_defaults(func=commands.cmd_changelog)

    b = sub.add_parser("bench", help="what checking costs: six figures against their targets, "
                                     "written to docs/performance.md with a plot")
    b.add_argument("--quick", action="store_true",
                   help="small sizes (under a minute; for tests and development)")
    b.add_argument("--output", metavar="DIR", default=None,
                   help="folder for performance.md and performance-scaling.svg (default: docs/)")
    b.add_argument("--blocks", type=positive_int, default=None,
                   help="pages of figure 1b's big pool (default 1,000,000; --quick 20,000)")
    b.add_argument("--requests", type=positive_int, default=None,
                   help="requests of figure 1b's big pool (default 512; --quick 64)")
    b.set_defaults(func=commands.cmd_bench)

    rc = sub.add_parser("race", help="which way of fuzzing locally finds a rarely decided rule "
                                     "first: hypothesis, targeted hypothesis, HypoFuzz")
    rc.add_argument("--limit", type=positive_float, default=120.0, help="seconds per lap")
    rc.add_argument("--laps", type=positive_int, default=1, help="laps per mutant and method")
    rc.add_argument("--jobs", type=positive_int, default=2, help="laps run at once")
    rc.add_argument("--mutants", nargs="+", default=None, metavar="MUTANT",
                    help="reference mutants to race to (default: ten rarely decided rules)")
    rc.add_argument("--methods", nargs="+", default=None, metavar="METHOD",
                    choices=("hypothesis", "targeted", "hypofuzz"))
    rc.add_argument("--report", metavar="MARKDOWN", default=None,
                    help="also write the table into this file between its fuzzers:begin/end "
                         "markers (e.g. docs/performance.md)")
    rc.set_defaults(func=commands.cmd_race)

    from harness.formats.public_traces import FORMATS
    im = sub.add_parser("import", help="cut a public request trace (Mooncake, Azure, BurstGPT, "
                                       "JSONL) into streams: windows of consecutive requests, "
                                       "arrival spacing and prefix sharing kept")
    im.add_argument("format", choices=FORMATS, help="the trace's format (docs/workloads.md)")
    im.add_argument("trace", help="the trace file")
    im.add_argument("-o", "--output", required=True, help="folder for the streams")
    im.add_argument("--window", type=positive_int, default=32,
                    help="consecutive requests per stream (default 32, at most 4096)")
    im.add_argument("--windows", type=positive_int, default=1,
                    help="how many windows (default 1)")
    im.add_argument("--seed", type=int, default=0,
                    help="where the windows start, and the drawn configs (default 0)")
    im.add_argument("--ms-per-step", type=fraction(True), default="100",
                    metavar="MS", help="trace milliseconds per engine step (default 100)")
    im.add_argument("--scale", type=fraction(True), default=None,
                    help="stream tokens per trace token (default block_size / trace block, "
                         "e.g. 16/512; fixed so with hash ids)")
    im.add_argument("--trace-block", type=positive_int, default=512,
                    help="trace tokens per hash id (default 512, Mooncake's)")
    im.add_argument("--block-size", type=positive_int, default=None)
    im.add_argument("--num-gpu-blocks", type=positive_int, default=None,
                    help="the pool (default: room for every request of the window at once)")
    im.add_argument("--max-num-batched-tokens", type=positive_int, default=None)
    im.add_argument("--max-num-seqs", type=positive_int, default=None)
    im.add_argument("--max-model-len", type=positive_int, default=None,
                    help="default: the window's longest request, in whole pages")
    im.add_argument("--policy", choices=("fcfs", "priority"), default=None)
    im.add_argument("--num-speculative-tokens", type=non_negative_int, default=None)
    im.add_argument("--model", default=None, help="a folder of fixtures/models/")
    im.add_argument("--config", default=None, metavar="FILE.json",
                    help="a JSON object of config fields (options given win)")
    im.add_argument("--configs", type=positive_int, default=None, metavar="N",
                    help="N configs per window drawn from the seed (pool pressure, batch, "
                         "policy, speculative decoding); options given stay fixed")
    im.add_argument("--draft-acceptance", type=fraction(False, 1), default=None, metavar="P",
                    help="with speculative decoding: the chance a draft token is right "
                         "(default 1; drawn with --configs)")
    im.set_defaults(func=commands.cmd_import)

    wl = sub.add_parser("workload", help="what streams ask of the KV cache, on the reference: "
                                         "steps, prefix hits, preemptions, pages, the smallest "
                                         "pool without preemption")
    wl.add_argument("streams", nargs="+", help="stream files or folders of them")
    wl.add_argument("--json", action="store_true", help="the report as one JSON object")
    wl.add_argument("--no-search", action="store_true",
                    help="do not search for the smallest pool (one run per stream)")
    wl.add_argument("--plot", default=None, metavar="FILE",
                    help="draw pages in use and running requests per step (matplotlib, the "
                         "[bench] extra; .png, .svg or .pdf)")
    wl.set_defaults(func=commands.cmd_workload)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    ns = parser.parse_args(argv)
    try:
        mutant = os.environ.get("HARNESS_MUTANT")
        if mutant:
            return commands.run_with_mutant(mutant, ns)
        return ns.func(ns)
    except StreamError as exc:
        for line in exc.errors:
            print(f"error: {line}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except (UsageError, UnknownEngine) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except EngineUnavailable as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_CANNOT_DRIVE
    except BrokenPipeError:
        return EXIT_OK
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except OSError as exc:  # a full disk, a folder that went away, ...
        where = f"{exc.filename}: " if exc.filename else ""
        print(f"error: {where}{exc.strerror or exc}", file=sys.stderr)
        return EXIT_BAD_INPUT


def run() -> NoReturn:
    """The console script and ``python -m harness``: exit with main()'s code.

    An interrupted run leaves at once: interpreter teardown after vLLM and torch
    takes seconds, and a stopped campaign must be gone within one.
    """
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    if code == EXIT_INTERRUPTED:
        os._exit(code)
    sys.exit(code)
