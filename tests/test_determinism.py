"""The same stream gives byte-identical traces across runs and processes, whatever PYTHONHASHSEED."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from harness.checks.golden import recorded_crashes

ROOT = Path(__file__).resolve().parent.parent
STREAMS = ROOT / "fixtures" / "streams"


def trace_bytes(engine: str, seed: str, tmp_path: Path) -> bytes:
    """The traces of every bundled stream; the engine fails on exactly the streams that
    crash vLLM 0.11.0 (a crash is part of the trace), and only on those."""
    env = dict(os.environ, PYTHONHASHSEED=seed, HARNESS_COUNTEREXAMPLES=str(tmp_path))
    done = subprocess.run([sys.executable, "-m", "harness", "trace", "--engine", engine, str(STREAMS)],
                          cwd=ROOT, env=env, capture_output=True, timeout=300)
    stderr = done.stderr.decode()
    failed = set(re.findall(r"^(\S+): \w+ failed at step", stderr, re.MULTILINE))
    assert failed == recorded_crashes() and done.returncode == 1, stderr[-2000:]
    return done.stdout


def test_reference_traces_are_byte_identical_across_processes(tmp_path):
    assert trace_bytes("reference", "0", tmp_path) == trace_bytes("reference", "12345", tmp_path)


@pytest.mark.slow
@pytest.mark.needs_vllm
def test_vllm_traces_are_byte_identical_across_processes(tmp_path):
    first = trace_bytes("vllm", "1", tmp_path)
    assert first == trace_bytes("vllm", "random", tmp_path)
    assert len(first) > 0
