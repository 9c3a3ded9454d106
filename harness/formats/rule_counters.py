"""What a campaign reached: rule counters read off vLLM's traces.

The counters say how often each rule of the scheduler was exercised, so a
campaign that never preempted, never hit the prefix cache or never rejected a
draft says so instead of passing quietly.  ``vllm_crashes`` counts the
streams on which vLLM raised and the reference raised alike (a campaign only
goes on past a crash the reference reproduces).
"""

from __future__ import annotations

from typing import Any

#: The counters that ``HARNESS_TARGET=1`` hands to hypothesis's targeted search
#: (:func:`aim_at`): the behaviours a random stream rarely shows.
AIMED = ("preemptions_fcfs", "preemptions_priority", "hits_after_preemption", "evictions",
         "spec_rejections", "aborted_preempted", "null_pages_handed")


class Stats:
    """Rule counters over the traces of one campaign."""

    KEYS = ("streams", "steps", "preemptions_fcfs", "preemptions_priority", "prefix_hits",
            "hits_after_preemption", "evictions", "chunked_prefills", "spec_tokens",
            "spec_rejections", "aborted_waiting", "aborted_running", "aborted_preempted",
            "hybrid_streams", "null_pages_handed", "max_steps_verdicts", "vllm_crashes")
    # Counters that may stay at 0 in a healthy campaign.
    OPTIONAL = ("max_steps_verdicts", "vllm_crashes")

    def __init__(self) -> None:
        self.counts = dict.fromkeys(self.KEYS, 0)

    def add(self, trace: dict[str, Any]) -> None:
        c = self.counts
        stream = trace["stream"]
        policy = stream["config"]["policy"]
        prompts = {r["id"]: len(r["prompt"]) for r in stream["requests"]}
        c["streams"] += 1
        c["steps"] += len(trace["steps"])
        c["max_steps_verdicts"] += trace["verdict"] == "max_steps"
        c["vllm_crashes"] += trace["verdict"] == "engine_failure"
        groups = stream["config"].get("kv_cache_groups")
        hybrid = groups is not None and groups != [{"type": "full"}]
        c["hybrid_streams"] += hybrid
        preempted_once: set[str] = set()
        last_status: dict[str, str] = {}
        for step in trace["steps"]:
            c[f"preemptions_{policy}"] += len(step["preempted"])
            for rid, n in step["prefix_hit_tokens"].items():
                if n:
                    c["prefix_hits"] += 1
                    c["hits_after_preemption"] += rid in preempted_once
            preempted_once.update(step["preempted"])
            if hybrid:  # pages a window or chunk gave back, as the null page in a handed table
                c["null_pages_handed"] += sum(group.count(0) for groups in
                                              step["new_block_ids"].values() for group in groups)
            c["evictions"] += len(step["evicted"])
            for rid, n in step["scheduled"]:
                before = step["computed_before"][rid]
                if before + n < prompts[rid] and not step["preempted"].count(rid):
                    c["chunked_prefills"] += 1
            for rid, drafts in step["spec_tokens"].items():
                c["spec_tokens"] += len(drafts)
                if len(step["emitted"].get(rid, [])) < len(drafts) + 1:
                    c["spec_rejections"] += 1
            for rid, status in step["status"].items():
                if status == "FINISHED_ABORTED":
                    kind = {"RUNNING": "running", "PREEMPTED": "preempted"}.get(
                        last_status.get(rid, "WAITING"), "waiting")
                    c[f"aborted_{kind}"] += 1
                last_status[rid] = status

    def unreached(self) -> list[str]:
        return [k for k, v in self.counts.items() if v == 0 and k not in self.OPTIONAL]

    def summary(self) -> str:
        return "  ".join(f"{k}={v}" for k, v in self.counts.items())


def aim_at(trace: dict[str, Any]) -> None:
    """Ask hypothesis to look for streams that push each of :data:`AIMED` higher.

    ``hypothesis.target`` turns these per-stream counts into scores that its
    targeted phase climbs, interleaved with random generation once a run has
    made 200 streams (and only in runs of 1,000 or more, e.g. the nightly
    profile).  Called only inside a hypothesis test.
    """
    from hypothesis import target
    one = Stats()
    one.add(trace)
    for key in AIMED:
        target(one.counts[key], label=key)
