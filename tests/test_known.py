"""Known divergences are reported by name and reason, and can be made strict."""

from __future__ import annotations

import json

import pytest

from harness import known
from harness.conformance import Divergent, KnownDivergent, assert_conforms
from harness.paths import STREAMS_DIR
from harness.mutants import find


@pytest.fixture(autouse=True)
def _counterexamples_elsewhere(tmp_path, monkeypatch):
    """These tests provoke divergences on purpose: their counterexamples go to a temporary folder."""
    monkeypatch.setenv("HARNESS_COUNTEREXAMPLES", str(tmp_path / "counterexamples"))


def test_no_known_divergence_for_the_mirrored_version():
    assert not [k for k in known.KNOWN if "0.11.0" in k.vllm_versions]


def test_matching_by_version_and_stream():
    entry = known.KnownDivergence("x", "because", ("9.9.9",), lambda s: s["config"]["policy"] == "priority")
    stream = {"config": {"policy": "priority"}}
    assert known.matching("9.9.9", stream, [entry]) is entry
    assert known.matching("0.11.0", stream, [entry]) is None
    assert known.matching("9.9.9", {"config": {"policy": "fcfs"}}, [entry]) is None


@pytest.mark.needs_vllm
def test_an_upgrade_divergence_is_named_or_strict(vllm_engine, monkeypatch):
    """Simulate an upgrade that stopped honouring stop tokens, then name it."""
    data = json.loads((STREAMS_DIR / "stop_token_ids_drop_after.json").read_text())
    upgrade = find("vllm_stop_tokens_ignored")
    entry = known.KnownDivergence("stop_tokens_ignored", "the upgrade ignores stop_token_ids",
                                  ("0.11.0",), lambda s: True)
    monkeypatch.setattr(known, "KNOWN", [entry])
    with upgrade.patch():
        with pytest.raises(KnownDivergent, match="known divergence stop_tokens_ignored"):
            assert_conforms(data, label="known-test")
        monkeypatch.setenv("HARNESS_KNOWN", "fail")
        with pytest.raises(Divergent) as info:
            assert_conforms(data, label="known-test")
        assert not isinstance(info.value, KnownDivergent)
