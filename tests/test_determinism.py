"""The same stream gives byte-identical traces across runs and processes, whatever PYTHONHASHSEED."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
STREAMS = ROOT / "fixtures" / "streams"


def trace_bytes(engine: str, seed: str) -> bytes:
    env = dict(os.environ, PYTHONHASHSEED=seed)
    done = subprocess.run([sys.executable, "-m", "harness", "trace", "--engine", engine, str(STREAMS)],
                          cwd=ROOT, env=env, capture_output=True, timeout=300)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    return done.stdout


def test_reference_traces_are_byte_identical_across_processes():
    assert trace_bytes("reference", "0") == trace_bytes("reference", "12345")


@pytest.mark.needs_vllm
def test_vllm_traces_are_byte_identical_across_processes():
    first = trace_bytes("vllm", "1")
    assert first == trace_bytes("vllm", "random")
    assert len(first) > 0
