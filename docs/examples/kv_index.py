"""A router's prefix index fed by vLLM's KV cache events, checked against vLLM's own hits.

Run:  python docs/examples/kv_index.py fixtures/traces/vllm-0.11.0/kv_events_*.json

A KV-aware router keeps, per engine, the page contents it was told are
cached.  This index rebuilds each announced page's whole token prefix from
``BlockStored`` (parent's prefix + the page's tokens), drops it on
``BlockRemoved`` and everything on ``AllBlocksCleared``.  Its soundness
check: every prefix hit vLLM reports (``prefix_hit_tokens``) covers pages the
index held during that step (at its start, or stored by one of its events: a
later admission of the same step may evict a page that an earlier one hit) --
vLLM never hits a page it has not announced.  The converse does not hold, and a router must not assume it:
events carry no cache salt and no image hashes, a hit stops one token short
of the prompt, a request admitted in the same step sees pages cached
moments before (the events of a step arrive after it), and the same content
may sit in two pages, so one BlockRemoved does not mean it is gone.
"""

from __future__ import annotations

import json
import sys
from collections import Counter


class PrefixIndex:
    def __init__(self) -> None:
        self.prefix_of: dict[int, tuple] = {}  # hash number -> (lora_id, tokens from the start)
        # Pages announced per hash: vLLM may cache the same content in two pages, and a
        # BlockRemoved for one of them leaves the other in the cache.
        self.pages: Counter[int] = Counter()

    def apply(self, event: dict) -> None:
        if event["type"] == "BlockStored":
            parent = event["parent_block_hash"]
            prefix = () if parent is None else self.prefix_of[parent][1]
            size, tokens = event["block_size"], event["token_ids"]
            for i, h in enumerate(event["block_hashes"]):
                prefix = prefix + tuple(tokens[i * size:(i + 1) * size])
                self.prefix_of[h] = (event["lora_id"], prefix)
                self.pages[h] += 1
        elif event["type"] == "BlockRemoved":
            for h in event["block_hashes"]:
                self.pages[h] -= 1
        else:  # AllBlocksCleared
            self.pages.clear()

    def held(self) -> set[tuple]:
        """The (adapter, token prefix) of every cached page.  Several hashes can share one:
        the events carry no cache salt and no image hashes."""
        return {self.prefix_of[h] for h, n in self.pages.items() if n > 0}


def unexplained_hits(trace: dict) -> list[str]:
    """Hits vLLM reported on pages the index did not hold at the end of the step."""
    stream = trace["stream"]
    size = stream["config"]["block_size"]
    tokens = {r["id"]: list(r["prompt"]) for r in stream["requests"]}  # + outputs so far
    lora_ids: dict[str, int] = {}  # the harness numbers adapters 1, 2, ... as first named
    for r in stream["requests"]:
        if r.get("lora"):
            lora_ids.setdefault(r["lora"], len(lora_ids) + 1)
    lora_of = {r["id"]: lora_ids.get(r.get("lora")) for r in stream["requests"]}
    index, problems = PrefixIndex(), []
    for step in trace["steps"]:
        held = index.held()  # at the step's start; pages stored during it count too
        for event in step["kv_events"]:
            index.apply(event)
            held |= index.held()
        for rid, hit in step["prefix_hit_tokens"].items():
            for end in range(size, hit + 1, size):
                if (lora_of[rid], tuple(tokens[rid][:end])) not in held:
                    problems.append(f"step {step['step']}: {rid} hit {hit} tokens, but the "
                                    f"index holds no page ending at token {end}")
                    break
        for rid, new in step["emitted"].items():
            tokens[rid] += new
    return problems


if __name__ == "__main__":
    bad = 0
    for path in sys.argv[1:]:
        problems = unexplained_hits(json.load(open(path)))
        bad += bool(problems)
        print(f"{path}: " + ("every hit explained" if not problems else "; ".join(problems)))
    sys.exit(1 if bad else 0)
