"""One handler per command: each loads its input, calls the library function that does
the work, and returns an exit code."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Sequence

from harness.cli.arguments import (
    EXIT_CANNOT_DRIVE,
    EXIT_DIFF,
    EXIT_OK,
    IMPORT_CONFIG_OPTIONS,
    UsageError,
    config_file,
    output_folder,
    vllm_engines,
)
from harness.engines import ENGINE_NAMES, get_engine
from harness.formats.paths import DOCS_DIR, STREAMS_DIR, counterexamples_dir, golden_dir, write_json
from harness.formats.stream import Stream, load_stream


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


def cmd_trace(ns) -> int:
    from harness.loop.runner import trace_streams
    streams = load_all(ns.streams)
    engine = get_engine(ns.engine)  # a plug-in that does not load leaves no folder behind
    out = None
    if ns.output:
        unique_names(streams)
        out = output_folder(ns.output)
    return trace_streams(engine, streams, out)


def compared_fields(ns) -> tuple[str, ...] | None:
    """The fields ``--level`` or ``--fields`` name (None: every field)."""
    from harness.checks.levels import LevelError, fields_of
    try:
        return fields_of(ns.level, ns.fields)
    except LevelError as exc:
        raise UsageError(str(exc)) from None


def cmd_certify(ns) -> int:
    from harness.checks.properties import PROPERTIES
    from harness.jobs.certify import certify
    from reference import releases
    from harness.checks.levels import LevelError, fields_of
    try:
        fields_of(ns.level)
    except LevelError as exc:
        raise UsageError(str(exc)) from None
    names = [p.name for p in PROPERTIES]
    unknown = [f for f in ns.families or () if f not in names]
    if unknown:
        raise UsageError(f"--families: no family {', '.join(unknown)} ({', '.join(names)})")
    if ns.release is not None and not releases.is_described(ns.release):
        raise UsageError(f"--release: {ns.release[:20]!r} is not a release the reference "
                         f"describes ({releases.RELEASES[0]} to {releases.RELEASES[-1]})")
    engine = get_engine(ns.engine)  # one that does not load stops here, nothing written
    release = ns.release or engine.version()
    if not releases.is_described(release):
        raise UsageError(f"--release: {ns.engine} claims {release!r}, not a release the "
                         "reference describes; name one")
    folder = output_folder(ns.output)

    def progress(fam) -> None:
        print(f"{fam.name}: " + (fam.outside if fam.outside else
                                 f"{fam.conform}/{fam.taken} conform of {fam.streams}"),
              file=sys.stderr, flush=True)

    report = certify(ns.engine, release, ns.streams, ns.level, ns.families, folder, progress)
    print(f"{report['engine']} held to vLLM {release}: {report['taken']} of "
          f"{report['generated']} streams taken ({report['share_taken']:g}%), level reached: "
          f"{report['level_reached'] or 'none'}; " + ", ".join(
              f"{lvl} {n}" for lvl, n in report["conforming"].items())
          + f"; report in {folder}")
    return EXIT_OK if report["level_reached"] == "exact" else EXIT_DIFF


def cmd_compliance(ns) -> int:
    from harness.jobs.certify import compliance_table
    reports = []
    for text in ns.reports:
        try:
            reports.append(json.loads(Path(text).read_text()))
        except (OSError, ValueError) as exc:
            raise UsageError(f"{text}: not a certificate's report.json ({exc})") from None
        if not isinstance(reports[-1], dict) or "conforming" not in reports[-1]:
            raise UsageError(f"{text}: not a certificate's report.json (no 'conforming')")
    print(compliance_table(reports))
    return EXIT_OK


def cmd_profile(ns) -> int:
    from harness.checks.properties import PROPERTIES
    from harness.jobs.engine_profile import profile
    fields = compared_fields(ns)
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
    from harness.jobs.export import ExportError, export
    from harness.jobs.side_env import check_version
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


def cmd_check(ns) -> int:
    from harness.checks.conformance import check_streams
    engines = vllm_engines(ns.engines)
    fields = compared_fields(ns)
    streams = load_all(ns.streams)
    folder = output_folder(ns.counterexamples, "--counterexamples") if ns.counterexamples else None
    ok, total = check_streams(streams, as_json=ns.json, engines=engines, fields=fields,
                              folder=folder, fit=ns.fit)
    if not ns.json:
        skipped = len(streams) * len(engines) - total
        print(f"{ok} equal, {total - ok} different"
              + (f", {skipped} not taken by an engine" if skipped else ""))
    return EXIT_OK if ok == total else EXIT_DIFF


def cmd_table(ns) -> int:
    from harness.checks.seed_table import show
    text, completed = show(load_stream(ns.stream), ns.engine)
    print(text)
    return EXIT_OK if completed else EXIT_DIFF


def cmd_record(ns) -> int:
    from harness.checks.golden import record
    streams = load_all(ns.streams)
    unique_names(streams)
    return record(streams, output_folder(ns.output))


def cmd_replay(ns) -> int:
    from harness.checks.golden import replay
    folder = Path(ns.traces) if ns.traces else golden_dir("0.11.0")
    if not folder.is_dir():
        raise UsageError(f"{folder}: no such folder")
    fields = compared_fields(ns)
    if ns.engine != "reference":
        get_engine(ns.engine)
    return replay(folder, verbose=True, engine=ns.engine, fields=fields)


def cmd_capture_check(ns) -> int:
    from harness.jobs.capture import capture_check, read_capture
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
    from harness.jobs.capture import gpu_check
    paths = stream_paths(ns.streams or [str(STREAMS_DIR)])
    out = output_folder(ns.output) if ns.output else None
    return gpu_check(paths, out)


def cmd_fuzz(ns) -> int:
    from harness.jobs.campaign import fuzz
    from harness.jobs.workers import default_workers
    engines = vllm_engines(ns.engines)
    if ns.ray is not None and ns.workers is not None:
        raise UsageError("--workers: not with --ray (Ray places the chunks on the cluster's cores)")
    from harness.checks.properties import PROPERTIES
    known = [p.name for p in PROPERTIES]
    if ns.property not in known:
        raise UsageError(f"--property: {ns.property[:60]!r} is not one of {', '.join(known)}")
    return fuzz(examples=ns.examples, seed=ns.seed, profile=ns.profile, as_json=ns.json,
                engines=engines, workers=ns.workers or default_workers(), ray=ns.ray,
                prop=ns.property)


def cmd_coverage(ns) -> int:
    from harness.jobs.code_coverage import coverage_command
    return coverage_command(ns.examples, ns.seed, ns.profile, ns.missing, ns.json,
                            engines=vllm_engines(ns.engines))


def cmd_reach(ns) -> int:
    """The rule report: how many streams of a profile reach each named rule."""
    import json

    from harness.checks.properties import PROPERTIES
    from harness.jobs.rule_report import floor_message, reach_of_profile
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
    from harness.jobs.mutant_hunt import main as mutants_main
    return mutants_main(budget=ns.budget, names=ns.only, show_reports=ns.reports)


def cmd_conformance(ns) -> int:
    from harness.jobs.main_job import main as conformance_main
    return conformance_main(examples=ns.examples)


def _upgrade_arguments(ns, latest: bool = False) -> tuple[Path | None, Path | None]:
    """(report folder, the user's streams folder), after the one-line checks of the release
    numbers, FROM and the streams; ``latest``: the release is not known yet (every check
    but those of the release, before the package index is asked)."""
    from harness.jobs.side_env import check_version
    from reference import releases
    try:
        if not latest:
            check_version(ns.version)
        if ns.old is not None:
            check_version(ns.old)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if ns.forget is not None:
        _forgotten(ns, latest)
    ns.old = ns.old or releases.RELEASES[0]
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
    out = Path(ns.out) if ns.out is not None else (
        None if streams or ns.forget else DOCS_DIR / "upgrades")
    return out, streams


def _forgotten(ns, latest: bool) -> None:
    """``--forget CHANGE``: a change VERSION brings over FROM (by default the release
    before VERSION), so that leaving it out of the reference makes a difference."""
    from reference import releases
    names = [c.name for c in releases.CHANGES]
    if ns.forget not in names:
        raise UsageError(f"--forget: {ns.forget[:60]!r} is not a rule change of "
                         "reference/releases.py")
    if latest:
        raise UsageError("--forget: not with latest (name the release the change came in)")
    if not releases.is_described(ns.version):
        raise UsageError(f"--forget: the reference does not describe vLLM {ns.version}")
    if ns.old is None:
        ns.old = releases.RELEASES[max(releases.RELEASES.index(ns.version) - 1, 0)]
    change = releases.change(ns.forget)
    if not releases.is_described(ns.old) or change.in_effect(ns.old) == change.in_effect(ns.version):
        raise UsageError(f"--forget: {ns.forget} is {'in' if change.in_effect(ns.version) else 'out of'} "
                         f"effect at both {ns.old} and {ns.version}: leaving it out changes nothing")


def cmd_upgrade_check(ns) -> int:
    from harness.jobs.side_env import IndexUnavailable
    from harness.jobs.upgrade_check import LATEST, take_latest, upgrade_check
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
                         fail_on=ns.fail_on, forget=ns.forget)


def cmd_upgrade_report(ns) -> int:
    from harness.jobs.upgrade_campaign import report
    out, streams = _upgrade_arguments(ns)
    return report(ns.version, examples=ns.examples, seed=ns.seed, out=out,
                  record=not ns.no_record, old=ns.old, streams=streams,
                  shrink_seconds=ns.shrink_seconds, workers=_workers(ns), fail_on=ns.fail_on,
                  forget=ns.forget)


def _workers(ns) -> int:
    from harness.jobs.workers import default_workers
    return ns.workers or default_workers()


def cmd_releases(ns) -> int:
    from harness.jobs import render
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
    from harness.jobs.changelog import main as changelog_main
    return changelog_main()


def cmd_bench(ns) -> int:
    from harness.jobs.bench import main as bench_main
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
    from harness.checks.mutants import find
    from harness.jobs import fuzzer_race
    ns.mutants = ns.mutants or list(fuzzer_race.MUTANTS)
    ns.methods = ns.methods or list(fuzzer_race.METHODS)
    unknown = [name for name in ns.mutants if find(name) is None]
    if unknown:
        raise UsageError(f"--mutants: no mutant called {', '.join(unknown)} "
                         "(python -m harness mutants lists them)")
    report = None
    if ns.report is not None:
        report = Path(ns.report)
        if report.is_dir() or not report.parent.is_dir():
            raise UsageError(f"--report {ns.report}: must be a file in an existing folder")
    # What is missing from this machine after what is wrong with the arguments.
    if "hypofuzz" in ns.methods and not fuzzer_race.hypofuzz_installed():
        raise UsageError("--methods hypofuzz: HypoFuzz is not installed; run make fuzz-env")
    command = " ".join(["python -m harness race", f"--limit {ns.limit:g}", f"--laps {ns.laps}"]
                       + ([f"--report {ns.report}"] if ns.report else []))
    return fuzzer_race.main(tuple(ns.mutants), tuple(ns.methods), ns.limit, ns.jobs, ns.laps,
                            report, command)


def cmd_import(ns) -> int:
    from harness.formats.paths import write_atomic
    from harness.formats.public_traces import (
        ImportOptions,
        WorkloadError,
        build_streams,
        stream_text,
    )
    config = config_file(ns.config) if ns.config else {}
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
    from harness.jobs.workload_report import plot, report_json, table_text, workload_report
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


def run_with_mutant(name: str, ns) -> int:
    """HARNESS_MUTANT=<name>: run the command against one mutant (see harness.checks.mutants)."""
    from harness.checks.mutants import find
    mutant = find(name)
    if mutant is None or mutant.patch is None:
        raise UsageError(f"HARNESS_MUTANT: unknown mutant {name!r}")
    print(f"note: running with mutant {name} applied ({mutant.rule} is broken)", file=sys.stderr)
    with mutant.patch():
        return ns.func(ns)
