"""The scripted model: what the "GPU" says at each step, read off the stream.

A scheduled request whose prefill is complete after this step (its computed
tokens plus the tokens scheduled now reach its prompt + outputs so far) emits
its next true output tokens; a partial prefill emits nothing, as vLLM's model
runner discards the token it samples for one.  With ``m`` scheduled drafts the
model verifies them against the script: it emits ``output[n : n + a + 1]``,
where ``a`` is how many leading drafts equal ``output[n : n + m]``.

Under async scheduling a request may hold ``p`` output placeholders: tokens
sampled by batches still in flight.  Its prefill is then complete when the
grant reaches them too, and it emits ``output[n + p]``.
"""

from __future__ import annotations

from harness.formats.steps import Scheduled
from harness.formats.stream import RequestSpec


def accepted_prefix(drafts: list[int], truth: tuple[int, ...]) -> int:
    """Number of leading draft tokens that match the true continuation."""
    a = 0
    for d, t in zip(drafts, truth):
        if d != t:
            break
        a += 1
    return a


def sample(scheduled: Scheduled, requests: dict[str, RequestSpec]) -> dict[str, list[int]]:
    """Tokens each scheduled request emits this step (absent: emits nothing)."""
    emitted: dict[str, list[int]] = {}
    for req_id, n in scheduled.scheduled:
        pending = scheduled.placeholders.get(req_id, 0)
        if scheduled.computed_before[req_id] + n < scheduled.num_tokens[req_id] + pending:
            continue  # partial prefill
        script = requests[req_id].output
        done = scheduled.num_outputs[req_id] + pending
        drafts = scheduled.spec_tokens.get(req_id, [])
        a = accepted_prefix(drafts, script[done:done + len(drafts)])
        emitted[req_id] = list(script[done:done + a + 1])
    return emitted
