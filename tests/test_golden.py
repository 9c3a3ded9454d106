"""The replay tier: the reference against vLLM's recorded traces, without vLLM.

Runs in an environment with no vLLM at all; the traces were recorded by
``python -m harness record fixtures/streams -o fixtures/traces/vllm-0.11.0/``.
"""

from __future__ import annotations

import json

import pytest

from harness.diff import report
from harness.golden import StaleTrace, replay_one, verify
from harness.paths import STREAMS_DIR

TRACES_DIR = STREAMS_DIR.parent / "traces" / "vllm-0.11.0"
TRACES = sorted(TRACES_DIR.glob("*.json"))

pytestmark = pytest.mark.conformance


@pytest.mark.parametrize("path", TRACES, ids=lambda p: p.stem)
def test_conformance_replay_recorded_trace(path):
    divergence, golden, mine = replay_one(path)
    assert divergence is None, f"{path.name}: {report(golden, mine, divergence)}"


def test_every_bundled_stream_has_a_recorded_trace():
    missing = [p.stem for p in sorted(STREAMS_DIR.glob("*.json"))
               if not (TRACES_DIR / p.name).exists()]
    assert not missing, f"record them: make record ({missing})"


def test_hand_edited_trace_is_refused():
    golden = json.loads(TRACES[0].read_text())
    golden["steps"][0]["scheduled"][0][1] += 1
    with pytest.raises(StaleTrace, match="edited"):
        verify(golden)


def test_stale_trace_is_refused():
    golden = json.loads(TRACES[0].read_text())
    golden["stream"]["requests"][0]["prompt"].append(1)
    with pytest.raises(StaleTrace, match="stream"):
        verify(golden)
