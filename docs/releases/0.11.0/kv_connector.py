"""The scheduler's side of a KV connector: what it asks, and what it is told back.

Mirrors: vllm/distributed/kv_transfer/kv_connector/v1/base.py (the
scheduler-side methods of KVConnectorBase_V1) and their calls in
vllm/v1/core/sched/scheduler.py.

A KV connector moves KV pages between this engine and somewhere else: a
prefill node in disaggregated serving, an offload store.  The scheduler
drives it through four calls and one report:

* ``get_num_new_matched_tokens(request, num_local_hit)`` -- when a waiting
  request with nothing computed is considered: how many tokens past the
  local prefix hit can be loaded from outside, and whether the load is
  asynchronous.  ``None`` means "cannot tell yet": the request is set aside
  for this step.
* ``update_state_after_alloc(request, block_ids, num_external_tokens)`` --
  right after the request got its pages: the pages (hit pages first) that
  the loaded tokens go into.
* ``request_finished(request, block_ids)`` -- when a request finishes or is
  aborted, before its pages are freed: whether to keep them (``True``: the
  connector still sends them; they are freed when the worker reports the
  send done).
* the worker's report in each step's output: ``finished_recving`` (loads
  done: the request may run from the next step on) and ``finished_sending``
  (sends done: the kept pages are freed now).

A request whose load is asynchronous gets its pages at once and waits in
WAITING_FOR_REMOTE_KVS, set aside every step, until the worker reports the
load done.  Then it counts every token its pages cover as computed (all
pages, hits and loads, times the page size, capped at its tokens; if that
is all of them, all but the last), caches those pages, and is scheduled
like a new request from there.
"""

from __future__ import annotations

from typing import Protocol

from reference.request import Request


class KVConnector(Protocol):
    """What the scheduler calls; the harness provides a scripted one."""

    def get_num_new_matched_tokens(self, request: Request,
                                   num_local_hit: int) -> tuple[int | None, bool]: ...

    def update_state_after_alloc(self, request: Request, block_ids: list[int],
                                 num_external_tokens: int) -> None: ...

    def request_finished(self, request: Request, block_ids: list[int]) -> bool: ...


def tokens_after_load(num_pages: int, block_size: int, num_tokens: int) -> int:
    """The computed count of a request whose asynchronous load is done (up to 0.17.1):
    every token its pages cover, capped at its tokens, and the last token is always
    computed again."""
    return last_token_computed_again(min(num_pages * block_size, num_tokens), num_tokens)


def last_token_computed_again(computed: int, num_tokens: int) -> int:
    """A load that covers every token leaves the last one to compute: its logits give
    the next token."""
    return computed - 1 if computed == num_tokens else computed
