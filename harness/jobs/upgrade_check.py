"""``make upgrade-check VLLM=<version>``: the upgrade check, from the base environment.

Makes (or reuses) the release's side environment (``harness.jobs.side_env``), runs
the check inside it (``python -m harness upgrade-report``, see
``harness.jobs.upgrade_campaign``), and keeps ``docs/upgrades/README.md``'s table of every
release tried up to date.  Exit codes: 0 same as 0.11.0, 1 different, 2 bad
input, 3 the release could not be driven (one line naming what is missing,
also written to its report).  With ``fail_on="unexplained"`` a difference is exit 1 only
when the check leaves something unexplained (``harness.jobs.upgrade_campaign.verdict``).

``upgrade-check latest``: ``take_latest`` asks the package index for the newest release
(``harness.jobs.side_env.newest_release``); one line says which it took and why, and an index
that does not answer is exit 3.
"""

from __future__ import annotations

import datetime
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from packaging.utils import canonicalize_name

from harness.formats.paths import ROOT, write_atomic
from harness.jobs.side_env import (SideEnvError, base_version, check_version, ensure_overlay,
                             ensure_stack, newest_release, overlay_environment, requirement,
                             resolve_stack)
from reference import releases

BASE = "0.11.0"
LATEST = "latest"

INDEX_HEADER = [
    "# Upgrade checks: every vLLM release tried",
    "",
    "Each row is one `make upgrade-check VLLM=<version>` (`python -m harness upgrade-check`):",
    "the release's bundled streams and a fixed-seed campaign against vLLM 0.11.0's rules, the",
    "causes of every divergence named by the rule changes of `reference/releases.py`, and the",
    "reference with the release's rules checked for exact conformance.  A release that cannot",
    "be driven says what stopped it.  The first row is the base release itself, checked by the",
    "same campaign against the reference.",
    "",
    "A release the reference does not describe (`reference/releases.py`) is compared with",
    "the newest one before it that it does; a row with fewer than 5,000 generated streams is",
    "a first look.  Releases from 0.24.0 run with a second base stack (transformers 5, xgrammar,",
    "`constraints-stack.txt`); what changed, release by release: [changelog.md](changelog.md).",
    "",
    "| release | drivable | result | causes found | report |",
    "|---|---|---|---|---|",
]


@dataclass(frozen=True)
class Taken:
    """The release ``upgrade-check latest`` took (None: none newer than FROM) and why."""

    version: str | None
    line: str


def take_latest(old: str = BASE) -> Taken:
    """The newest release on the package index, to check from ``old``, and one line saying
    which and why.  An undescribed release is checked against the rules of the newest
    described release before it (``releases.newest_described``, as ``harness.jobs.upgrade_campaign``
    does).  Raises ``sideenv.IndexUnavailable`` (one line) when the index does not answer."""
    version, where = newest_release()
    head = f"upgrade-check latest: took vLLM {version}, the newest release on the index ({where})"
    rules = releases.newest_described(version)
    newest = releases.RELEASES[-1]
    if releases.order(version) <= releases.order(old):
        return Taken(None, f"{head}, which is not newer than FROM={old}: nothing to check")
    if releases.is_described(version):
        return Taken(version, f"{head}, which the reference describes")
    if releases.order(version) > releases.order(newest):
        return Taken(version, f"{head}, newer than the newest the reference describes "
                              f"({newest}): checked against {rules}'s rules")
    return Taken(version, f"{head}, which the reference does not describe: checked against "
                          f"{rules}'s rules, the newest described before it")


def upgrade_check(version: str, examples: int, seed: int, out: Path | None, record: bool,
                  old: str = BASE, streams: Path | None = None,
                  shrink_seconds: float = 20, workers: int = 1,
                  fail_on: str = "different", forget: str | None = None) -> int:
    """``make upgrade-check [FROM=old] VLLM=version``; with ``streams``, the user's own
    streams instead of the bundled ones (no campaign, nothing recorded, the index of
    releases untouched).  ``fail_on``: "different" (exit 1 on any difference) or
    "unexplained" (exit 1 only on what the check cannot explain).  Exit codes as the
    module says."""
    check_version(version)
    plain = old == BASE and streams is None and forget is None
    started = time.monotonic()
    try:
        ensure_overlay(version, log=lambda m: print(m, file=sys.stderr))
        ensure_stack(version, log=lambda m: print(m, file=sys.stderr))
    except SideEnvError as exc:
        return _could_not_drive(version, out if plain else None, f"no side environment: {exc}")
    with tempfile.TemporaryDirectory(prefix="upgrade-report-") as scratch:
        # Your streams with no --out: the report comes back through a scratch folder and
        # goes to standard output alone; the check's progress goes to standard error.
        to_stdout = out is None
        report_dir = Path(scratch) if to_stdout else out
        # The streams folder right after the release: argparse takes the positionals together.
        cmd = [sys.executable, "-m", "harness", "upgrade-report", version] \
            + ([] if streams is None else [str(streams)]) \
            + ["--examples", str(examples), "--seed", str(seed), "--from", old,
               "--shrink-seconds", str(shrink_seconds), "--workers", str(workers),
               "--fail-on", fail_on] + ([] if forget is None else ["--forget", forget]) \
            + ([] if record and plain else ["--no-record"]) + ["--out", str(report_dir)]
        proc = subprocess.Popen(cmd, env=overlay_environment(version), stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
        last_error = last_line = ""
        for line in proc.stdout:
            (sys.stderr if to_stdout else sys.stdout).write(line)
            if line.startswith("error: "):
                last_error = line[len("error: "):].strip()
            if line.strip():
                last_line = line.strip()
        code = proc.wait()
        if code in (0, 1) and not list(report_dir.glob(f"*{version}.md")):
            code, last_error = 3, last_error or last_line  # it died before its report
        written = sorted(report_dir.glob(f"*{version}.md")) if to_stdout else []
        if written and code in (0, 1):
            sys.stdout.write(written[0].read_text())
    if code == 3 or (code not in (0, 1) and last_error):
        why = (last_error or f"exit {code}").removeprefix("vLLM cannot be driven: ")
        return _could_not_drive(version, out if plain else None, _explain(version, why))
    if code in (0, 1) and plain:
        report = out / f"{version}.md"
        failed = _could_not_run(report)
        if failed:
            _update_index(out, version, "no", f"the engine fails on bundled streams: {failed}", "-")
        else:
            result, causes = _summary(report)
            _update_index(out, version, "yes", f"{result}; {_took(started)}", causes)
    return code


def _took(started: float) -> str:
    """How long the check took, on how many cores, and when (for the table of releases)."""
    seconds = round(time.monotonic() - started)
    return (f"{seconds // 60} min {seconds % 60} s on {os.cpu_count()} cores, "
            f"{datetime.date.today().isoformat()}")


def _could_not_run(report: Path) -> str:
    """The first engine failure on a bundled stream, if any (the adapter cannot follow it)."""
    m = re.search(r"^### [\w.-]+: could not run\n\n(.+)$", report.read_text(), re.M)
    return m.group(1).strip() if m else ""


def _explain(version: str, why: str) -> str:
    """The failure, with local paths cut and, for a missing name, what the release requires."""
    why = why.replace(str(ROOT) + "/", "")
    missing = re.search(r"cannot import name '[^']+' from '([\w.]+)'", why)
    if missing:
        package = missing.group(1).split(".")[0]
        wanted = requirement(version, package)
        if wanted:
            try:
                stacked = resolve_stack(version).get(canonicalize_name(package))
            except SideEnvError:
                stacked = None
            have = f"the stack has {package} {stacked}" if stacked else \
                f"the base environment has {package} {base_version(package) or 'none'}"
            why += f"; vllm {version} requires {wanted}, {have}"
    return why


def _could_not_drive(version: str, out: Path | None, why: str) -> int:
    """Exit 3 with one line; a plain check (``out`` given) also writes the release's report
    and its row of the index."""
    if out is not None:
        text = (f"# vLLM {version} against vLLM 0.11.0's rules\n\n"
                f"Tried {datetime.date.today().isoformat()} with `make upgrade-check VLLM={version}`.\n\n"
                f"**Could not drive this release**: {why}\n")
        write_atomic(out / f"{version}.md", text)
        _update_index(out, version, "no", f"could not drive: {why}", "-")
    print(f"error: vLLM {version} cannot be driven: {why}", file=sys.stderr)
    return 3


def _summary(report: Path) -> tuple[str, str]:
    text = report.read_text()
    verdict = re.search(r"\* \*\*(SAME|DIFFERENT)\*\*", text)
    conform = re.search(r"\* The reference with the rules of [^\n]*", text)
    causes = re.findall(r"^### (?!\w+: (?:same|different|could not run))(.+)$", text, re.M)
    causes = [c for c in causes if "_" in c or c.startswith("unexplained")]
    rules = re.search(r"rules of ([\w.]+)", conform.group(0)) if conform else None
    exact = conform is not None and "(exact)" in conform.group(0)
    streams = re.search(r"Campaign \(seed \d+\): (\d+) streams", text)
    result = (verdict.group(1).lower() if verdict else "?") + \
        (f" on {streams.group(1)} generated streams" if streams else "") + \
        (f"; the reference with {rules.group(1)}'s rules exact" if exact and rules else
         "; NOT exact with the reference's rules" if conform else "")
    return result, ", ".join(f"`{c}`" for c in causes) or "none"


def _update_index(out: Path, version: str, drivable: str, result: str, causes: str) -> None:
    index = out / "README.md"
    rows: dict[str, str] = {}
    if index.exists():
        for line in index.read_text().splitlines():
            m = re.match(r"^\| (\d[\w.]*) \|", line)
            if m:
                rows[m.group(1)] = line
    rows[version] = f"| {version} | {drivable} | {result} | {causes} | [{version}.md]({version}.md) |"
    ordered = [rows[v] for v in sorted(rows, key=releases.order)]
    write_atomic(index, "\n".join(INDEX_HEADER + ordered) + "\n")
