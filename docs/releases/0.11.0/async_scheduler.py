"""The async scheduler: the next batch is scheduled before the last one's tokens are back.

Mirrors: vllm/v1/core/sched/async_scheduler.py (AsyncScheduler), which vLLM
runs with ``--async-scheduling`` under EngineCore's batch queue
(``step_with_batch_queue``, two batches at most: one on the worker, one
being scheduled).

When a step's grant reaches the end of a request's known tokens, the model
will sample a token there that the scheduler does not have yet.  The request
then holds an *output placeholder* for it: the next step already schedules the
position after it (``running_tokens`` counts placeholders as tokens to
compute), and when the batch's output is applied the placeholder turns into
the real token.  Only then are the pages that the real tokens fill put in the
prefix cache: the placeholders' positions have no hash yet.

The price is one position scheduled too many when a request stops: the batch
after its last token was scheduled before the stop was known.
"""

from __future__ import annotations

from reference.output import SchedulerOutput
from reference.request import Request, RequestStatus
from reference.scheduler import Scheduler


class AsyncScheduler(Scheduler):
    def _advance_computed_tokens(self, output: SchedulerOutput) -> None:
        super()._advance_computed_tokens(output)
        for req_id in output.num_scheduled_tokens:
            request = self.requests[req_id]
            if samples_now(request):
                request.num_output_placeholders += 1

    def _append_outputs(self, request: Request, tokens: list[int]) -> tuple[list[int], bool]:
        """The tokens take their placeholders' places; a request still running gets the
        pages they complete cached.  One preempted since the batch was scheduled has
        given its pages back and caches nothing."""
        was_running = request.status == RequestStatus.RUNNING
        kept, stopped = super()._append_outputs(request, tokens)
        request.num_output_placeholders -= len(kept)
        assert request.num_output_placeholders >= 0
        if was_running:
            self.kv.cache_blocks(request,
                                 request.num_computed_tokens - request.num_output_placeholders)
        return kept, stopped


def samples_now(request: Request) -> bool:
    """The step's grant reached the last position scheduled so far, so the model samples
    a token there: every known token and every placeholder is computed."""
    return request.num_computed_tokens == request.num_tokens + request.num_output_placeholders
