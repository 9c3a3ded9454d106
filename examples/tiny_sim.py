"""A simulator of vLLM's scheduler in under 100 lines, plugged in through the adapter kit.

    python -m harness check --fit --engines examples.tiny_sim:TinySim fixtures/streams/

vLLM's token rules (running requests first, cut by the budget and the model length; the
newest running request preempted when pages run out; waiting requests admitted first
come first served while there are seats, budget and pages) over a pool without a prefix
cache (pages taken from the head of a free queue, given back last page first).
``features`` says what it models; the kit (harness.engines.kit) keeps the rest: the null
page, finished requests told the step after, the stop rule, the statuses, the KV slots.
"""

from __future__ import annotations

from collections import deque

from harness.engines.kit import Adapter, Decision, Request, SimConfig


class TinySim(Adapter):
    name = "tiny-sim"
    features = frozenset({"chunked_prefill", "long_prefill_threshold", "eos", "stop_tokens",
                          "eos_per_request", "model_len_stop"})

    def build(self, config: SimConfig) -> None:
        self.c = config
        self.free = deque(range(config.num_pages))
        self.tables: dict[str, list[int]] = {}
        self.computed: dict[str, int] = {}
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []

    def admit(self, request: Request) -> None:
        self.waiting.append(request)

    def _allocate(self, r: Request, n: int) -> bool:
        table = self.tables.setdefault(r.id, [])
        need = -(-(self.computed.get(r.id, 0) + n) // self.c.block_size) - len(table)
        if need > len(self.free):
            return False
        table += [self.free.popleft() for _ in range(max(need, 0))]
        return True

    def _release(self, r: Request) -> None:
        self.free.extend(reversed(self.tables.pop(r.id, [])))
        self.computed[r.id] = 0

    def _wanted(self, r: Request) -> int:
        n = len(r.token_ids) - self.computed.get(r.id, 0)
        threshold = self.c.long_prefill_token_threshold
        return threshold if 0 < threshold < n else n

    def _tokens(self, r: Request, budget: int) -> int:
        return min(self._wanted(r), budget, self.c.max_model_len - 1 - self.computed.get(r.id, 0))

    def decide(self) -> Decision:
        d, budget = Decision(), self.c.max_num_batched_tokens
        for r in list(self.running):
            if r not in self.running or budget == 0:
                continue
            n = self._tokens(r, budget)
            while not self._allocate(r, n):
                victim = self.running.pop()
                self._release(victim)
                self.waiting.appendleft(victim)
                d.preempted.append(victim.id)
                if victim is r:
                    break
            else:
                d.scheduled.append((r.id, n))
                budget -= n
        while self.waiting and not d.preempted and budget and len(self.running) < self.c.max_num_seqs:
            r = self.waiting[0]
            n = self._tokens(r, budget)
            if (not self.c.enable_chunked_prefill and self._wanted(r) > budget) \
                    or not self._allocate(r, n):
                break
            self.running.append(self.waiting.popleft())
            d.scheduled.append((r.id, n))
            budget -= n
        for rid, n in d.scheduled:
            self.computed[rid] = self.computed.get(rid, 0) + n
        return d

    def advance(self, decision: Decision, sampled: dict[str, list[int]],
                stopping: set[str]) -> set[str]:
        for r in [r for r in self.running if r.id in stopping]:
            self.running.remove(r)
            self._release(r)
        return stopping

    def free_pages(self) -> int:
        return len(self.free)

    def pages(self, req_id: str) -> list[int] | None:
        return self.tables.get(req_id, [])
