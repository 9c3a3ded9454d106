"""``make conformance``: the main job, with one verdict at the end.

Three parts: every bundled stream of ``fixtures/streams`` through vLLM and the
reference; a fixed-seed hypothesis campaign; the seed example as a table of
vLLM's run.  The verdict is CONFORMS only when every part is clean.
"""

from __future__ import annotations

import sys

from harness.campaign import fuzz
from harness.conformance import check_streams
from harness.engines import get_engine
from harness.paths import STREAMS_DIR
from harness.runner import run
from harness.stream import load_stream
from harness.table import render

SEED_STREAM = STREAMS_DIR / "seed_eos_4_1_1.json"


def main(examples: int = 300) -> int:
    print("== bundled scenarios (fixtures/streams): vLLM vs reference")
    streams = [load_stream(p) for p in sorted(STREAMS_DIR.glob("*.json"))]
    ok, total = check_streams(streams, quiet=True)
    print(f"{ok}/{total} streams equal")
    print(f"\n== hypothesis campaign ({examples} streams)")
    fuzz_status = fuzz(examples=examples, seed=0, profile=None)
    vllm = get_engine("vllm")
    if SEED_STREAM.exists():
        print("\n== the seed example, step by step (real vLLM)")
        print(render(run(vllm, load_stream(SEED_STREAM)).to_json()))
    good = ok == total and fuzz_status == 0
    print(f"\nVERDICT: {'CONFORMS' if good else 'DIVERGES'} -- reference vs vLLM {vllm.version()}: "
          f"{ok}/{total} bundled streams equal, campaign of {examples} streams "
          f"{'clean' if fuzz_status == 0 else 'found a divergence'}")
    sys.stdout.flush()
    return 0 if good else 1
