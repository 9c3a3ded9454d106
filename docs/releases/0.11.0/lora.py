"""LoRA adapters: a step runs at most ``max_loras`` distinct adapters.

Mirrors: the LoRA parts of vllm/v1/core/sched/scheduler.py (Scheduler.schedule)
and vllm/lora/request.py (LoRARequest's integer id).

The worker holds ``max_loras`` adapter slots.  The adapters of the running
requests scheduled in the step come first; then a waiting request whose
adapter is not among them is set aside once the slots are full (it comes back
to the head of the waiting queue after the step, like every request set
aside).  A request without an adapter never needs a slot.  The running
requests themselves are never turned away: they were admitted under this rule,
and the step only checks that their adapters fit -- which they may not
(quirks.LORA_SLOTS_OVERFILLED_AFTER_A_SKIP).
"""

from __future__ import annotations

from typing import Iterable

from reference.request import Request


class AdapterSlots:
    """The adapters of the step so far (vLLM's ``scheduled_loras``)."""

    def __init__(self, max_loras: int | None, scheduled_running: Iterable[Request]):
        self.max_loras = max_loras
        self.ids = {r.lora_id for r in scheduled_running if r.lora_id is not None}
        self.check_not_overfilled()

    def check_not_overfilled(self) -> None:
        """The running requests scheduled this step hold at most ``max_loras`` adapters.

        A running request that got no token in an earlier step did not hold its
        adapter's slot there, so the slot may have gone to a waiting request under
        another adapter; when both run again the check fails and vLLM's step raises
        (quirks.LORA_SLOTS_OVERFILLED_AFTER_A_SKIP).
        """
        assert self.max_loras is None or len(self.ids) <= self.max_loras, \
            f"{len(self.ids)} LoRA adapters scheduled, max_loras is {self.max_loras}"

    def turns_away(self, request: Request) -> bool:
        """The slots are full and the request's adapter is not in them."""
        return (self.max_loras is not None and request.lora_id is not None
                and len(self.ids) == self.max_loras and request.lora_id not in self.ids)

    def take(self, request: Request) -> None:
        """An admitted request's adapter joins the step."""
        if self.max_loras is not None and request.lora_id is not None:
            self.ids.add(request.lora_id)


#: The slots of a step when no ``max_loras`` applies: nothing is ever turned away.
NO_ADAPTER_LIMIT = AdapterSlots(None, ())
