"""``make conformance``: the main job, with one verdict at the end.

Six parts: every bundled stream of ``fixtures/streams`` through vLLM and the
reference; the KV sizing of every bundled model (``fixtures/models``), the
reference's against vLLM's own computation; the recorded vLLM traces of every
described release (``fixtures/traces``) replayed against the reference stating
that release, so each rule change of a later release is checked too; a
fixed-seed hypothesis campaign of the whole space, and one over windows of the
bundled real traces (property ``real_workloads``, fixtures/workloads); the seed example as a table of vLLM's run (its KB figures from vLLM's KV cache
spec).  The verdict is CONFORMS only when every part is clean.
"""

from __future__ import annotations

import sys

from harness.jobs.campaign import MAIN_JOB_EXAMPLES, MAIN_JOB_SEED, fuzz
from harness.checks.conformance import check_streams
from harness.engines import get_engine
from harness.checks.golden import replay_all_releases
from harness.checks.kv_sizing import report as kv_sizing_report
from harness.formats.paths import STREAMS_DIR
from harness.loop.runner import run
from harness.formats.stream import load_stream
from harness.checks.seed_table import render

SEED_STREAM = STREAMS_DIR / "seed_eos_4_1_1.json"
#: Streams of the real-traffic campaign (about 60 a second on 2 cores).
REAL_TRAFFIC_EXAMPLES = 200


def main(examples: int = MAIN_JOB_EXAMPLES) -> int:
    print("== bundled scenarios (fixtures/streams): vLLM vs reference")
    streams = [load_stream(p) for p in sorted(STREAMS_DIR.glob("*.json"))]
    ok, total = check_streams(streams, quiet=True)
    print(f"{ok}/{total} streams equal")
    print("\n== KV sizing (fixtures/models): vLLM vs reference")
    kv_text, kv_ok, kv_total = kv_sizing_report({s.config.block_size for s in streams})
    print(kv_text)
    print("\n== recorded vLLM traces of every described release (fixtures/traces): replayed")
    rec_ok, rec_total, rec_bad = replay_all_releases()
    print("\n".join([f"  differs: {line}" for line in rec_bad]
                    + [f"{rec_ok}/{rec_total} recorded traces match the reference of their release"]))
    print(f"\n== hypothesis campaign ({examples} streams)")
    fuzz_status = fuzz(examples=examples, seed=MAIN_JOB_SEED, profile=None,
                       chunk_streams=examples)
    print(f"\n== real traffic: {REAL_TRAFFIC_EXAMPLES} windows of the bundled Mooncake and "
          "Azure traces (fixtures/workloads)")
    real_status = fuzz(examples=REAL_TRAFFIC_EXAMPLES, seed=MAIN_JOB_SEED, profile=None,
                       chunk_streams=REAL_TRAFFIC_EXAMPLES, prop="real_workloads")
    vllm = get_engine("vllm")
    if SEED_STREAM.exists():
        print("\n== the seed example, step by step (real vLLM)")
        print(render(run(vllm, load_stream(SEED_STREAM)).to_json()))
    good = (ok == total and kv_ok == kv_total and rec_ok == rec_total and fuzz_status == 0
            and real_status == 0)
    print(f"\nVERDICT: {'CONFORMS' if good else 'DIVERGES'} -- reference vs vLLM {vllm.version()}: "
          f"{ok}/{total} bundled streams equal, {kv_ok}/{kv_total} KV sizing checks equal, "
          f"{rec_ok}/{rec_total} recorded traces replay, campaign of {examples} streams "
          f"{'clean' if fuzz_status == 0 else 'found a divergence'}, {REAL_TRAFFIC_EXAMPLES} "
          f"real-traffic windows {'clean' if real_status == 0 else 'found a divergence'}")
    sys.stdout.flush()
    return 0 if good else 1
