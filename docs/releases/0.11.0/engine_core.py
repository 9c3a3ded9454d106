"""The engine loop's rules that show in a trace: when a step applies a batch's output.

Mirrors: vllm/v1/engine/core.py (EngineCore.step, step_with_batch_queue,
``max_concurrent_batches`` of vLLM's executors).

Without async scheduling or pipeline parallelism a step schedules, runs the
model and applies its output at once.  With either, EngineCore keeps a queue of
batches in flight: a step schedules a batch (if the scheduler holds any
request) and hands it to the worker without waiting; it applies the oldest
batch's output only when it has to -- the queue is full, the new batch runs no
work, or the worker is already done with it (from 0.23.0: only when the queue is
full or no request is left to schedule).  Under pipeline parallelism the
scheduler is the synchronous one: a request whose batch is in flight has no
token to schedule until that batch's output is applied.
"""

from __future__ import annotations


def batch_queue_size(async_scheduling: bool, pipeline_parallel_size: int = 1) -> int:
    """Batches in flight at most, as vLLM's executors report them: two under async
    scheduling (one on the worker, one being scheduled), else one per pipeline stage."""
    return 2 if async_scheduling else pipeline_parallel_size


def applies_oldest_now(in_flight: int, queue_size: int, runs_work: bool,
                       worker_done: bool) -> bool:
    """After a step scheduled a batch (``in_flight`` counts it): does the step wait for
    the oldest batch and apply its output?  Not while the new batch runs work, the queue
    has room for another and the worker is still busy with the oldest."""
    return not (runs_work and in_flight < queue_size and not worker_done)


def applies_oldest_when_full(in_flight: int, queue_size: int, runs_work: bool,
                             still_has_requests: bool) -> bool:
    """The same question from 0.23.0 (releases.batch_queue_fills_before_applying): the
    step applies the oldest batch only once the queue is full, or when the scheduler is
    left with no request.  Whether the worker is done no longer matters, and an empty
    batch waits in the queue like any other while requests remain."""
    return not (in_flight < queue_size and (runs_work or still_has_requests))
