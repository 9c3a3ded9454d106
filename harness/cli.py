"""``python -m harness`` (or ``vllm-conformance``): trace, check, table, record, replay,
fuzz, coverage, reach, mutants, conformance, bench, race, serve, profile,
export, import, workload.

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
function of the library module named in its handler.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import NoReturn, Sequence

from harness import __version__
from harness.engines import ENGINE_NAMES, EngineUnavailable, UnknownEngine, get_engine
from harness.paths import DOCS_DIR, STREAMS_DIR, counterexamples_dir, golden_dir, write_json
from harness.stream import Stream, StreamError, load_stream

EXIT_OK, EXIT_DIFF, EXIT_BAD_INPUT, EXIT_CANNOT_DRIVE, EXIT_INTERRUPTED = 0, 1, 2, 3, 130


class UsageError(Exception):
    """Bad command-line input: reported in one line, exit 2."""


class Parser(argparse.ArgumentParser):
    """argparse, with a usage error in one line (no usage block) and exit 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_BAD_INPUT, f"error: {self.prog.split()[-1]}: {message}\n")


def _positive(convert, kind: str):
    """An argparse type: ``convert`` of the text, which must be > 0."""
    def parse(text: str):
        try:
            value = convert(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {kind}") from None
        if not value > 0:
            raise argparse.ArgumentTypeError(f"{value} must be > 0")
        return value
    return parse


positive_int = _positive(int, "an integer")


def non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} must be >= 0")
    return value
positive_float = _positive(float, "a number")


def output_folder(text: str) -> Path:
    """An output folder: created if missing; an existing file or an unwritable folder is refused."""
    path = Path(text)
    if path.exists() and not path.is_dir():
        raise UsageError(f"-o {text}: is a file, not a folder")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"-o {text}: cannot create the folder: {exc.strerror}") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise UsageError(f"-o {text}: the folder is not writable")
    return path


def unique_names(streams: Sequence[Stream]) -> None:
    """Streams written to one folder need distinct names (the file names)."""
    seen: dict[str, int] = {}
    for i, s in enumerate(streams):
        if s.name in seen:
            raise UsageError(f"stream {i + 1} and stream {seen[s.name] + 1} are both named "
                             f"{s.name!r}: their outputs would overwrite each other")
        seen[s.name] = i


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
    engine = get_engine(ns.engine)  # a plug-in that does not load leaves no folder behind
    out = None
    if ns.output:
        unique_names(streams)
        out = output_folder(ns.output)
    return trace_streams(engine, streams, out)


def engine_name(text: str) -> str:
    """An argparse type: one of ENGINE_NAMES, ``module:Class`` or ``cmd:<command>`` (an
    engine of one's own, loaded when used)."""
    if text in ENGINE_NAMES or ":" in text:
        return text
    raise argparse.ArgumentTypeError(f"invalid choice: {text!r} (choose from "
                                     f"{', '.join(ENGINE_NAMES)}, module:Class or cmd:<command>)")


def cmd_profile(ns) -> int:
    from harness.conformance_profile import profile
    from harness.properties import PROPERTIES
    from harness.trace import STEP_FIELDS
    fields = None
    if ns.fields:
        fields = [f.strip() for f in ns.fields.split(",") if f.strip()]
        unknown = [f for f in fields if f not in (*STEP_FIELDS, "kv_cache")]
        if unknown or not fields:
            raise UsageError(f"--fields: {', '.join(unknown) or 'none given'} not a step field "
                             f"(kv_cache, {', '.join(STEP_FIELDS)})")
    names = [p.name for p in PROPERTIES]
    unknown = [f for f in ns.families or () if f not in names]
    if unknown:
        raise UsageError(f"--families: no family {', '.join(unknown)} ({', '.join(names)})")
    if ns.against not in ENGINE_NAMES:
        raise UsageError(f"--against: {ns.against!r} is not one of {', '.join(ENGINE_NAMES)}")
    get_engine(ns.engine)  # one that does not load stops here, before anything is written
    folder = output_folder(ns.output) if ns.output else counterexamples_dir() / "profile"

    def progress(fam) -> None:
        if not ns.json:
            print(f"{fam.name}: {fam.conform}/{fam.streams - fam.not_taken} conform"
                  + (f", {fam.not_taken} not taken" if fam.not_taken else ""),
                  file=sys.stderr, flush=True)

    result = profile(ns.engine, ns.streams, fields, ns.against, ns.families, folder,
                     not ns.no_shrink, progress)
    write_json(folder / "profile.json", result.to_json())
    print(json.dumps(result.to_json()) if ns.json else result.text())
    return EXIT_OK if result.conforms else EXIT_DIFF


def cmd_export(ns) -> int:
    from harness.export import ExportError, export
    from harness.sideenv import check_version
    try:
        check_version(ns.vllm)
    except ValueError:
        raise UsageError(f"--vllm: {ns.vllm!r} is not a release number like 0.12.0") from None
    try:
        return export(ns.vllm, Path(ns.output), ns.generated, ns.seed)
    except ExportError as exc:
        raise UsageError(str(exc)) from None


def cmd_serve(ns) -> int:
    from harness.engines.line_protocol import serve
    if ns.engine.startswith("cmd:"):
        raise UsageError("serve: the engine must run here: a name or module:Class, not cmd:")
    return serve(get_engine(ns.engine))


def vllm_engines(text: str) -> list[str]:
    """The ``--engines`` option: engines to compare with the reference, comma-separated:
    vLLM's (default vllm) or plug-ins (``module:Class``), each loaded now."""
    engines = [e.strip() for e in text.split(",") if e.strip()]
    vllm_side = [e for e in ENGINE_NAMES if e != "reference"]
    for e in engines:
        if e not in vllm_side and ":" not in e:
            raise UsageError(f"--engines: {e!r} is not a vLLM engine ({', '.join(vllm_side)}) "
                             "nor module:Class nor cmd:<command>; each is compared with the "
                             "reference")
    for e in engines:
        if ":" in e:
            get_engine(e)
    return engines or ["vllm"]


def cmd_check(ns) -> int:
    from harness.conformance import check_streams
    engines = vllm_engines(ns.engines)
    streams = load_all(ns.streams)
    ok, total = check_streams(streams, as_json=ns.json, engines=engines)
    if not ns.json:
        skipped = len(streams) * len(engines) - total
        print(f"{ok} equal, {total - ok} different"
              + (f", {skipped} not taken by an engine" if skipped else ""))
    return EXIT_OK if ok == total else EXIT_DIFF


def cmd_table(ns) -> int:
    from harness.table import show
    text, completed = show(load_stream(ns.stream), ns.engine)
    print(text)
    return EXIT_OK if completed else EXIT_DIFF


def cmd_record(ns) -> int:
    from harness.golden import record
    streams = load_all(ns.streams)
    unique_names(streams)
    return record(streams, output_folder(ns.output))


def cmd_replay(ns) -> int:
    from harness.golden import replay
    folder = Path(ns.traces) if ns.traces else golden_dir("0.11.0")
    if not folder.is_dir():
        raise UsageError(f"{folder}: no such folder")
    if ns.engine != "reference":
        get_engine(ns.engine)
    return replay(folder, verbose=True, engine=ns.engine)


def cmd_capture_check(ns) -> int:
    from harness.capture import capture_check, read_capture
    engines = [e.strip() for e in ns.engines.split(",") if e.strip()]
    for e in engines:
        if e not in ENGINE_NAMES:
            raise UsageError(f"--engines: {e!r} is not an engine ({', '.join(ENGINE_NAMES)})")
    paths = stream_paths(ns.captures)
    for path in paths:  # every capture is read before the folder is made
        read_capture(path)
    out = output_folder(ns.streams_out) if ns.streams_out else None
    return capture_check(paths, tuple(engines or ["reference"]), out)


def cmd_gpu_check(ns) -> int:
    from harness.capture import gpu_check
    paths = stream_paths(ns.streams or [str(STREAMS_DIR)])
    out = output_folder(ns.output) if ns.output else None
    return gpu_check(paths, out)


def cmd_fuzz(ns) -> int:
    from harness.campaign import fuzz
    from harness.workers import default_workers
    engines = vllm_engines(ns.engines)
    if ns.ray is not None and ns.workers is not None:
        raise UsageError("--workers: not with --ray (Ray places the chunks on the cluster's cores)")
    from harness.properties import PROPERTIES
    known = [p.name for p in PROPERTIES]
    if ns.property not in known:
        raise UsageError(f"--property: {ns.property[:60]!r} is not one of {', '.join(known)}")
    return fuzz(examples=ns.examples, seed=ns.seed, profile=ns.profile, as_json=ns.json,
                engines=engines, workers=ns.workers or default_workers(), ray=ns.ray,
                prop=ns.property)


def cmd_coverage(ns) -> int:
    from harness.code_coverage import coverage_command
    return coverage_command(ns.examples, ns.seed, ns.profile, ns.missing, ns.json,
                            engines=vllm_engines(ns.engines))


def cmd_reach(ns) -> int:
    """The rule report: how many streams of a profile reach each named rule."""
    import json

    from harness.properties import PROPERTIES
    from harness.reach import floor_message, reach_of_profile
    known = [p.name for p in PROPERTIES]
    unknown = sorted(set(ns.only or ()) - set(known))
    if unknown:
        raise UsageError(f"--only: unknown property {unknown[0]!r} ({', '.join(known)})")
    props = [p for p in PROPERTIES if not ns.only or p.name in ns.only]
    report = reach_of_profile(ns.profile, properties=props, examples=ns.examples,
                              enough=ns.floor if ns.quick else None,
                              skip_undecided=not ns.every_run)
    if ns.json:
        print(json.dumps(report.to_json(), indent=1, sort_keys=True))
    else:
        print(report.table(floor=ns.floor))
    message = floor_message(report, ns.floor, ns.profile)
    if message:
        print(message, file=sys.stderr)
    return 1 if message else 0


def cmd_mutants(ns) -> int:
    from harness.mutants.hunt import main as mutants_main
    return mutants_main(budget=ns.budget, names=ns.only, show_reports=ns.reports)


def cmd_conformance(ns) -> int:
    from harness.conformance_job import main as conformance_main
    return conformance_main(examples=ns.examples)


def _upgrade_arguments(ns, latest: bool = False) -> tuple[Path | None, Path | None]:
    """(report folder, the user's streams folder), after the one-line checks of the release
    numbers, FROM and the streams; ``latest``: the release is not known yet (every check
    but those of the release, before the package index is asked)."""
    from harness.sideenv import check_version
    from reference import releases
    try:
        if not latest:
            check_version(ns.version)
        check_version(ns.old)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if not releases.is_described(ns.old):
        raise UsageError(f"FROM: the reference does not describe vLLM {ns.old} "
                         f"(it describes {releases.RELEASES[0]} to {releases.RELEASES[-1]})")
    if not latest and releases.order(ns.old) >= releases.order(ns.version):
        raise UsageError(f"FROM: {ns.old} is not older than VLLM={ns.version}")
    streams = None
    if ns.streams is not None:
        streams = Path(ns.streams)
        if not streams.is_dir():
            raise UsageError(f"{ns.streams}: not a folder of streams")
        paths = sorted(streams.glob("*.json"))
        if not paths:
            raise UsageError(f"{ns.streams}: no *.json streams in it")
        for path in paths:
            load_stream(path)  # a bad stream: one line naming the field (exit 2)
    out = Path(ns.out) if ns.out is not None else (None if streams else DOCS_DIR / "upgrades")
    return out, streams


def cmd_upgrade_check(ns) -> int:
    from harness.sideenv import IndexUnavailable
    from harness.upgrade_check import LATEST, take_latest, upgrade_check
    if ns.version == LATEST:
        _upgrade_arguments(ns, latest=True)  # bad input is exit 2 before the index is asked
        try:
            taken = take_latest(ns.old)
        except IndexUnavailable as exc:
            print(f"error: upgrade-check latest: {exc}", file=sys.stderr)
            return EXIT_CANNOT_DRIVE
        print(taken.line, file=sys.stderr)
        if taken.version is None:
            return EXIT_OK
        ns.version = taken.version
    out, streams = _upgrade_arguments(ns)
    return upgrade_check(ns.version, examples=ns.examples, seed=ns.seed, out=out,
                         record=not ns.no_record, old=ns.old, streams=streams,
                         shrink_seconds=ns.shrink_seconds, workers=_workers(ns),
                         fail_on=ns.fail_on)


def cmd_upgrade_report(ns) -> int:
    from harness.upgrade import report
    out, streams = _upgrade_arguments(ns)
    return report(ns.version, examples=ns.examples, seed=ns.seed, out=out,
                  record=not ns.no_record, old=ns.old, streams=streams,
                  shrink_seconds=ns.shrink_seconds, workers=_workers(ns), fail_on=ns.fail_on)


def _workers(ns) -> int:
    from harness.workers import default_workers
    return ns.workers or default_workers()


def cmd_releases(ns) -> int:
    from harness import render
    from reference.releases import RELEASES
    for release in [ns.version] if ns.diff is None else ns.diff:
        if release is not None and release not in RELEASES:
            raise UsageError(f"{release}: the reference describes {RELEASES[0]} to "
                             f"{RELEASES[-1]} (reference/releases.py RELEASES)")
    if ns.action == "pages":
        out = output_folder(ns.output) if ns.output else render.PAGES_DIR
        print(f"wrote {render.write_pages(out)} files into {out}")
        return 0
    if ns.diff is not None:
        for h in render.attributed_diff(*ns.diff):
            print(f"# {h.module}: " + (", ".join(f"{c.name} ({c.since}, {c.pr or 'no PR'})"
                                                for c in h.changes) or "no rule change"))
            print(h.text, end="")
        return 0
    if ns.version is None:
        raise UsageError("releases render: say which release (VERSION), or --diff A B")
    out = output_folder(ns.output or str(render.PAGES_DIR / ns.version))
    written = render.write(ns.version, out)
    print(f"wrote the rules of vLLM {ns.version}: {len(written)} modules into {out}")
    return 0


def cmd_changelog(ns) -> int:
    from harness.changelog import main as changelog_main
    return changelog_main()


def cmd_bench(ns) -> int:
    from harness.bench import main as bench_main
    output = None
    if ns.output is not None:
        output = Path(ns.output)
        # Checked now, not after minutes of measuring; created only when the report is written.
        existing = next(p for p in (output, *output.parents) if p.exists() or p == Path(p.anchor))
        if not existing.is_dir():
            raise UsageError(f"--output {ns.output}: {existing} is a file, not a folder")
        if not os.access(existing, os.W_OK | os.X_OK):
            raise UsageError(f"--output {ns.output}: {existing} is not writable")
    command = " ".join(["python -m harness bench"] + (["--quick"] if ns.quick else [])
                       + ([f"--output {ns.output}"] if ns.output is not None else [])
                       + ([f"--blocks {ns.blocks}"] if ns.blocks else [])
                       + ([f"--requests {ns.requests}"] if ns.requests else []))
    return bench_main(quick=ns.quick, output=output, num_blocks=ns.blocks,
                      num_requests=ns.requests, command=command)


def cmd_race(ns) -> int:
    from harness import fuzzer_race
    from harness.mutants import find
    ns.mutants = ns.mutants or list(fuzzer_race.MUTANTS)
    ns.methods = ns.methods or list(fuzzer_race.METHODS)
    unknown = [name for name in ns.mutants if find(name) is None]
    if unknown:
        raise UsageError(f"--mutants: no mutant called {', '.join(unknown)} "
                         "(python -m harness mutants lists them)")
    if "hypofuzz" in ns.methods and not fuzzer_race.hypofuzz_installed():
        raise UsageError("--methods hypofuzz: HypoFuzz is not installed; run make fuzz-env")
    report = None
    if ns.report is not None:
        report = Path(ns.report)
        if report.is_dir() or not report.parent.is_dir():
            raise UsageError(f"--report {ns.report}: must be a file in an existing folder")
    command = " ".join(["python -m harness race", f"--limit {ns.limit:g}", f"--laps {ns.laps}"]
                       + ([f"--report {ns.report}"] if ns.report else []))
    return fuzzer_race.main(tuple(ns.mutants), tuple(ns.methods), ns.limit, ns.jobs, ns.laps,
                            report, command)


#: ``import`` options that set one config field each (None: not given).
IMPORT_CONFIG_OPTIONS = ("block_size", "num_gpu_blocks", "max_num_batched_tokens",
                         "max_num_seqs", "max_model_len", "policy", "num_speculative_tokens",
                         "model")


def _fraction(low_open: bool, high: int | None = None):
    """An argparse type: an exact number (``0.25``, ``1/32``), > 0 (or >= 0), at most high."""
    def parse(text: str):
        from harness.workloads import parse_fraction
        try:
            value = parse_fraction(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        if (value <= 0 if low_open else value < 0) or (high is not None and value > high):
            raise argparse.ArgumentTypeError(
                f"{text} must be {'> 0' if low_open else '>= 0'}"
                + (f" and <= {high}" if high is not None else ""))
        return value
    return parse


def _config_file(text: str) -> dict:
    """``--config FILE.json``: a JSON object of stream config fields."""
    from harness.stream import _refuse_duplicate_keys, _DuplicateKey
    try:
        raw = Path(text).read_bytes()
        if len(raw) > 1 << 20:
            raise UsageError(f"--config {text}: larger than 1 MiB")
        data = json.loads(raw.decode("utf-8"), object_pairs_hook=_refuse_duplicate_keys)
    except OSError as exc:
        raise UsageError(f"--config {text}: cannot read: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise UsageError(f"--config {text}: not UTF-8 text") from None
    except json.JSONDecodeError as exc:
        raise UsageError(f"--config {text}: not valid JSON: {exc.msg} at line {exc.lineno}") from None
    except RecursionError:
        raise UsageError(f"--config {text}: not valid JSON: nested too deeply") from None
    except _DuplicateKey as exc:
        raise UsageError(f"--config {text}: key {exc.args[0]!r} appears twice") from None
    if not isinstance(data, dict):
        raise UsageError(f"--config {text}: must be a JSON object of config fields")
    return data


def cmd_import(ns) -> int:
    from harness.paths import write_atomic
    from harness.workloads import ImportOptions, WorkloadError, build_streams, stream_text
    config = _config_file(ns.config) if ns.config else {}
    config.update({k: getattr(ns, k) for k in IMPORT_CONFIG_OPTIONS
                   if getattr(ns, k) is not None})
    options = ImportOptions(window=ns.window, windows=ns.windows, seed=ns.seed,
                            ms_per_step=ns.ms_per_step, scale=ns.scale,
                            trace_block=ns.trace_block, configs=ns.configs,
                            draft_acceptance=ns.draft_acceptance, config=config)
    try:
        imported = build_streams(Path(ns.trace), ns.format, options)
    except WorkloadError as exc:
        raise UsageError(str(exc)) from None
    out = output_folder(ns.output)  # every stream is valid: only now is anything written
    for item in imported:
        write_atomic(out / f"{item.stream.name}.json", stream_text(item.stream))
    for item in imported:
        s = item.stream
        print(f"{out / s.name}.json: {len(s.requests)} requests, arrival steps 0-"
              f"{max(r.arrival_step for r in s.requests)}, "
              f"{sum(len(r.prompt) for r in s.requests):,} prompt tokens in "
              f"{item.prompt_pages:,} pages ({item.shared_pages:,} shared with an earlier "
              f"request), pool {s.config.num_gpu_blocks:,} pages"
              + (f", {item.clipped} clipped" if item.clipped else ""))
    return EXIT_OK


def cmd_workload(ns) -> int:
    from harness.workloads import plot, report_json, table_text, workload_report
    streams = load_all(ns.streams)
    plot_path = None
    if ns.plot:
        plot_path = Path(ns.plot)
        if plot_path.is_dir() or not plot_path.parent.is_dir():
            raise UsageError(f"--plot {ns.plot}: must be a file in an existing folder")
        if not os.access(plot_path.parent, os.W_OK | os.X_OK):
            raise UsageError(f"--plot {ns.plot}: the folder is not writable")
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise UsageError("--plot: matplotlib is not installed (pip install -e '.[bench]')") from None
    progress = None
    if sys.stderr.isatty():
        def progress(name: str) -> None:
            print(f"workload: {name}", file=sys.stderr, flush=True)
    reports = workload_report(streams, search=not ns.no_search, progress=progress)
    if ns.json:
        print(json.dumps(report_json(reports), indent=1, sort_keys=True))
    else:
        sys.stdout.write(table_text(reports))
    if plot_path is not None:
        plot(reports, plot_path)
    failed = [r for r in reports if r.usage.verdict != "completed"]
    for r in failed:
        print(f"{r.name}: the reference did not complete it ({r.usage.verdict}: "
              f"{r.usage.failure})", file=sys.stderr)
    return EXIT_DIFF if failed else EXIT_OK


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
    t.set_defaults(func=cmd_trace)

    c = sub.add_parser("check", help="run vLLM and the reference, diff step by step")
    c.add_argument("streams", nargs="+")
    c.add_argument("--json", action="store_true", help="one JSON object per stream on stdout")
    c.add_argument("--engines", "--engine", default="vllm",
                   help="the engines to compare with the reference, comma-separated: "
                        "vllm (the harness's step loop), vllm-core (vLLM's EngineCore), or "
                        "module:Class (an engine of your own); default vllm")
    c.set_defaults(func=cmd_check)

    tb = sub.add_parser("table", help="per-step table of one stream")
    tb.add_argument("stream")
    tb.add_argument("--engine", default="vllm", type=engine_name)
    tb.set_defaults(func=cmd_table)

    r = sub.add_parser("record", help="record vLLM golden traces with an _info block")
    r.add_argument("streams", nargs="+")
    r.add_argument("-o", "--output", required=True)
    r.set_defaults(func=cmd_record)

    rp = sub.add_parser("replay", help="replay the reference against recorded traces (no vLLM)")
    rp.add_argument("traces", nargs="?", default=None,
                    help="folder of recorded traces (default: the bundled vLLM 0.11.0 traces)")
    rp.add_argument("--engine", default="reference", type=engine_name,
                    help="the engine replaying them: reference (default), or module:Class "
                         "(an engine of your own, against vLLM's recorded traces)")
    rp.set_defaults(func=cmd_replay)

    pf = sub.add_parser("profile", help="an engine's conformance per family of rules, and the "
                                        "rules of vLLM it breaks")
    pf.add_argument("--engine", required=True, type=engine_name,
                    help="module:Class, cmd:<command>, or any engine name")
    pf.add_argument("--streams", type=positive_int, default=50, help="streams per family")
    pf.add_argument("--fields", default=None, metavar="F1,F2",
                    help="compare only these step fields (e.g. scheduled,preempted: token "
                         "counts, block ids free); default every field")
    pf.add_argument("--against", default="reference",
                    help="what the engine is judged against: reference (default), vllm, vllm-core")
    pf.add_argument("--families", nargs="+", default=None, metavar="FAMILY",
                    help="only these families (the conformance properties' names)")
    pf.add_argument("-o", "--output", default=None,
                    help="folder for profile.json and each family's shrunk counterexample "
                         "(default: counterexamples/profile)")
    pf.add_argument("--no-shrink", action="store_true", help="no shrunk counterexamples")
    pf.add_argument("--json", action="store_true", help="the profile as JSON on stdout")
    pf.set_defaults(func=cmd_profile)

    ex = sub.add_parser("export", help="a portable fixture set: streams and vLLM's traces of "
                                       "them, with JSON Schemas and a README")
    ex.add_argument("--vllm", required=True, metavar="VERSION",
                    help="the vLLM release: the installed one, or one made by make upgrade-check")
    ex.add_argument("-o", "--output", required=True, help="a new or empty folder")
    ex.add_argument("--generated", type=non_negative_int, default=200,
                    help="streams of the whole space to add to the bundled ones (default 200)")
    ex.add_argument("--seed", type=int, default=0, help="their seed (default 0)")
    ex.set_defaults(func=cmd_export)

    sv = sub.add_parser("serve", help="answer the engine line protocol on stdin/stdout with "
                                      "an engine (docs/engine-interface.md)")
    sv.add_argument("engine", type=engine_name,
                    help="reference, vllm, vllm-core, or module:Class")
    sv.set_defaults(func=cmd_serve)

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
    f.set_defaults(func=cmd_fuzz)

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
    cv.set_defaults(func=cmd_coverage)

    cc = sub.add_parser("capture-check", help="captures (traces whose model really sampled) "
                                              "turned into scripted streams and replayed")
    cc.add_argument("captures", nargs="+", help="capture files (traces) or folders of them")
    cc.add_argument("--engines", default="reference",
                    help="engines to replay the captures' streams on, comma-separated "
                         "(default: reference)")
    cc.add_argument("--streams-out", default=None, metavar="DIR",
                    help="also write each capture's stream to DIR/<capture name>.json")
    cc.set_defaults(func=cmd_capture_check)

    g = sub.add_parser("gpu-check", help="make gpu-check: capture streams with a sampling "
                                         "model and check the captures (the CPU half without "
                                         "a GPU)")
    g.add_argument("streams", nargs="*", help="streams (default: the bundled ones)")
    g.add_argument("-o", "--output", default=None, metavar="DIR", help="keep the captures in DIR")
    g.set_defaults(func=cmd_gpu_check)

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
    r.set_defaults(func=cmd_reach)

    m = sub.add_parser("mutants", help="kill tables: every mutant under the ci profile and "
                                       "the main job")
    m.add_argument("--budget", type=positive_float, default=None, help="seconds per mutant")
    m.add_argument("--only", nargs="*", default=None)
    m.add_argument("--reports", action="store_true", help="print each killed mutant's divergence report")
    m.set_defaults(func=cmd_mutants)

    cf = sub.add_parser("conformance", help="the main job: bundled scenarios, KV sizing, a short campaign, the seed table")
    cf.add_argument("--examples", type=positive_int, default=300)
    cf.set_defaults(func=cmd_conformance)
    for name, func, text in (
            ("upgrade-check", cmd_upgrade_check,
             "run a newer vLLM release (a cached side environment) against an older one's "
             "rules (0.11.0 unless --from) and write docs/upgrades/<version>.md"),
            ("upgrade-report", cmd_upgrade_report, argparse.SUPPRESS)):
        u = sub.add_parser(name, help=text)
        u.add_argument("version", help="a vLLM release, e.g. 0.12.0, or latest: the newest "
                                       "release on the package index pip is set up with (no "
                                       "pre-release, none yanked); one line says which it took")
        u.add_argument("streams", nargs="?", default=None,
                       help="a folder of your own streams: each is reported same or different "
                            "between the two releases (no campaign; the report goes to "
                            "standard output unless --out is given)")
        u.add_argument("--from", dest="old", default="0.11.0", metavar="RELEASE",
                       help="the release upgraded from (default 0.11.0; one the reference "
                            "describes)")
        u.add_argument("--examples", type=positive_int, default=5000)
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
    rl.set_defaults(func=cmd_releases)

    cl = sub.add_parser("changelog", help="write docs/upgrades/changelog.md: vLLM's scheduling "
                                          "rules release by release, from reference/releases.py")
    cl.set_defaults(func=cmd_changelog)

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
    b.set_defaults(func=cmd_bench)

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
    rc.set_defaults(func=cmd_race)

    from harness.workloads import FORMATS
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
    im.add_argument("--ms-per-step", type=_fraction(True), default="100",
                    metavar="MS", help="trace milliseconds per engine step (default 100)")
    im.add_argument("--scale", type=_fraction(True), default=None,
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
    im.add_argument("--draft-acceptance", type=_fraction(False, 1), default=None, metavar="P",
                    help="with speculative decoding: the chance a draft token is right "
                         "(default 1; drawn with --configs)")
    im.set_defaults(func=cmd_import)

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
    wl.set_defaults(func=cmd_workload)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    ns = parser.parse_args(argv)
    try:
        mutant = os.environ.get("HARNESS_MUTANT")
        if mutant:
            return _run_with_mutant(mutant, ns)
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
