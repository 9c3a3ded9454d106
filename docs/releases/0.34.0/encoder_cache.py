"""The encoder cache: room for encoder outputs, shared between requests by content.

Mirrors: vllm/v1/core/encoder_cache_manager.py (EncoderCacheManager,
compute_mm_encoder_budget, compute_text_encoder_budget) and the one method of
vllm/v1/request.py it reads (Request.get_num_encoder_tokens).

A multimodal item (an image, an audio clip) is run through the encoder once;
its output fills the item's placeholder tokens in the prompt.  The cache
counts room in those tokens and keys entries by the item's content hash, so two
requests with the same image share one entry.  An entry is in one of three
states:

* *held*: one or more requests still need it (their placeholder is not yet
  fully computed);
* *freeable*: nobody holds it, but it stays in the cache and a later request
  with the same hash can take it back without running the encoder again;
* *gone*: evicted.  Eviction is lazy: it happens only when a new entry needs
  room, oldest freeable entry first (the order in which entries became
  freeable, not the order they were made), and each evicted hash is recorded
  so that the scheduler can tell the worker to drop it.

Two counters follow from that: ``num_free_slots`` is room not taken by any
entry; ``num_freeable_slots`` is that plus the room of every freeable entry,
i.e. what could be had by evicting everything nobody holds.

The room of an entry is the placeholder's ``length``, not its number of
embeddings: vLLM 0.11.0 counts every placeholder position even when only some
of them receive an embedding.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class EncoderInput:
    """One multimodal item of a prompt, as the scheduler sees it.

    ``offset`` is where its placeholder starts in the prompt, ``length`` how
    many placeholder tokens it spans, ``mm_hash`` the content hash that
    identifies its encoder output (vLLM's ``MultiModalFeatureSpec``: its
    ``mm_position`` and ``identifier``).
    """

    offset: int
    length: int
    mm_hash: str

    @property
    def end(self) -> int:
        """The first prompt position after the placeholder."""
        return self.offset + self.length


class HasEncoderInputs(Protocol):
    """What the encoder cache reads from a request."""

    request_id: str
    encoder_inputs: Sequence[EncoderInput]


def encoder_slots(request: HasEncoderInputs, input_id: int) -> int:
    """Room the ``input_id``-th item takes in the cache: its placeholder length."""
    return request.encoder_inputs[input_id].length


class EncoderCacheManager:
    """Held, freeable and evicted encoder outputs, and the room they take."""

    def __init__(self, cache_size: int, *, items_taken_per_request: bool = False,
                 held_to_last_occurrence: bool = False):
        self.cache_size = cache_size
        # From 0.23.0 (rule change items_taken_per_request): the items each request
        # found in the cache or had encoded, by index; only these are let go of later.
        self.items_taken_per_request = items_taken_per_request
        self.taken: dict[str, set[int]] = {}
        # From 0.29.0 (held_to_last_occurrence): an item repeated within a request.
        self.held_to_last_occurrence = held_to_last_occurrence
        self.num_free_slots = cache_size
        self.num_freeable_slots = cache_size
        # Every entry still in the cache (held or freeable) -> the requests holding it.
        self.holders: dict[str, set[str]] = {}
        # Entries nobody holds -> their room, in the order they became freeable.
        self.freeable: dict[str, int] = {}
        # Hashes evicted since the worker was last told.
        self.freed: list[str] = []
        # Every entry still in the cache -> the length it was first taken with.
        self.lengths: dict[str, int] = {}

    # -- looking up --------------------------------------------------------------

    def check_and_update_cache(self, request: HasEncoderInputs, input_id: int) -> bool:
        """Whether the item's output is in the cache; if so the request now holds it.

        Taking back a freeable entry removes it from the freeable ones (so it
        cannot be evicted) and from ``num_freeable_slots``.  A request that
        already holds the entry just holds it still.
        """
        mm_hash = request.encoder_inputs[input_id].mm_hash
        if mm_hash not in self.holders:
            return False
        if not self.holders[mm_hash]:
            self.num_freeable_slots -= self.freeable.pop(mm_hash)
        self.holders[mm_hash].add(request.request_id)
        self.note_taken(request, input_id)
        return True

    def note_taken(self, request: HasEncoderInputs, input_id: int) -> None:
        """From 0.23.0: remember that the request took this item (hit or encoded)."""
        if self.items_taken_per_request:
            self.taken.setdefault(request.request_id, set()).add(input_id)

    def get_cached_input_ids(self, request: HasEncoderInputs) -> set[int]:
        """Indices of the request's items whose hash is in the cache, held or not.

        A set, built in ascending index order: the order in which ``free``
        later visits the items is this set's iteration order (see ``free``).

        From 0.23.0 (items_taken_per_request) it is instead the set of items
        the request took, itself (not a copy), built by the same adds and
        discards as vLLM's, so that it iterates in the same order.  An item
        whose hash another item of the request or another request put in the
        cache is not in it until the request looks that item up.
        """
        if self.items_taken_per_request:
            return self.taken.get(request.request_id, set())
        return {i for i in range(len(request.encoder_inputs))
                if request.encoder_inputs[i].mm_hash in self.holders}

    # -- making room ---------------------------------------------------------------

    def can_allocate(self, request: HasEncoderInputs, input_id: int,
                     encoder_compute_budget: int, num_tokens_to_schedule: int) -> bool:
        """Whether the item may be encoded now; evicts to make room when needed.

        Two tests with different scopes: the compute budget is checked against
        this item alone, the room against this item plus
        ``num_tokens_to_schedule`` (the items of the same request already
        accepted in this step but not yet allocated).  Room is found in free
        slots first; failing that, if evicting every freeable entry would be
        enough, freeable entries are evicted oldest first until it is; if not,
        nothing is evicted.  The evictions stand even if the request is then not
        scheduled.
        """
        num_tokens = encoder_slots(request, input_id)
        if num_tokens > encoder_compute_budget:
            return False
        needed = num_tokens + num_tokens_to_schedule
        if needed <= self.num_free_slots:
            return True
        if needed > self.num_freeable_slots:
            return False
        self.evict_until(needed)
        return True

    def evict_until(self, needed: int) -> None:
        """Evict the oldest freeable entries until ``needed`` slots are free.

        ``num_freeable_slots`` does not change: the room only moves from a
        freeable entry to the free slots.  With nothing left to evict it raises
        ``KeyError``, as vLLM's does (quirks.ENCODER_DECODER_FREEABLE_COUNTED_TWICE).
        """
        while self.num_free_slots < needed:
            if not self.freeable:
                raise KeyError("dictionary is empty")
            mm_hash = next(iter(self.freeable))
            self.num_free_slots += self.freeable.pop(mm_hash)
            del self.holders[mm_hash]
            self.lengths.pop(mm_hash, None)
            self.freed.append(mm_hash)

    def allocate(self, request: HasEncoderInputs, input_id: int) -> None:
        """Take room for the item's output; the request holds the new entry.

        Called only after ``can_allocate`` said yes, so the room is there.  It
        is taken from both counters: a held entry cannot be evicted.
        """
        mm_hash = request.encoder_inputs[input_id].mm_hash
        num_tokens = encoder_slots(request, input_id)
        if num_tokens > self.num_free_slots or num_tokens > self.num_freeable_slots:
            raise AssertionError(f"no room for {mm_hash}: can_allocate was not asked first")
        self.holders.setdefault(mm_hash, set()).add(request.request_id)
        self.note_taken(request, input_id)
        self.lengths.setdefault(mm_hash, num_tokens)
        self.num_free_slots -= num_tokens
        self.num_freeable_slots -= num_tokens

    # -- letting go ------------------------------------------------------------------

    def free_encoder_input(self, request: HasEncoderInputs, input_id: int) -> None:
        """The request no longer needs the item; the last holder makes it freeable.

        An item not in the cache, or one nobody holds, is left alone (so
        freeing twice is harmless).  A freeable entry goes to the back of the
        eviction order, sized by *this* request's item.

        From 0.23.0 the item leaves the request's taken ones first, whatever
        the entry's state.  From 0.29.0 (held_to_last_occurrence) the request
        goes on holding the entry while another item it took has the same hash.
        """
        mm_hash = request.encoder_inputs[input_id].mm_hash
        taken = self.taken.get(request.request_id)
        if taken is not None:
            taken.discard(input_id)
            if not taken:
                del self.taken[request.request_id]
        holders = self.holders.get(mm_hash)
        if not holders:
            return
        if self.held_to_last_occurrence and taken and any(
                request.encoder_inputs[i].mm_hash == mm_hash for i in taken):
            return
        holders.discard(request.request_id)
        if not holders:
            num_tokens = encoder_slots(request, input_id)
            self.freeable[mm_hash] = num_tokens
            self.num_freeable_slots += num_tokens

    def free(self, request: HasEncoderInputs) -> None:
        """Let go of every item of a finished or preempted request.

        The items are visited in the iteration order of a copy of the set that
        ``get_cached_input_ids`` returns.  That is CPython's set order of small
        integers: ascending while every index is below the set's table size,
        not otherwise (with nine or more items, index 8 can come before index 1),
        and a copy can be ordered differently from its original.  The order
        decides the order of the entries in the eviction queue, so it is
        reproduced here by building the same sets the same way.

        From 0.23.0 (items_taken_per_request) the request's own set of taken
        items is listed as it stands and visited in that order.
        """
        if self.items_taken_per_request:
            for input_id in list(self.get_cached_input_ids(request)):
                self.free_encoder_input(request, input_id)
            return
        for input_id in self.get_cached_input_ids(request).copy():
            self.free_encoder_input(request, input_id)

    def get_freed_mm_hashes(self, skip_cached_again: bool = False) -> list[str]:
        """The hashes evicted since the last call, in eviction order; forgets them.

        A hash evicted twice (cached again in between) is listed twice.  With
        ``skip_cached_again`` (from 0.28.0: rule change recached_outputs_not_freed) a hash
        cached again since it was evicted is left out: the worker keeps its output.
        """
        freed, self.freed = self.freed, []
        if skip_cached_again:
            freed = [h for h in freed if h not in self.holders]
        return freed

    # -- checking ------------------------------------------------------------------

    def freeable_order(self) -> list[tuple[str, int]]:
        """Freeable entries and their room, next to be evicted first."""
        return list(self.freeable.items())


# -- the budgets -------------------------------------------------------------------


def encoder_budgets(max_tokens_by_modality: Mapping[str, int], *,
                    max_num_encoder_input_tokens: int, encoder_cache_size: int,
                    max_num_batched_tokens: int,
                    disable_chunked_mm_input: bool) -> tuple[int, int]:
    """The encoder's compute budget per step and the cache size, in tokens.

    ``max_tokens_by_modality`` holds the largest item of each modality the
    model accepts (those not switched off by ``limit_mm_per_prompt``); it is
    empty for a text-only model or when every modality is off, and then there
    is no encoder budget and no cache at all.  Otherwise both configured sizes
    are raised to at least the largest item, so that one item always fits.
    With chunked multimodal input off an item must fit in one step: a largest
    item longer than the step's token budget is a configuration error.
    """
    if not max_tokens_by_modality:
        return 0, 0
    largest_item = max(max_tokens_by_modality.values())
    if disable_chunked_mm_input and largest_item > max_num_batched_tokens:
        raise ValueError(
            f"an item of {largest_item} tokens cannot fit in a step of "
            f"{max_num_batched_tokens} tokens with chunked multimodal input off")
    return (max(max_num_encoder_input_tokens, largest_item),
            max(encoder_cache_size, largest_item))
