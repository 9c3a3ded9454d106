"""Local fuzzing for hours: targeted generation (HARNESS_TARGET=1) and HypoFuzz.

The race itself (which finds a rare rule first) is a benchmark, in docs/performance.md;
these tests check that each way of fuzzing runs the conformance property, sees a
planted mutant, and that the race times and reports what it says.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from hypothesis import given, settings, strategies as hst

from harness.jobs import fuzzer_race
from harness.checks import profiles
from harness.formats import rule_counters
from harness.checks.conformance import Divergent
from harness.engines import get_engine
from harness.formats.paths import ROOT, STREAMS_DIR
from harness.loop.runner import run
from harness.formats.stream import parse_stream

pytestmark = pytest.mark.selftest

HAS_HYPOFUZZ = fuzzer_race.hypofuzz_installed()


def reference_trace(name: str) -> dict:
    stream = parse_stream(json.loads((STREAMS_DIR / f"{name}.json").read_text()))
    return run(get_engine("reference"), stream).to_json()


def test_aim_at_hands_each_counter_of_the_stream_to_hypothesis(monkeypatch):
    trace = reference_trace("fcfs_preempt_last_running")
    seen: dict[str, int] = {}
    monkeypatch.setattr("hypothesis.target", lambda value, label: seen.setdefault(label, value))
    rule_counters.aim_at(trace)
    one = rule_counters.Stats()
    one.add(trace)
    assert seen == {key: one.counts[key] for key in rule_counters.AIMED}
    assert seen["preemptions_fcfs"] > 0


def test_aim_at_is_accepted_inside_a_hypothesis_test():
    trace = reference_trace("fcfs_preempt_last_running")

    @settings(max_examples=3, database=None)
    @given(hst.just(None))
    def body(_):
        rule_counters.aim_at(trace)

    body()


def test_targeting_is_off_unless_asked(monkeypatch):
    monkeypatch.delenv("HARNESS_TARGET", raising=False)
    assert not profiles.aiming()
    monkeypatch.setenv("HARNESS_TARGET", "1")
    assert profiles.aiming()


def test_the_plugin_writes_progress_then_the_find_and_ends_the_process(tmp_path, monkeypatch):
    path = tmp_path / "race.json"
    calls = {"n": 0}

    def check(data, **kwargs):
        calls["n"] += 1
        if calls["n"] == 30:
            raise Divergent("planted")

    class Ended(Exception):
        pass

    def exit_(code):
        raise Ended(code)

    monkeypatch.setattr(fuzzer_race.os, "_exit", exit_)
    timed = fuzzer_race._timed(check, path)
    for _ in range(25):
        timed({})
    assert json.loads(path.read_text())["found"] is False
    assert json.loads(path.read_text())["streams"] == 25
    for _ in range(4):
        timed({})
    with pytest.raises(Ended):
        timed({})
    seen = json.loads(path.read_text())
    assert seen["found"] is True and seen["streams"] == 30


def test_each_method_runs_the_whole_space_property_its_own_way(tmp_path, monkeypatch):
    monkeypatch.setenv("CI", "true")
    monkeypatch.setenv("HARNESS_TARGET", "1")
    envs = {how: fuzzer_race.environment(how, "m", tmp_path / "r", tmp_path / "db")
            for how in fuzzer_race.METHODS}
    for how, env in envs.items():
        assert "CI" not in env  # a random profile, not the derandomized ci one
        assert env["HARNESS_MUTANT"] == "m"
        assert env["HYPOTHESIS_STORAGE_DIRECTORY"] == str(tmp_path / "db")
        assert env["HARNESS_COUNTEREXAMPLES"].startswith(str(tmp_path))  # not the repository
        assert ("HARNESS_TARGET" in env) == (how == "targeted")
        assert str(fuzzer_race.HYPOFUZZ_ENV) in env.get("PYTHONPATH", "") or how != "hypofuzz"
        assert "whole_space" in fuzzer_race.command(how)
    assert "harness.jobs.hypofuzz_run" in fuzzer_race.command("hypofuzz")
    assert "nightly" in fuzzer_race.command("hypothesis")


def test_the_table_counts_finds_per_method():
    laps = [fuzzer_race.Lap("a", "hypothesis", True, 12, 3.4),
            fuzzer_race.Lap("a", "hypofuzz", False, 50, 120.0),
            fuzzer_race.Lap("b", "hypothesis", False, 900, 120.0),
            fuzzer_race.Lap("b", "hypofuzz", True, 7, 40.2)]
    text = fuzzer_race.table(laps, 120, ("hypothesis", "hypofuzz"))
    assert "3 s (12)" in text and "not in 120 s (900)" in text
    assert [c.strip() for c in text.splitlines()[-1].split("|")[1:4]] == ["found", "1/2", "1/2"]


def test_report_goes_between_its_markers(tmp_path):
    from harness.jobs.bench import merge_report
    laps = [fuzzer_race.Lap("a", "hypothesis", True, 12, 3.4)]
    section = fuzzer_race.report_section(laps, 60, ("hypothesis",), "cmd", "machine")
    page = f"# P\n\nbefore\n\n{fuzzer_race.BEGIN}\nold\n{fuzzer_race.END}\n\nafter\n"
    merged = merge_report(page, section, fuzzer_race.BEGIN, fuzzer_race.END)
    assert "old" not in merged and "3 s (12)" in merged
    assert merged.startswith("# P\n\nbefore\n\n") and merged.endswith("\n\nafter\n")


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness", "race", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("args, says", [
    (["--laps", "0"], "--laps"),
    (["--limit", "soon"], "--limit"),
    (["--mutants", "no_such_rule"], "no_such_rule"),
    (["--methods", "afl"], "--methods"),
    (["--report", "/nonexistent/folder/p.md"], "--report"),
])
def test_race_bad_input_is_one_line_and_exit_2(args, says):
    proc = run_cli(*args)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and says in proc.stderr and not proc.stdout


def test_race_without_hypofuzz_says_how_to_get_it(monkeypatch, tmp_path, capsys):
    from harness import cli
    monkeypatch.setattr(fuzzer_race, "HYPOFUZZ_ENV", tmp_path / "absent")
    assert cli.main(["race", "--methods", "hypofuzz", "--limit", "1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "make fuzz-env" in err


@pytest.mark.needs_vllm
@pytest.mark.parametrize("method", ["hypothesis", "targeted", "hypofuzz"])
def test_each_method_finds_a_planted_mutant(method):
    """Each way of fuzzing runs the real property and stops at a reference mutant."""
    if method == "hypofuzz" and not HAS_HYPOFUZZ:
        pytest.skip("HypoFuzz is not installed here: make fuzz-env (make test installs it)")
    lap = fuzzer_race.lap("evict_from_tail", method, limit=120)
    assert lap.found, lap
    assert 1 <= lap.streams <= 20


@pytest.mark.needs_vllm
def test_without_a_mutant_the_lap_finds_nothing():
    """The race stops on a divergence only: a clean reference runs to the limit."""
    lap = fuzzer_race.lap("", "hypothesis", limit=8)
    assert not lap.found and lap.streams >= 25


@pytest.mark.needs_vllm
def test_a_hypofuzz_find_is_replayed_by_pytest(tmp_path):
    """What docs/fuzzing.md promises of `make dashboard`: a failure HypoFuzz finds lands in the
    example database, and pytest replays it first and keeps the counterexample."""
    if not HAS_HYPOFUZZ:
        pytest.skip("HypoFuzz is not installed here: make fuzz-env (make test installs it)")
    import os
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "HARNESS_TARGET")}
    env.update(HARNESS_MUTANT="evict_from_tail", HYPOTHESIS_STORAGE_DIRECTORY=str(tmp_path / "db"),
               HARNESS_COUNTEREXAMPLES=str(tmp_path / "kept"))
    pytest_args = ["tests/test_conformance.py", "-k", "whole_space", "-p", "no:cacheprovider", "-q"]
    # With its one test failing HypoFuzz has nothing left to fuzz and ends by itself.
    fuzz = subprocess.run([sys.executable, "-m", "harness.jobs.hypofuzz_run", "-n", "1",
                           "--no-dashboard", "--", *pytest_args], cwd=ROOT, capture_output=True,
                          text=True, timeout=600,
                          env={**env, "PYTHONPATH": str(fuzzer_race.HYPOFUZZ_ENV)})
    said = fuzz.stdout + fuzz.stderr  # HypoFuzz ends with the message on stderr
    assert "Found a failing input for every test" in said, said[-2000:]
    # The replay profile generates nothing: a failure can only come from the database.
    clean = subprocess.run([sys.executable, "-m", "pytest", *pytest_args,
                            "--hypothesis-profile", "replay"], cwd=ROOT, capture_output=True,
                           text=True, timeout=600, env={**env, "HYPOTHESIS_STORAGE_DIRECTORY":
                                                        str(tmp_path / "empty")})
    assert clean.returncode == 0, clean.stdout[-2000:]
    replay = subprocess.run([sys.executable, "-m", "pytest", *pytest_args,
                             "--hypothesis-profile", "replay"], cwd=ROOT,
                            capture_output=True, text=True, timeout=600, env=env)
    assert replay.returncode == 1, replay.stdout[-2000:]
    assert (tmp_path / "kept" / "test_conformance_whole_space.json").exists()
