"""Which way of fuzzing locally finds a broken rule first.

Three ways of running the whole-space conformance property for a long time:

* ``hypothesis``: ``pytest -k whole_space`` under the nightly profile (random
  streams, 5,000 a run);
* ``targeted``: the same with ``HARNESS_TARGET=1``, so that each stream's rule
  counters steer generation (``hypothesis.target``, :func:`harness.formats.rule_counters.aim_at`);
* ``hypofuzz``: HypoFuzz (``make fuzz-env``), hypothesis's coverage-guided
  fuzzer, which keeps the streams that reach new branches of any Python code run
  (vLLM's included) and mutates them.

Each races against one mutant of the reference (``HARNESS_MUTANT``) from an empty
example database, one process each, and is timed from its first stream to its
first divergence (vLLM's import and the shrink are left out).  The mutants are
rules a random stream rarely decides (:data:`MUTANTS`).

This module is also the pytest plugin the race loads (``-p harness.jobs.fuzzer_race``):
with ``HARNESS_RACE_FILE`` set it counts streams and, at the first divergence,
writes the count and the seconds to that file and ends the process.

    .venv/bin/python -m harness race --limit 120 --laps 2   # or: make bench-fuzzers
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from harness.formats.paths import ROOT

#: Rules that the main job's 300 whole-space streams decide rarely (docs/mutants.md):
#: five at most once, five four to seven times.
MUTANTS = ("fcfs_victim_newest_arrival", "skipped_waiting_to_tail", "set_aside_order_kept",
           "rejected_drafts_kept_by_victim", "grammar_wait_ignored",
           "chunk_hit_from_start", "null_page_never_cached", "stats_reset_not_reported",
           "window_pages_whole_window", "remote_kv_not_awaited")

METHODS = ("hypothesis", "targeted", "hypofuzz")

#: Where ``make fuzz-env`` puts HypoFuzz and the hypothesis release it works with.
HYPOFUZZ_ENV = ROOT / ".venvs" / "hypofuzz"


def hypofuzz_installed() -> bool:
    """Whether ``make fuzz-env`` has put HypoFuzz in its side environment."""
    return (HYPOFUZZ_ENV / "hypofuzz").is_dir()


_PROPERTY = "whole_space"
_PROGRESS_EVERY = 25
_STARTUP_S = 180  # importing vLLM and collecting, several at once on a busy machine


# --- the plugin side: runs inside the racing process -------------------------------

def pytest_configure(config) -> None:
    path = os.environ.get("HARNESS_RACE_FILE")
    if not path:
        return
    from harness.checks import conformance
    conformance.assert_conforms = _timed(conformance.assert_conforms, Path(path))


def _timed(check, path: Path):
    from harness.checks.conformance import Divergent
    state = {"first": 0.0, "streams": 0}

    def write(found: bool) -> None:
        seconds = time.perf_counter() - state["first"]
        path.write_text(json.dumps({"found": found, "streams": state["streams"],
                                    "seconds": round(seconds, 2)}))

    def timed(data, *args, **kwargs):
        if not state["streams"]:
            state["first"] = time.perf_counter()
        state["streams"] += 1
        try:
            check(data, *args, **kwargs)
        except Divergent:
            write(True)
            os._exit(0)  # the race is timed to the find; no shrink, no report
        if state["streams"] % _PROGRESS_EVERY == 0:
            write(False)
    return timed


# --- the driver side ----------------------------------------------------------------

@dataclass
class Lap:
    mutant: str
    method: str
    found: bool
    streams: int
    seconds: float

    def cell(self, limit: float) -> str:
        if self.found:
            return f"{self.seconds:.0f} s ({self.streams})"
        return f"not in {limit:.0f} s ({self.streams})"


def command(method: str) -> list[str]:
    pytest_args = ["tests/test_conformance.py", "-k", _PROPERTY, "-p", "harness.jobs.fuzzer_race",
                   "-p", "no:cacheprovider", "-q"]
    if method == "hypofuzz":
        return [sys.executable, "-m", "harness.jobs.hypofuzz_run", "-n", "1", "--no-dashboard",
                "--", *pytest_args]
    return [sys.executable, "-m", "pytest", *pytest_args, "--hypothesis-profile", "nightly"]


def environment(method: str, mutant: str, race_file: Path, database: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "HARNESS_TARGET")}
    # The lap's counterexample (written before the plugin ends the process) stays with it.
    env.update(HARNESS_MUTANT=mutant, HARNESS_RACE_FILE=str(race_file),
               HYPOTHESIS_STORAGE_DIRECTORY=str(database),
               HARNESS_COUNTEREXAMPLES=str(race_file.parent / "counterexamples"))
    if method == "targeted":
        env["HARNESS_TARGET"] = "1"
    if method == "hypofuzz":
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HYPOFUZZ_ENV),
                                                          env.get("PYTHONPATH")]))
    return env


def lap(mutant: str, method: str, limit: float) -> Lap:
    """Run one method against one mutant until it diverges or ``limit`` seconds pass."""
    with tempfile.TemporaryDirectory(prefix="race-") as tmp:
        race_file = Path(tmp) / "race.json"
        proc = subprocess.Popen(command(method), cwd=ROOT, start_new_session=True,
                                env=environment(method, mutant, race_file, Path(tmp) / "db"),
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        # The clock starts at the first stream (first progress report); a process that
        # never gets that far is stopped after the start-up allowance.
        deadline = time.monotonic() + _STARTUP_S + limit
        timed = False
        try:
            while proc.poll() is None:
                seen = _read(race_file)
                if seen.get("found"):
                    break
                if not timed and seen:
                    deadline, timed = time.monotonic() + limit - seen["seconds"], True
                if time.monotonic() > deadline:
                    break
                time.sleep(0.5)
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
        seen = _read(race_file)
    return Lap(mutant, method, bool(seen.get("found")), seen.get("streams", 0),
               seen.get("seconds", 0.0))


def _read(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def race(mutants=MUTANTS, methods=METHODS, limit: float = 120.0, jobs: int = 2,
         laps: int = 1) -> list[Lap]:
    """``laps`` laps of every method against every mutant, ``jobs`` at a time."""
    cells = [(m, how) for _ in range(laps) for m in mutants for how in methods]
    with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
        return list(pool.map(lambda cell: lap(*cell, limit), cells))


def table(laps: list[Lap], limit: float, methods=METHODS) -> str:
    """One row per mutant, one column per method; each cell lists that method's laps."""
    from harness.formats.text import markdown_table
    mutants = list(dict.fromkeys(x.mutant for x in laps))
    cells = {(m, how): [x for x in laps if (x.mutant, x.method) == (m, how)]
             for m in mutants for how in methods}
    rows = [[m] + ["; ".join(x.cell(limit) for x in cells[m, how]) for how in methods]
            for m in mutants]
    found = ["found"] + [f"{sum(x.found for m in mutants for x in cells[m, how])}/"
                         f"{sum(len(cells[m, how]) for m in mutants)}" for how in methods]
    return markdown_table([["mutant", *methods], *rows, found])


BEGIN, END = "<!-- fuzzers:begin -->", "<!-- fuzzers:end -->"


def report_section(laps: list[Lap], limit: float, methods, command: str, machine: str) -> str:
    return "\n".join([
        BEGIN,
        f"Command: `{command}`; {machine}.  Each cell: seconds "
        f"from the first stream to the first divergence (streams checked), or not within "
        f"{limit:.0f} s; each lap from an empty example database.",
        "",
        table(laps, limit, methods),
        END, ""])


def main(mutants=MUTANTS, methods=METHODS, limit: float = 120.0, jobs: int = 2, laps: int = 1,
         report: Path | None = None, command: str = "python -m harness race") -> int:
    """The ``race`` command: print the table, and write it into ``report`` when given."""
    results = race(mutants, methods, limit, jobs, laps)
    print(table(results, limit, methods))
    if report is not None:
        from harness.jobs.bench import machine_line, merge_report
        from harness.formats.paths import write_atomic
        existing = report.read_text() if report.exists() else ""
        write_atomic(report, merge_report(existing, report_section(
            results, limit, methods, command, machine_line()), BEGIN, END))
    return 0
