"""The CLI on bad input: exit 2, one line on stderr, nothing written, vLLM never imported."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from stream_builders import req, stream


# ---------------------------------------------------------------------------
# The CLI: bad input is exit 2, one line on stderr, nothing written
# ---------------------------------------------------------------------------

BAD_FILES = {
    "invalid-json": "{not json",
    "unknown-field": json.dumps(stream(confg={})),
    "bad-config": json.dumps(stream(config={"num_gpu_blocks": 3})),
    "runs-out": json.dumps(stream(requests=[req(max_tokens=9)])),
    "empty-requests": json.dumps({"requests": []}),
    "newline-id": json.dumps(stream(requests=[req(id="x\ny", drafts=[[1]])])),
}


def run_cli(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=120)


def assert_bad_input(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: ")
    assert "Traceback" not in proc.stderr
    assert proc.stdout == ""
    return lines[0]


@pytest.mark.parametrize("name", sorted(BAD_FILES))
def test_cli_trace_bad_stream(tmp_path, name):
    bad = tmp_path / f"{name}.json"
    bad.write_text(BAD_FILES[name])
    out = tmp_path / "out"
    line = assert_bad_input(run_cli(["trace", "--engine", "reference", str(bad), "-o", str(out)],
                                    cwd=tmp_path))
    assert f"{name}.json" in line
    assert not out.exists() or not any(out.iterdir())
    assert sorted(p.name for p in tmp_path.iterdir()) == [bad.name]


def test_cli_trace_missing_file(tmp_path):
    out = tmp_path / "out"
    line = assert_bad_input(run_cli(["trace", "--engine", "reference", "nope.json", "-o",
                                     str(out)], cwd=tmp_path))
    assert "nope.json" in line
    assert not out.exists()


def test_cli_one_bad_stream_stops_all(tmp_path):
    """A good stream before a bad one: nothing is traced, nothing written."""
    good = tmp_path / "a-good.json"
    good.write_text(json.dumps(stream()))
    bad = tmp_path / "b-bad.json"
    bad.write_text(BAD_FILES["bad-config"])
    out = tmp_path / "out"
    line = assert_bad_input(run_cli(["trace", "--engine", "reference", str(good), str(bad),
                                     "-o", str(out)], cwd=tmp_path))
    assert "b-bad.json: config.num_gpu_blocks" in line
    assert not out.exists() or not any(out.iterdir())


def test_cli_check_bad_stream(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(BAD_FILES["runs-out"])
    assert_bad_input(run_cli(["check", str(bad)], cwd=tmp_path))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.json"]


def test_bad_input_never_imports_vllm(tmp_path):
    """Validation, and the CLI's bad-input path, run without importing vLLM."""
    bad = tmp_path / "bad.json"
    bad.write_text(BAD_FILES["unknown-field"])
    code = ("import sys; from harness.cli import main; "
            "rc = main(['trace', '--engine', 'vllm', sys.argv[1]]); "
            "assert rc == 2, rc; assert 'vllm' not in sys.modules, 'vllm imported'")
    proc = subprocess.run([sys.executable, "-c", code, str(bad)], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.startswith("error: ")


def test_cli_check_unknown_engine(tmp_path):
    good = tmp_path / "good.json"
    good.write_text(json.dumps(stream()))
    line = assert_bad_input(run_cli(["check", "--engines", "vllm,reference", str(good)],
                                    cwd=tmp_path))
    assert line.startswith("error: --engines: 'reference' is not a vLLM engine")
    assert list(tmp_path.iterdir()) == [good]


def test_cli_fuzz_and_coverage_unknown_engine(tmp_path):
    for command in ("fuzz", "coverage"):
        line = assert_bad_input(run_cli([command, "--engines", "vllm,gpu"], cwd=tmp_path))
        assert line.startswith("error: --engines: 'gpu' is not a vLLM engine")
    assert list(tmp_path.iterdir()) == []


def test_cli_fuzz_unknown_property(tmp_path):
    line = assert_bad_input(run_cli(["fuzz", "--property", "real_traffic"], cwd=tmp_path))
    assert line.startswith("error: --property: 'real_traffic' is not one of whole_space, ")
    assert "real_workloads" in line
    assert list(tmp_path.iterdir()) == []

def test_cli_capture_check_refuses_a_file_that_is_not_a_trace(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(stream()))  # a stream, not a trace
    out = tmp_path / "streams"
    line = assert_bad_input(run_cli(["capture-check", str(bad), "--streams-out", str(out)],
                                    cwd=tmp_path))
    assert line == f"error: {bad}: not a trace (needs engine, stream and steps; see docs/trace-format.md)"
    assert list(tmp_path.iterdir()) == [bad]  # no folder made
