"""Vidur 0.0.26 defect: Request.restart() leaves the stage counters set, so a preempted
request fails an assertion when it is prefilled again.

    .venvs/sim-vidur/bin/python examples/simulators/vidur_repro_restart.py

Imports only Vidur (pip install --no-deps vidur==0.0.26; no other package is needed).
Part 1 drives one Request through the calls Vidur's events make for a batch (a
BatchStage's on_stage_end for stage 0, then Batch.on_batch_end); part 2 runs the same
through VLLMReplicaScheduler, whose preemption calls restart().
"""

import os
import sys

# examples/simulators/vidur.py (the harness adapter) would shadow the vidur package.
_here = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _here]

import importlib.util  # noqa: E402
import traceback  # noqa: E402
import types  # noqa: E402

from vidur.entities import Batch, ExecutionTime, Request  # noqa: E402

ZERO = ExecutionTime(1, *[0.0] * 14)


def iteration(requests, num_q_tokens, t=0.0):
    """One batch, as ReplicaStageScheduleEvent / BatchStageEndEvent / BatchEndEvent run it."""
    batch = Batch(0, list(requests), list(num_q_tokens), list(num_q_tokens))
    batch.on_schedule(t)
    stage = batch.to_batch_stage(0, ZERO)
    stage.on_schedule(t)
    stage.on_stage_end(t)
    batch.on_batch_end(t)
    return batch


def part1():
    r = Request(arrived_at=0.0, num_prefill_tokens=4, num_decode_tokens=4)
    iteration([r], [4])          # prefill: 4 tokens, first output
    iteration([r], [1])          # one decode
    print("before restart:", r.size, "processed", r.num_processed_tokens,
          "stage processed", r.num_stage_processed_tokens)
    r.restart()                  # preempted (recompute): prefill is now the 6 tokens so far
    print("after restart: ", r.size, "processed", r.num_processed_tokens,
          "stage processed", r.num_stage_processed_tokens, "(expected 0)",
          "is_prefill_stage_complete", r.is_prefill_stage_complete, "(expected False)")
    iteration([r], [6])          # the recompute prefill


def _scheduler_classes():
    """The replica scheduler without vidur.scheduler's __init__ (it needs scikit-learn)."""
    root = os.path.dirname(importlib.util.find_spec("vidur").origin)
    for name in ("vidur.scheduler", "vidur.execution_time_predictor"):
        m = types.ModuleType(name)
        m.__path__ = [os.path.join(root, name.split(".")[1])]
        sys.modules[name] = m
    from vidur.execution_time_predictor.base_execution_time_predictor import \
        BaseExecutionTimePredictor
    sys.modules["vidur.execution_time_predictor"].BaseExecutionTimePredictor = \
        BaseExecutionTimePredictor
    from vidur import config
    from vidur.entities import Replica
    from vidur.scheduler.replica_scheduler.vllm_replica_scheduler import VLLMReplicaScheduler
    return config, Replica, VLLMReplicaScheduler


def part2():
    config, Replica, VLLMReplicaScheduler = _scheduler_classes()
    rc = config.ReplicaConfig(num_pipeline_stages=1, tensor_parallel_size=1)
    sched = VLLMReplicaScheduler(
        rc, config.VllmSchedulerConfig(batch_size_cap=4, max_tokens_in_batch=32),
        config.CacheConfig(block_size=4, num_blocks=4),
        config.TraceRequestGeneratorConfig(max_tokens=16), Replica(rc), 1, None)
    a, b = Request(0.0, 4, 8), Request(1.0, 4, 8)    # two requests fill the 4 blocks
    sched.add_request(a)
    sched.add_request(b)
    for step in range(6):
        batch = sched.on_schedule(float(step))
        print(f"step {step}: batch {list(zip(batch.request_ids, batch.num_q_tokens))}, "
              f"restarts a={a.num_restarts} b={b.num_restarts}")
        batch.on_schedule(float(step))
        stage = batch.to_batch_stage(0, ZERO)
        stage.on_schedule(float(step))
        stage.on_stage_end(float(step))
        sched.on_stage_end(0, stage)
        batch.on_batch_end(float(step))
        sched.on_batch_end(batch)


for part in (part1, part2):
    print(f"-- {part.__name__}")
    try:
        part()
        print("no failure")
    except AssertionError:
        frame = traceback.extract_tb(sys.exc_info()[2])[-1]
        print(f"AssertionError at {os.path.relpath(frame.filename, os.path.dirname(os.path.dirname(__import__('vidur').__file__)))}:"
              f"{frame.lineno}: {frame.line}")
