"""The conformance profile (harness.jobs.engine_profile): per family of rules, how an
engine fares, and which of vLLM's rules it breaks.

Done-when of the plug-in issue: the worked example's profile names exactly the two
rules it changes, through the module and through the line protocol; the reference
plugged in the same way gets a clean profile.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from harness.jobs.engine_profile import draw, profile
from harness.checks.diff import only_fields
from harness.formats.paths import ROOT
from harness.checks.properties import by_name

EXAMPLE = "examples.simplified_pool:SimplifiedPoolEngine"
REFERENCE = "harness.engines.reference_engine:ReferenceEngine"
FAMILIES = ["whole_space", "preemption", "prefix_caching", "stops_and_aborts"]

@pytest.fixture(autouse=True)
def _counterexamples_elsewhere(tmp_path, monkeypatch):
    """Divergences here are on purpose: what the commands keep goes to a temporary folder."""
    monkeypatch.setenv("HARNESS_COUNTEREXAMPLES", str(tmp_path / "counterexamples"))



def test_streams_are_drawn_the_same_every_time():
    assert draw(by_name("preemption"), 5) == draw(by_name("preemption"), 5)
    assert len(draw(by_name("preemption"), 5)) == 5


@pytest.mark.slow
def test_the_example_engine_is_named_for_exactly_the_rules_it_changes(tmp_path):
    p = profile(EXAMPLE, streams=10, families=FAMILIES, folder=tmp_path)
    assert p.rules == ["free_forward_order", "no_null_block"]
    assert not p.conforms
    by = {f.name: f for f in p.families}
    assert by["preemption"].diverge == 10 and by["preemption"].first.endswith("new_block_ids")
    assert sum(f.unexplained for f in p.families) == 0
    # One shrunk counterexample per family that diverges, small.
    kept = json.loads((tmp_path / "preemption.json").read_text())
    assert len(kept["requests"]) <= 2


def test_the_reference_plugged_in_gets_a_clean_profile():
    p = profile(REFERENCE, streams=10, families=FAMILIES)
    assert p.conforms and p.rules == []
    assert all(f.conform == f.streams for f in p.families)


def test_comparing_token_counts_only_leaves_block_ids_free():
    """With block ids free, the example still diverges where its extra page changes who
    is preempted, and conforms on the streams where it does not."""
    every = profile(EXAMPLE, streams=10, families=["preemption"], shrink_examples=False)
    counts = profile(EXAMPLE, streams=10, families=["preemption"], fields=["scheduled"],
                     shrink_examples=False)
    assert counts.fields == ("scheduled",)
    assert every.families[0].conform == 0
    assert 0 < counts.families[0].conform < counts.families[0].streams
    assert counts.families[0].first.endswith("scheduled")
    assert "compared: scheduled" in counts.text()


def test_only_fields_keeps_the_fields_and_the_verdict():
    trace = {"engine": "x", "kv_cache": {"num_blocks": 4}, "verdict": "completed",
             "steps": [{"scheduled": [["A", 4]], "new_block_ids": {"A": [[1]]}}]}
    kept = only_fields(trace, ["scheduled"])
    assert kept["steps"] == [{"scheduled": [["A", 4]]}] and "kv_cache" not in kept
    assert kept["verdict"] == "completed" and trace["steps"][0]["new_block_ids"]


def harness(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_the_profile_command_through_the_line_protocol(tmp_path):
    proc = harness("profile", "--engine", f"cmd:{sys.executable} -m harness serve {EXAMPLE}",
                   "--streams", "8", "--families", "preemption", "whole_space", "-o", str(tmp_path))
    assert proc.returncode == 1, proc.stderr
    assert "rules broken: free_forward_order, no_null_block" in proc.stdout.splitlines()
    assert "taken: 15 of 16 streams (94%)" in proc.stdout.splitlines()
    saved = json.loads((tmp_path / "profile.json").read_text())
    assert saved["rules_broken"] == ["free_forward_order", "no_null_block"]
    assert (tmp_path / "preemption.json").exists()


@pytest.mark.parametrize("args, says", [
    (["--fields", "scheduled,block_ids"], "--fields: block_ids not a step field"),
    (["--families", "teleportation"], "--families: no family teleportation"),
    (["--against", "sglang"], "--against: 'sglang' is not one of"),
    (["--streams", "0"], "--streams"),
])
def test_profile_bad_input_is_one_line_and_exit_2(args, says, tmp_path):
    proc = harness("profile", "--engine", EXAMPLE, "-o", str(tmp_path / "out"), *args)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and says in proc.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.needs_vllm
def test_the_profile_against_vllm_itself(vllm_engine):
    """25 streams of one family judged against vLLM's own runs: every one is taken and
    diverges for the example's two rules, and none for the reference."""
    p = profile(EXAMPLE, streams=25, families=["preemption"], against="vllm",
                shrink_examples=False)
    assert p.against == "vllm" and not p.conforms
    [family] = p.families
    assert family.streams == 25 and family.not_taken == 0
    assert family.diverge + family.conform == 25 and family.diverge >= 20
    assert family.unexplained == 0
    assert "no_null_block" in p.rules and set(p.rules) <= {"free_forward_order", "no_null_block"}
    clean = profile(REFERENCE, streams=25, families=["preemption"], against="vllm",
                    shrink_examples=False)
    assert clean.conforms and clean.families[0].conform == 25
