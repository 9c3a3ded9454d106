"""The replay tier: the reference against vLLM's recorded traces, without vLLM.

Runs in an environment with no vLLM at all.  Each release the reference
describes has its folder ``fixtures/traces/vllm-<release>/`` (0.11.0's recorded
by ``make record``, the later ones by ``make upgrade-check VLLM=<release>``),
and each trace is replayed by the reference with that release's rules: this is
how the per-release rule changes are tested in CI without those releases
installed.
"""

from __future__ import annotations

import json

import pytest

from harness.checks.diff import report
from harness.checks.golden import StaleTrace, replay_one, verify
from harness.formats.paths import STREAMS_DIR, TRACES_DIR, golden_dir
from reference import releases

RECORDED = [r for r in releases.RELEASES if golden_dir(r).is_dir()]
ALL_TRACES = [p for r in RECORDED for p in sorted(golden_dir(r).glob("*.json"))]
TRACES = sorted(golden_dir("0.11.0").glob("*.json"))

pytestmark = pytest.mark.conformance


@pytest.mark.parametrize("path", ALL_TRACES, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_conformance_replay_recorded_trace(path):
    divergence, golden, mine = replay_one(path)
    assert divergence is None, f"{path.name}: {report(golden, mine, divergence)}"


@pytest.mark.parametrize("release", RECORDED)
def test_every_bundled_stream_has_a_recorded_trace(release):
    missing = [p.stem for p in sorted(STREAMS_DIR.glob("*.json"))
               if not (golden_dir(release) / p.name).exists()]
    assert not missing, f"record them ({release}): {missing}"


def test_only_described_releases_are_recorded():
    folders = {p.name for p in TRACES_DIR.iterdir() if p.is_dir()}
    assert folders == {f"vllm-{r}" for r in RECORDED}
    assert "0.11.0" in RECORDED


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
