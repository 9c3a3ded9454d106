"""A campaign is the same whatever runs it: one process, forked workers, or Ray.

The chunks of a seed are fixed (harness/jobs/chunks.py); the workers only decide
where they run (harness/jobs/workers.py).  These tests hold the runners to that:
the same streams (a digest of every stream checked), the same rule counters,
and under a mutant the same shrunk counterexample, byte for byte.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from harness.jobs.chunks import CHUNK_STREAMS, Chunk, ChunkResult, Gathered, chunk_seed, chunks_of
from harness.formats.paths import ROOT


def result(index: int, diverged: bool = False, streams: int = 1) -> ChunkResult:
    return ChunkResult(index, {"streams": streams}, f"sha{index}", 0.1, 0.2, "w", 1.0,
                       divergence="differs" if diverged else None)


def test_chunks_cover_the_campaign_with_seeds_of_their_own():
    chunks = chunks_of(2 * CHUNK_STREAMS + 7, seed=11)
    assert [c.examples for c in chunks] == [CHUNK_STREAMS, CHUNK_STREAMS, 7]
    assert [c.index for c in chunks] == [0, 1, 2]
    assert chunks[0].seed == 11  # the first chunk is the campaign's own seed
    assert len({c.seed for c in chunks}) == 3
    assert chunks_of(2 * CHUNK_STREAMS + 7, seed=11) == chunks  # a function of the seed
    assert chunk_seed(12, 1) != chunk_seed(11, 1)
    assert [c.examples for c in chunks_of(300, 0, size=300)] == [300]  # the main job: one


def test_gathered_reads_the_results_as_if_the_chunks_ran_in_order():
    g = Gathered(chunks_of(5 * CHUNK_STREAMS, seed=1))
    g.add(result(3, diverged=True))
    assert g.cut == 3 and not g.complete
    assert g.wanted(2) and g.wanted(3) and not g.wanted(4)
    g.add(result(4))  # ran past the divergence: not part of the campaign
    g.add(result(0))
    g.add(result(2))
    assert not g.complete  # chunk 1 may still diverge first
    g.add(result(1, diverged=True))
    assert g.cut == 1 and g.complete
    assert [r.index for r in g.in_order()] == [0, 1]


def test_gathered_is_complete_with_every_chunk_in_or_lost():
    g = Gathered(chunks_of(3 * CHUNK_STREAMS, seed=1))
    g.add(result(0))
    g.add(result(2))
    assert not g.complete
    g.lost[1] = "worker ended with exit code -9"
    assert g.complete and g.cut == 3
    assert [r.index for r in g.in_order()] == [0, 2]


def fake_chunk(chunk: Chunk, profile, engines, folder, on_stream=None, stop=None) -> ChunkResult:
    """Stands for run_chunk in forked workers: chunk 1 dies the way an OOM kill ends a worker."""
    if chunk.index == 1:
        os._exit(9)
    if on_stream:
        on_stream(False)
    return result(chunk.index, streams=chunk.examples)


def test_a_forked_worker_that_dies_costs_its_chunk_not_the_campaign(monkeypatch, tmp_path):
    from harness.jobs import workers
    monkeypatch.setattr(workers, "run_chunk", fake_chunk)  # the children are forked after this
    chunks = chunks_of(4 * CHUNK_STREAMS, seed=3)
    g = Gathered(chunks)
    workers.run_forked(chunks, g, "dev", ("vllm",), tmp_path, lambda *a: None,
                       threading.Event(), workers=2)
    assert sorted(g.results) == [0, 2, 3]
    assert list(g.lost) == [1] and "exit code 9" in g.lost[1]


def fuzz(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> tuple[dict, bytes]:
    """``harness fuzz --json`` in a fresh process: its result and its counterexample."""
    cx = tmp_path / "counterexamples"
    done = subprocess.run(
        [sys.executable, "-m", "harness", "fuzz", "--json", *args], cwd=tmp_path,
        capture_output=True, text=True, timeout=900,
        env={**os.environ, "HARNESS_COUNTEREXAMPLES": str(cx), "PYTHONPATH": str(ROOT),
             **(env or {})})
    assert done.returncode in (0, 1), done.stderr[-3000:]
    kept = cx / "fuzz.json"
    out = json.loads(done.stdout)
    assert not (cx / ".fuzz-chunks").exists()  # the chunks' own files are cleaned up
    return out, kept.read_bytes() if kept.exists() else b""


def same_campaign(a: dict) -> dict:
    """What must not depend on the workers: all but the timings and the worker count."""
    return {k: v for k, v in a.items() if k not in ("seconds", "workers")}


#: Two chunks of the campaign (CHUNK_STREAMS and 10): enough for two workers to share.
CAMPAIGN = ("--examples", str(CHUNK_STREAMS + 10), "--seed", "21")


@pytest.fixture(scope="module")
def one_worker(tmp_path_factory):
    """The campaign on one worker, to hold the other runners to (its tests share a worker)."""
    one, _ = fuzz(tmp_path_factory.mktemp("one"), *CAMPAIGN, "--workers", "1")
    assert one["outcome"] == "clean" and one["streams_checked"] == CHUNK_STREAMS + 10
    return one


@pytest.mark.slow  # campaigns on several workers, under pytest, on Ray
@pytest.mark.needs_vllm
@pytest.mark.xdist_group("one_worker_campaign")
def test_two_workers_check_the_same_streams_as_one(tmp_path, one_worker):
    one = one_worker
    two, _ = fuzz(tmp_path, *CAMPAIGN, "--workers", "2")
    assert same_campaign(one) == same_campaign(two)
    assert (one["workers"], two["workers"]) == ("1", "2")


@pytest.mark.slow  # campaigns on several workers, under pytest, on Ray
@pytest.mark.needs_vllm
def test_two_workers_keep_the_same_counterexample_as_one_under_a_mutant(tmp_path):
    mutant = {"HARNESS_MUTANT": "free_forward_order"}
    # A seed whose divergence shrinks well inside hypothesis's five minutes: a shrink cut
    # short by that clock ends wherever the clock found it, on any number of workers.
    args = ("--examples", "150", "--seed", "4", "--profile", "ci")
    one, kept_one = fuzz(tmp_path, *args, "--workers", "1", env=mutant)
    two, kept_two = fuzz(tmp_path, *args, "--workers", "2", env=mutant)
    assert one["outcome"] == "diverged" and kept_one
    assert kept_one == kept_two
    assert same_campaign(one) == same_campaign(two)  # the report and its shrink runs too
    # The report names the kept file where the user finds it, not a chunk's own file.
    assert str(tmp_path / "counterexamples" / "fuzz.json") in two["divergence"]


@pytest.mark.slow  # campaigns on several workers, under pytest, on Ray
@pytest.mark.needs_vllm
@pytest.mark.xdist_group("one_worker_campaign")
def test_ray_checks_the_same_streams_as_one_worker(tmp_path, one_worker):
    pytest.importorskip("ray", reason="Ray comes with vLLM; without it --ray is not available")
    on_ray, _ = fuzz(tmp_path, *CAMPAIGN, "--ray")
    assert on_ray["workers"] == "ray"
    assert same_campaign(one_worker) == same_campaign(on_ray)


@pytest.mark.slow  # campaigns on several workers, under pytest, on Ray
@pytest.mark.needs_vllm
def test_pytest_on_two_workers_keeps_the_same_counterexamples_as_one(tmp_path):
    """``pytest -n 2 -k conformance`` under a mutant leaves the counterexamples of ``-n 0``:
    the ci profile draws the same streams in an xdist worker as in one process, whatever
    else the worker has imported (profiles.pin_local_constants)."""
    kept = {}
    for n in ("0", "2"):
        folder = tmp_path / f"n{n}"
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", n,
             "tests/test_conformance.py", "-k", "test_conformance_preemption"],
            cwd=ROOT, capture_output=True, text=True, timeout=900,
            env={**{k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")},
                 "CI": "true", "HARNESS_MUTANT": "evict_from_tail",
                 "HARNESS_COUNTEREXAMPLES": str(folder)})
        assert done.returncode == 1 and "1 failed" in done.stdout, done.stdout[-3000:]
        kept[n] = {p.name: p.read_bytes() for p in sorted(folder.glob("*.json"))}
    assert list(kept["0"]) == ["test_conformance_preemption.json"]
    assert kept["0"] == kept["2"]
