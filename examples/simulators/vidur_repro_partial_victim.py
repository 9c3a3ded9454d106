"""Vidur 0.0.26 defect: SarathiReplicaScheduler can preempt a request in the middle of its
chunked prefill, and Request.restart() then makes the rest of its prompt decode tokens.

    .venvs/sim-vidur/bin/python examples/simulators/vidur_repro_partial_victim.py

Imports only Vidur (pip install --no-deps vidur==0.0.26).  A (4-token prompt, 8 outputs)
and B (16-token prompt, 2 outputs) arrive together; chunk size 5, 5 blocks of 4.  Batch 0:
A 4, B 1 (B's 4 blocks reserved at admission: the pool is full).  Batch 1: A's decode
needs a block; the victim is B, which has processed 1 of its 16 prompt tokens.
Run 1: as shipped, it fails an assertion (the stage counters restart() leaves set).
Run 2: with restart() also resetting the stage counters, B's prompt becomes 1 token and
its 15 other prompt tokens are processed as decode tokens, one per batch.
"""

import importlib.util
import os
import sys
import traceback
import types

_here = os.path.dirname(os.path.abspath(__file__))  # examples/simulators/vidur.py shadows vidur
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _here]

root = os.path.dirname(importlib.util.find_spec("vidur").origin)
for name in ("vidur.scheduler", "vidur.execution_time_predictor"):  # their __init__s need sklearn
    m = types.ModuleType(name)
    m.__path__ = [os.path.join(root, name.split(".")[1])]
    sys.modules[name] = m
from vidur.execution_time_predictor.base_execution_time_predictor import \
    BaseExecutionTimePredictor  # noqa: E402
sys.modules["vidur.execution_time_predictor"].BaseExecutionTimePredictor = \
    BaseExecutionTimePredictor
from vidur import config  # noqa: E402
from vidur.entities import ExecutionTime, Replica, Request  # noqa: E402
from vidur.scheduler.replica_scheduler.sarathi_replica_scheduler import \
    SarathiReplicaScheduler  # noqa: E402

ZERO = ExecutionTime(1, *[0.0] * 14)


class StageCountersReset(Request):
    def restart(self):
        super().restart()
        self._num_stage_processed_tokens = 0
        self._is_prefill_stage_complete = False


def run(request_class):
    rc = config.ReplicaConfig(num_pipeline_stages=1, tensor_parallel_size=1)
    sched = SarathiReplicaScheduler(
        rc, config.SarathiSchedulerConfig(batch_size_cap=2, chunk_size=5),
        config.CacheConfig(block_size=4, num_blocks=5),
        config.TraceRequestGeneratorConfig(max_tokens=20), Replica(rc), 1, None)
    a, b = request_class(0.0, 4, 8), request_class(1.0, 16, 2)
    names = {a.id: "A", b.id: "B"}
    sched.add_request(a)
    sched.add_request(b)
    for step in range(8):
        batch = sched.on_schedule(float(step))
        if batch is None:
            break
        print(f"  batch {step}: {[(names[r.id], q) for r, q in zip(batch.requests, batch.num_q_tokens)]}"
              f"  B: size (prefill, decode) {b.size}, restarts {b.num_restarts}")
        batch.on_schedule(float(step))
        stage = batch.to_batch_stage(0, ZERO)
        stage.on_schedule(float(step))
        stage.on_stage_end(float(step))
        sched.on_stage_end(0, stage)
        batch.on_batch_end(float(step))
        sched.on_batch_end(batch)


for label, cls in (("as shipped", Request), ("restart() also resets stage counters", StageCountersReset)):
    print(f"-- {label}")
    try:
        run(cls)
        print("  B's prompt was 16 tokens; expected size after restart (16, 2), and chunks of up to 5")
    except AssertionError as e:
        frame = traceback.extract_tb(sys.exc_info()[2])[-1]
        print(f"  AssertionError at vidur/{os.path.relpath(frame.filename, root)}:{frame.lineno}: {e}")
