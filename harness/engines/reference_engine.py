"""The clean-room reference behind the engine interface.  Never imports vLLM."""

from __future__ import annotations

from reference import events
from reference.config import Config
from reference.request import Request, RequestStatus
from reference.scheduler import Scheduler
from reference.slot_mapping import WorkerBlockTable

from harness.engines.base import RequestState, Scheduled
from harness.stream import RequestSpec, Stream
from harness.trace import slot_ranges

MIRRORED_VLLM_VERSION = "0.11.0"


def reference_config(stream: Stream) -> Config:
    c = stream.config
    return Config(
        block_size=c.block_size, num_blocks=c.num_gpu_blocks,
        max_num_batched_tokens=c.max_num_batched_tokens, max_num_seqs=c.max_num_seqs,
        max_model_len=c.max_model_len, enable_chunked_prefill=c.enable_chunked_prefill,
        enable_prefix_caching=c.enable_prefix_caching,
        long_prefill_token_threshold=c.long_prefill_token_threshold, policy=c.policy,
        num_speculative_tokens=c.num_speculative_tokens,
        use_eagle=c.num_speculative_tokens > 0 and c.speculative_method == "eagle")


class Recorder:
    """Collects the reference's trace events for one step."""

    def __init__(self) -> None:
        self.clear()

    def clear(self) -> None:
        self.preempted: list[str] = []
        self.hits: dict[str, int] = {}
        self.evicted: list[int] = []

    def __call__(self, event: events.Event) -> None:
        if isinstance(event, events.Preempted):
            self.preempted.append(event.request_id)
        elif isinstance(event, events.PrefixLookup):
            self.hits[event.request_id] = event.num_hit_tokens
        elif isinstance(event, events.CachedBlockEvicted):
            self.evicted.append(event.block_id)


class ReferenceEngine:
    name = "reference"

    def version(self) -> str:
        return MIRRORED_VLLM_VERSION

    def start(self, stream: Stream) -> None:
        self.config = reference_config(stream)
        self.recorder = Recorder()
        self.sched = Scheduler(self.config, self.recorder)
        self.requests: dict[str, Request] = {}
        self.rows: dict[str, int] = {}
        self.worker = WorkerBlockTable(self.config.block_size,
                                       -(-self.config.max_model_len // self.config.block_size))

    def reset_prefix_cache(self) -> bool:
        return self.sched.reset_prefix_cache()

    def abort(self, req_id: str) -> None:
        self.sched.finish_requests([req_id], RequestStatus.FINISHED_ABORTED)

    def add(self, spec: RequestSpec, arrival_index: int) -> None:
        c = self.config
        req = Request(
            request_id=spec.id, prompt_token_ids=list(spec.prompt),
            max_tokens=spec.effective_max_tokens, arrival_time=float(arrival_index),
            priority=spec.priority, eos_token_id=spec.eos_token_id,
            stop_token_ids=tuple(spec.stop_token_ids), ignore_eos=spec.ignore_eos,
            cache_salt=spec.cache_salt, wants_prompt_logprobs=spec.prompt_logprobs is not None,
            hash_block_size=c.block_size if c.enable_prefix_caching else None)
        self.requests[spec.id] = req
        self.rows[spec.id] = arrival_index
        self.sched.add_request(req)

    def num_unfinished(self) -> int:
        return self.sched.num_unfinished()

    def schedule(self) -> Scheduled:
        before = {rid: r.num_computed_tokens for rid, r in self.sched.requests.items()}
        self.recorder.clear()
        out = self.sched.schedule()
        self._last_output = out
        self.worker.apply(out, self.rows)

        computed_before = dict(before)
        new_block_ids: dict[str, list[list[int]]] = {}
        admitted: list[str] = []
        for data in out.scheduled_new_reqs:
            new_block_ids[data.req_id] = [list(data.block_ids)]
            computed_before[data.req_id] = data.num_computed_tokens
            admitted.append(data.req_id)
        for data in out.scheduled_cached_reqs:
            computed_before[data.req_id] = data.num_computed_tokens
            if data.new_block_ids is not None:
                new_block_ids[data.req_id] = [list(data.new_block_ids)]
            if data.resumed_from_preemption:
                admitted.append(data.req_id)

        scheduled = list(out.num_scheduled_tokens.items())
        reqs = self.requests
        hits = self.recorder.hits
        return Scheduled(
            scheduled=scheduled,
            new_block_ids=new_block_ids,
            preempted=list(self.recorder.preempted),
            finished=sorted(out.finished_req_ids),
            prefix_hit_tokens={rid: hits[rid] for rid in admitted if rid in hits},
            spec_tokens={rid: list(t) for rid, t in out.scheduled_spec_decode_tokens.items()},
            computed_before={rid: computed_before[rid] for rid, _ in scheduled},
            num_tokens={rid: reqs[rid].num_tokens for rid, _ in scheduled},
            num_outputs={rid: reqs[rid].num_output_tokens for rid, _ in scheduled},
            evicted=list(self.recorder.evicted),
            slots={rid: slot_ranges(self.worker.slots(self.rows[rid], computed_before[rid], n))
                   for rid, n in scheduled},
        )

    def update(self, scheduled: Scheduled, sampled: dict[str, list[int]]) -> None:
        self.sched.update_from_output(self._last_output, sampled)

    def set_drafts(self, drafts: dict[str, list[int]]) -> None:
        self.sched.update_draft_token_ids(drafts)

    def state(self, req_id: str) -> RequestState:
        r = self.requests[req_id]
        return RequestState(status=r.status.name, num_computed_tokens=r.num_computed_tokens,
                            num_output_tokens=r.num_output_tokens)

    def num_free_blocks(self) -> int:
        return self.sched.kv.pool.num_free_blocks()
