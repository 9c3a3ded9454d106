"""``harness bench``: its report, its workloads, its bare vLLM loop and its bad input.

Speed is never asserted here (docs/performance.md holds the measured figures): these
tests check that the benchmark measures what it says it does.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from harness.jobs import bench
from harness.engines import get_engine
from harness.loop.runner import run
from harness.formats.stream import parse_stream
from harness.formats.trace import ENGINE_FAILURE

FIGURES = ("1a", "1b", "2", "3", "4", "5", "6")


def run_cli(args: list[str], cwd: Path, **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, **env})


@pytest.mark.slow
@pytest.mark.needs_vllm
def test_quick_run_writes_the_report_with_every_figure(tmp_path):
    out = tmp_path / "out"
    proc = run_cli(["bench", "--quick", "--output", str(out)], cwd=tmp_path,
                   HARNESS_COUNTEREXAMPLES=str(tmp_path / "kept"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    for key in FIGURES:  # one line per figure, with its target and verdict
        (line,) = [x for x in lines if x.split()[:1] == [key]]
        assert "(target " in line
        assert line.endswith(("holds", "MISSED", "not measured")), line
    report = (out / bench.REPORT).read_text()
    assert report.count(bench.BEGIN) == report.count(bench.END) == 1
    section = report.split(bench.BEGIN)[1].split(bench.END)[0]
    assert "Command: `python -m harness bench --quick --output" in section
    assert "Machine: " in section and "Python " in section and "vLLM " in section
    # the machine's speed, by the same fixed loop, when the run began and ended
    assert re.search(r"a fixed Python loop \d+\.\d ms at the start, \d+\.\d ms at the end",
                     section), section[:600]
    for key in FIGURES:
        assert f"\n| {key} | " in section
    # The prose of docs/performance.md comes along, outside the markers.
    assert report.startswith("# Performance")
    if "no plot: matplotlib" in proc.stdout:
        assert not (out / bench.PLOT).exists()
    else:
        assert (out / bench.PLOT).read_text().lstrip().startswith("<?xml")
        assert f"]({bench.PLOT})" in section
    # Nothing written outside the folder asked for (but hypothesis's cache, .hypothesis/,
    # which every campaign leaves in the working folder and the tree ignores).
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != ".hypothesis") == ["out"]
    assert sorted(p.name for p in out.iterdir()) == sorted(
        [bench.REPORT] + ([] if "no plot" in proc.stdout else [bench.PLOT]))


@pytest.mark.parametrize("where", ["file", "file/below"])
def test_bad_output_is_one_line_and_exit_2(tmp_path, where):
    (tmp_path / "file").write_text("not a folder")
    proc = run_cli(["bench", "--quick", "--output", where], cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == ""
    (line,) = proc.stderr.splitlines()
    assert line.startswith("error: --output ") and "is a file, not a folder" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


def test_report_section_replaces_only_what_is_between_the_markers():
    old = f"# Performance\n\nprose before\n\n{bench.BEGIN}\nold numbers\n{bench.END}\n\nprose after\n"
    new = f"{bench.BEGIN}\nnew numbers\n{bench.END}\n"
    merged = bench.merge_report(old, new)
    assert merged == f"# Performance\n\nprose before\n\n{new}\nprose after\n"
    assert bench.merge_report("# Performance\n", new) == f"# Performance\n\n{new}"


def test_concurrent_workload_runs_every_request_at_once():
    n = 64
    data = bench.concurrent_workload(n, num_blocks=1_000)
    assert data["config"]["max_num_seqs"] == n
    trace = run(get_engine("reference"), parse_stream(data))
    assert trace.verdict == "completed"
    crowds = [len(step["scheduled"]) for step in trace.steps]
    # Every prompt in the first step, then every request decoding together to the end.
    assert crowds == [n] * bench.OUTPUT_TOKENS
    assert all(not step["preempted"] for step in trace.steps)
    # The default pool is twice what the requests need, for any crowd.
    big = bench.concurrent_workload(4096)["config"]
    assert big["max_num_seqs"] == 4096 and big["num_gpu_blocks"] >= 2 * 4096 * 8


def test_small_streams_are_the_same_on_every_draw():
    first = [s.sha256() for s in bench.small_streams(8)]
    assert len(first) == 8 and len(set(first)) == 8
    assert [s.sha256() for s in bench.small_streams(8)] == first
    assert [s.sha256() for s in bench.small_streams(8, seed=1)] != first


def _campaign(seconds, check_seconds, streams, peaks):
    return SimpleNamespace(seconds=seconds, check_seconds=check_seconds,
                           stats=SimpleNamespace(counts={"streams": streams}),
                           worker_peak_rss_mb=peaks)


def test_campaign_figures_from_the_campaign_contract(capsys):
    calls = []

    def run_campaign(examples, seed, profile, engines=("vllm",), workers=1):
        calls.append((examples, seed, profile, engines, workers))
        if workers == 1:
            return _campaign(60.0, 54.0, 400, [700.0])
        return _campaign(40.0, 70.0, 400, [650.0, 640.0])

    results = bench.Results()
    peaks = bench.campaign_figures(results, 400, "ci", run_campaign, 2, lambda: None)
    assert calls == [(400, 0, "ci", ("vllm",), 1), (400, 0, "ci", ("vllm",), 2)]
    three, four = results.figures
    assert (three.key, three.value, three.holds) == ("3", "10%", True)  # 1 - 54/60
    assert (four.key, four.value, four.holds) == ("4", "600", False)  # 600/min with 2
    assert four.target == "≥ 10,000" and "1.50x with 2" in four.detail
    assert results.throughput == {1: 400.0, 2: 600.0}
    assert peaks == [650.0, 640.0]
    six = bench.memory_figure(peaks)
    assert (six.value, six.holds) == ("650 MB", True)
    assert "650, 640 MB" in six.detail


def test_campaign_figures_read_the_run_of_median_wall_time():
    """Three runs of each, taking turns: each figure reads its median run (its rate, its
    share and its workers' memory), and the detail names every run."""
    one_runs = iter([_campaign(70.0, 56.0, 400, [1.0]), _campaign(50.0, 40.0, 400, [1.0]),
                     _campaign(60.0, 54.0, 400, [1.0])])
    many_runs = iter([_campaign(20.0, 40.0, 400, [610.0, 620.0]),
                      _campaign(48.0, 70.0, 400, [700.0, 710.0]),
                      _campaign(40.0, 70.0, 400, [650.0, 640.0])])
    calls = []

    def run_campaign(examples, seed, profile, engines=("vllm",), workers=1):
        calls.append(workers)
        return next(one_runs if workers == 1 else many_runs)

    results = bench.Results()
    peaks = bench.campaign_figures(results, 400, "ci", run_campaign, 2, lambda: None, 3)
    assert calls == [1, 2, 1, 2, 1, 2]
    three, four = results.figures
    assert three.value == "10%" and "median of 3 runs (70.0, 50.0, 60.0 s)" in three.detail
    assert four.value == "600" and "median of 3 runs (20.0, 48.0, 40.0 s)" in four.detail
    assert peaks == [650.0, 640.0]


def test_memory_figure_without_workers_says_so():
    six = bench.memory_figure([])
    assert six.verdict == "not measured" and "no worker reported" in six.detail


@pytest.mark.needs_vllm
def test_bare_loop_schedules_what_the_vllm_engine_traces(vllm_engine):
    from harness.engines import vllm_bare_loop
    run_bare, refuses = vllm_bare_loop()
    taken = [s for s in bench.small_streams(30) if refuses(s) is None]
    assert len(taken) >= 20
    drafts = preempted = 0
    for stream in taken:
        trace = run(vllm_engine, stream)
        bare = run_bare(stream, record=True)
        assert bare.scheduled == [[tuple(x) for x in step["scheduled"]] for step in trace.steps]
        assert bare.steps == len(trace.steps)
        assert (bare.failure is None) == (trace.verdict != ENGINE_FAILURE)
        drafts += any(step["spec_tokens"] for step in trace.steps)
        preempted += any(step["preempted"] for step in trace.steps)
    # The streams exercise what the loop scripts itself: drafts and preemptions.
    assert drafts and preempted


@pytest.mark.needs_vllm
def test_bare_loop_refuses_what_it_does_not_drive(vllm_engine):
    from harness.engines import vllm_bare_loop
    run_bare, refuses = vllm_bare_loop()
    stream = bench.small_streams(1)[0]
    data = stream.to_json()
    data["config"]["async_scheduling"] = True
    odd = parse_stream(data)
    assert refuses(odd) == "async scheduling"
    with pytest.raises(ValueError, match="async scheduling"):
        run_bare(odd)


def test_the_bare_reference_loop_schedules_what_the_reference_traces():
    """The other half of figure 2's yardstick: the reference's scheduler with nothing the
    harness adds schedules, step by step, what the traced reference schedules."""
    from harness.engines.reference_bare import refuses, run_bare
    from harness.formats.paths import STREAMS_DIR
    from harness.formats.stream import load_stream
    reference = get_engine("reference", "0.11.0")
    streams = bench.small_streams(20) + [load_stream(p) for p in
                                         sorted(STREAMS_DIR.glob("*.json"))]
    taken = [s for s in streams if refuses(s) is None]
    assert len(taken) > 100
    for stream in taken:
        steps: list = []
        run_bare(stream, record=steps)
        traced = run(reference, stream).to_json()["steps"]
        assert [[list(x) for x in st] for st in steps] == [s["scheduled"] for s in traced], \
            stream.name
    assert refuses(parse_stream({"config": {"async_scheduling": True}, "requests": [
        {"id": "a", "prompt": [1], "output": [2]}]})) == "async scheduling"
