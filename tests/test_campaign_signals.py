"""A campaign stopped by SIGINT (Ctrl-C) or SIGTERM: within a second, with its summary,
its counterexample kept, exit 130.  Real signals, sent to a real ``python -m harness fuzz``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.formats.paths import ROOT
from harness.formats.stream import load_stream

pytestmark = [pytest.mark.needs_vllm, pytest.mark.slow]


def start_fuzz(tmp_path: Path, *args: str, env: dict[str, str] | None = None):
    err = (tmp_path / "stderr").open("w")
    out = (tmp_path / "stdout").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "harness", "fuzz", *args], cwd=tmp_path, stdout=out, stderr=err,
        env={**os.environ, "HARNESS_COUNTEREXAMPLES": str(tmp_path / "counterexamples"),
             "PYTHONPATH": str(ROOT), **(env or {})})
    return proc


def wait_for(tmp_path: Path, proc, text: str, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if text in (tmp_path / "stderr").read_text():
            return
        if proc.poll() is not None:
            pytest.fail(f"fuzz ended before {text!r}: {(tmp_path / 'stderr').read_text()[-2000:]}")
        time.sleep(0.1)
    proc.kill()
    pytest.fail(f"no {text!r} within {timeout} s")


def stop_and_time(proc, signum) -> float:
    sent = time.monotonic()
    proc.send_signal(signum)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail("the campaign did not stop within 30 s")
    return time.monotonic() - sent


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_signal_stops_the_campaign_with_its_summary(tmp_path, signum):
    proc = start_fuzz(tmp_path, "--examples", "100000", "--seed", "3")
    wait_for(tmp_path, proc, "0/100000 streams")
    time.sleep(2)  # let it check some streams
    took = stop_and_time(proc, signum)
    out = (tmp_path / "stdout").read_text()
    assert proc.returncode == 130, (tmp_path / "stderr").read_text()[-2000:]
    assert took < 2.0, f"took {took:.1f} s to stop"  # "within a second", plus process exit
    assert out.startswith("summary: streams=")
    assert "interrupted after" in out and "of 100000 streams" in out
    assert "Traceback" not in (tmp_path / "stderr").read_text()


def test_interrupt_while_shrinking_keeps_the_counterexample(tmp_path):
    proc = start_fuzz(tmp_path, "--examples", "1000", "--seed", "3",
                      env={"HARNESS_MUTANT": "free_forward_order"})
    wait_for(tmp_path, proc, "shrinking it")
    took = stop_and_time(proc, signal.SIGINT)
    assert proc.returncode == 130
    assert took < 2.0, f"took {took:.1f} s to stop"
    out = (tmp_path / "stdout").read_text()
    assert "interrupted after" in out and "counterexamples/fuzz.json" in out
    kept = tmp_path / "counterexamples" / "fuzz.json"
    stream = load_stream(kept)  # a whole, valid stream: written atomically
    assert stream.requests and json.loads(kept.read_text())["config"]


def test_a_drawn_seed_is_printed_before_the_campaign_runs(tmp_path):
    """``make soak`` draws a new seed each night: the seed is on stderr before any stream
    is checked, so a run killed by a job's time limit can still be run again."""
    import re
    proc = start_fuzz(tmp_path, "--examples", "100000", "--json")
    wait_for(tmp_path, proc, "drawn seed")
    printed = re.search(r"drawn seed (\d+) \(--seed \1 runs",
                        (tmp_path / "stderr").read_text())
    assert printed is not None
    wait_for(tmp_path, proc, "0/100000 streams")
    stop_and_time(proc, signal.SIGINT)
    assert proc.returncode == 130
    assert json.loads((tmp_path / "stdout").read_text())["seed"] == int(printed.group(1))
