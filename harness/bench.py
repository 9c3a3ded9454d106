"""``python -m harness bench``: step speed of the reference against vLLM's own.

Speed is measured here, never asserted in a test.  The workload is one
generated stream on a large pool (a million pages by default): many requests
sharing prefixes, prefilled in chunks and then decoding, so that every step
touches the free queue, the prefix cache and the block tables.  Both engines
run the same stream through the same step loop; the loop's own cost (the
scripted model, the trace records) is included for both.
"""

from __future__ import annotations

import gc
import random
import time

from harness.engines import get_engine
from harness.runner import run
from harness.stream import parse_stream


def workload(num_blocks: int, num_requests: int, seed: int = 0) -> dict:
    rng = random.Random(seed)
    prefixes = [[rng.randrange(1000) for _ in range(rng.randrange(64, 512))] for _ in range(8)]
    requests = []
    for i in range(num_requests):
        prompt = rng.choice(prefixes) + [rng.randrange(1000) for _ in range(rng.randrange(16, 256))]
        output = [rng.randrange(1000) for _ in range(rng.randrange(32, 128))]
        requests.append({"id": f"r{i}", "prompt": prompt, "output": output,
                         "arrival_step": rng.randrange(0, 50)})
    return {"name": "bench", "config": {
        "block_size": 16, "num_gpu_blocks": num_blocks, "max_num_batched_tokens": 8192,
        "max_num_seqs": 256, "max_model_len": 4096, "max_steps": 100000}, "requests": requests}


class _Timed:
    """Wraps an engine; adds up the time its scheduler spends in its own step calls.

    Only the scheduler's ``schedule``, ``update_from_output`` and
    ``update_draft_token_ids`` are timed: the adapters' work (turning outputs
    into trace records, the worker block table) is left out on both sides.
    """

    SCHEDULER_CALLS = ("schedule", "update_from_output", "update_draft_token_ids")

    def __init__(self, engine):
        self._engine = engine
        self.seconds = {"start": 0.0, "step": 0.0}

    def __getattr__(self, name):
        return getattr(self._engine, name)

    def start(self, stream) -> None:
        gc.unfreeze()
        gc.collect()
        started = time.perf_counter()
        self._engine.start(stream)
        self.seconds["start"] += time.perf_counter() - started
        # The pool is a million long-lived objects on either side; keep the
        # cyclic collector from rescanning it, or its pauses swamp the steps.
        gc.freeze()
        sched = self._engine.sched
        for call in self.SCHEDULER_CALLS:
            setattr(sched, call, self._timed(getattr(sched, call)))

    def _timed(self, fn):
        def timed(*args, **kwargs):
            started = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds["step"] += time.perf_counter() - started
        return timed


def time_engine(engine, stream) -> tuple[float, float, int]:
    """(seconds to build the pool, seconds inside schedule/update, steps)."""
    timed = _Timed(engine)
    try:
        trace = run(timed, stream)
    finally:
        gc.unfreeze()
    assert trace.verdict == "completed", trace.failure
    return timed.seconds["start"], timed.seconds["step"], len(trace.steps)


def main(num_blocks: int = 1_000_000, num_requests: int = 512, repeats: int = 5) -> int:
    """Alternate the engines ``repeats`` times; report the median run of each."""
    import statistics
    stream = parse_stream(workload(num_blocks, num_requests))
    print(f"workload: {num_requests} requests, {num_blocks:,} pages of 16 tokens, "
          f"budget 8192 tokens, 256 seats; median of {repeats} runs per engine")
    runs: dict[str, list[tuple[float, float, int]]] = {"vllm": [], "reference": []}
    for _ in range(repeats):
        for name in runs:
            runs[name].append(time_engine(get_engine(name), stream))
    per_step = {}
    for name, results in runs.items():
        built = statistics.median(r[0] for r in results)
        ran = statistics.median(r[1] for r in results)
        steps = results[0][2]
        per_step[name] = ran / steps
        spread = ", ".join(f"{1000 * r[1] / steps:.2f}" for r in results)
        print(f"{name:>9}: pool built in {built:5.2f} s; {steps} steps; schedule+update "
              f"{1000 * ran / steps:6.3f} ms/step (runs: {spread})")
    print(f"reference step speed = {per_step['vllm'] / per_step['reference']:.2f}x vLLM's")
    return 0
