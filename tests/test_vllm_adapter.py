"""The vLLM engine's hooks on the real scheduler (vLLM 0.11.0)."""

from __future__ import annotations

import pytest

from harness.formats.stream import parse_stream
from tests.stream_builders import req, stream

pytestmark = [pytest.mark.needs_vllm]


def test_requests_finished_together_free_their_pages_in_arrival_order(vllm_engine):
    """vLLM frees the requests of one ``finish_requests`` call in the order of a set of
    their ids (the process's string hash); the engine finishes them one by one in arrival
    order, so six requests failed together always free their pages in that order."""
    from harness.engines.vllm_adapter import RequestStatus
    ids = ["f", "b", "e", "a", "d", "c"]
    s = parse_stream(stream({"max_num_batched_tokens": 64, "max_num_seqs": 8},
                            [req(i, prompt=[n + 1] * 8, output=[4, 5]) for n, i in enumerate(ids)]))
    vllm_engine.start(s)
    for n, spec in enumerate(s.requests):
        vllm_engine.add(spec, n)
    assert len(vllm_engine.schedule().scheduled) == 6
    kvm = vllm_engine.sched.kv_cache_manager
    pages = {i: list(kvm.get_block_ids(i)[0]) for i in ids}
    vllm_engine.sched.finish_requests(sorted(ids), RequestStatus.FINISHED_ABORTED)
    free = [b.block_id for b in kvm.block_pool.free_block_queue.get_all_free_blocks()]
    assert free[-12:] == [p for i in ids for p in reversed(pages[i])]
