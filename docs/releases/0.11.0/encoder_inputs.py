"""Which encoder inputs a step runs, and when a request lets go of their outputs.

Mirrors: vllm/v1/core/sched/scheduler.py (Scheduler._try_schedule_encoder_inputs,
Scheduler._free_encoder_inputs).

A step grants a request the token range ``[num_computed_tokens,
num_computed_tokens + num_new_tokens)``.  Every multimodal item whose
placeholder overlaps that range needs its encoder output this step: either
it is in the encoder cache already, or the encoder must run on it now, which
takes encoder compute budget and cache room.  An item that cannot run now cuts
the granted range just before its placeholder, so the decoder never reads a
placeholder whose embeddings do not exist yet.  Items are visited in prompt
order (the scheduler assumes they are sorted by offset) and the first one that
cuts the range ends the visit.

Side effects that stand even when the caller then does not schedule the
request (zero tokens left, or no KV pages): cache hits are held by the request
from the moment they are looked up, and ``can_allocate`` may already have
evicted entries.  Room for the items returned is taken only by the caller, by
``allocate`` once the request is really scheduled.
"""

from __future__ import annotations

from reference.encoder_cache import EncoderCacheManager, EncoderInput, HasEncoderInputs


def starts_after_range(item: EncoderInput, range_end: int) -> bool:
    """The placeholder begins at or after the end of the granted range: not needed yet.

    Because items are sorted, no later item is needed either.
    """
    return item.offset >= range_end


def already_in_kv(item: EncoderInput, num_computed_tokens: int) -> bool:
    """The whole placeholder is computed: its embeddings live in the KV cache now."""
    return item.end <= num_computed_tokens


def cut_to_whole_item(item: EncoderInput, num_computed_tokens: int, range_end: int,
                      from_its_start: bool = False, from_inside: bool = False) -> bool:
    """With chunked multimodal input off: the range would stop inside a placeholder
    it enters from before.

    A placeholder the request is already inside of (prefix hit, or a cache hit
    chunked earlier) is not protected: the test needs the range to start
    strictly before the placeholder -- from 0.33.0 (``from_its_start``, rule change
    ``encoder_cuts_at_the_item``) at or before it.  From 0.34.0 (``from_inside``,
    rule change ``range_inside_item_waits_for_the_rest``) a range that starts inside
    the placeholder is protected too: the request gets nothing until the rest of the
    item fits.
    """
    if from_inside:
        starts_before = num_computed_tokens < item.end
    elif from_its_start:
        starts_before = num_computed_tokens <= item.offset
    else:
        starts_before = num_computed_tokens < item.offset
    return starts_before and range_end < item.end


def tokens_before(item: EncoderInput, num_computed_tokens: int) -> int:
    """Tokens that can still be granted when ``item`` cannot run: those before it.

    Zero when the request has already computed up to or into the placeholder
    (a prefix hit, or an earlier step cut exactly at it): then the request
    gets nothing this step.
    """
    return max(item.offset - num_computed_tokens, 0)


def length_mismatch(item: EncoderInput, hashes_to_encode: dict[str, int],
                    cache: EncoderCacheManager) -> bool:
    """The item's hash is encoded this step, or cached, with another length than its own."""
    known = hashes_to_encode.get(item.mm_hash, cache.lengths.get(item.mm_hash))
    return known is not None and known != item.length


def try_schedule_encoder_inputs(
    request: HasEncoderInputs,
    num_computed_tokens: int,
    num_new_tokens: int,
    encoder_compute_budget: int,
    cache: EncoderCacheManager,
    *,
    disable_chunked_mm_input: bool = False,
    is_encoder_decoder: bool = False,
    lookahead: int = 0,
    encode_ahead: bool = True,
    whole_item_lookahead: int = 0,
    cut_at_item: bool = False,
    whole_item_first: bool = False,
    whole_item_from_inside: bool = False,
    rejected: list[str] | None = None,
) -> tuple[list[int], int, int]:
    """The items to encode this step, the tokens still granted, the budget left.

    ``num_computed_tokens`` is passed in rather than read from the request: for
    a waiting request it includes the prefix hit not yet recorded on it.

    An encoder-decoder model (Whisper) runs its encoder once, before the first
    decoder token: all its items sit at offset 0, and once any token is computed
    they are all done.  It does not look items up in the cache and does not
    skip repeated items, but it does take budget and room.

    ``lookahead`` (from 0.12.0, one token with an eagle drafter: rule change
    ``eagle_encoder_one_token_ahead``) is how far past the granted range the
    request reads placeholders: the drafter runs one position ahead of the
    target model, so an item starting just after the range is needed now, and
    an item that cannot run cuts the grant that many tokens earlier.  The
    whole-item check of ``disable_chunked_mm_input`` still looks at the range
    itself.  Without ``encode_ahead`` (0.13.0 to 0.27.1: rule change
    ``eagle_lookahead_item_waits``) such an item is looked up and must fit, but
    is encoded only once the range itself reaches it.  ``whole_item_lookahead``
    (from 0.17.0, the drafter's one token: rule change
    ``eagle_whole_item_cut_one_token_earlier``) moves the whole-item cut of
    ``disable_chunked_mm_input`` that many tokens earlier too, to nothing at the least,
    so the drafter's read past the range stays before the placeholder.
    ``cut_at_item`` (from 0.33.0: rule change ``encoder_cuts_at_the_item``): an item
    that cannot run cuts the grant right before its placeholder, not ``lookahead``
    tokens earlier, and never lengthens it; and the whole-item cut also protects a
    placeholder the range starts at.
    ``rejected`` (from 0.31.0: rule change ``encoder_length_mismatch_fails_request``):
    an item whose hash the cache holds, or an earlier item of this step holds, with
    another length is content the hash cannot stand for.  The request gets nothing this
    step, the budget stays as it is at that item, and its id goes into ``rejected``,
    for the scheduler to finish it with an error after the step's update.
    ``whole_item_first`` (from 0.32.0: rule change ``whole_item_cut_before_lookups``): the
    whole-item check of ``disable_chunked_mm_input`` comes before the item is looked up,
    so it also cuts at an item the step encodes already (the same hash earlier in the
    request) or the cache holds; up to 0.31.0 such an item was passed over first and could
    be split.  ``whole_item_from_inside`` (from 0.34.0: rule change
    ``range_inside_item_waits_for_the_rest``): the whole-item check also holds a range that
    starts inside the placeholder (a prefix hit or a load ending there) to nothing.
    """
    items = request.encoder_inputs
    if num_new_tokens == 0 or not items:
        return [], num_new_tokens, encoder_compute_budget

    to_encode: list[int] = []
    hashes_to_encode: dict[str, int] = {}  # hash -> the length it is encoded with
    room_to_take = 0  # room of the items in to_encode, not allocated yet
    for i, item in enumerate(items):
        range_end = num_computed_tokens + num_new_tokens
        if starts_after_range(item, range_end + lookahead):
            break
        if is_encoder_decoder and num_computed_tokens > 0:
            assert item.offset == 0, "an encoder-decoder model's items start at 0"
            continue
        if already_in_kv(item, num_computed_tokens):
            continue
        splits_item = disable_chunked_mm_input and cut_to_whole_item(
            item, num_computed_tokens, range_end, cut_at_item, whole_item_from_inside)
        if splits_item and whole_item_first:
            num_new_tokens = tokens_before(item, num_computed_tokens + whole_item_lookahead)
            break
        if not is_encoder_decoder:
            if rejected is not None and length_mismatch(item, hashes_to_encode, cache):
                if request.request_id not in rejected:
                    rejected.append(request.request_id)
                return [], 0, encoder_compute_budget
            if item.mm_hash in hashes_to_encode:
                continue  # the same content is encoded once per step
            if cache.check_and_update_cache(request, i):
                continue
        if splits_item:
            num_new_tokens = tokens_before(item, num_computed_tokens + whole_item_lookahead)
            break
        if not cache.can_allocate(request, i, encoder_compute_budget, room_to_take):
            # No budget or no room: the encoder runs an item whole or not at all.
            if cut_at_item:
                num_new_tokens = min(num_new_tokens, tokens_before(item, num_computed_tokens))
            else:
                num_new_tokens = tokens_before(item, num_computed_tokens + lookahead)
            break
        if not encode_ahead and starts_after_range(item, range_end):
            continue  # no placeholder position of it is computed this step
        room_to_take += item.length
        encoder_compute_budget -= item.length
        hashes_to_encode[item.mm_hash] = item.length
        to_encode.append(i)
    return to_encode, num_new_tokens, encoder_compute_budget


def free_encoder_inputs(request: HasEncoderInputs, num_computed_tokens: int,
                        cache: EncoderCacheManager, *, is_encoder_decoder: bool = False,
                        drafter_lookahead: int = 0) -> None:
    """After a step: let go of the cached items the request has computed past.

    Called for every scheduled request once its ``num_computed_tokens`` has
    advanced.  An item is let go when its whole placeholder is computed (for
    an encoder-decoder model: as soon as any token is).  Items are visited in
    the iteration order of the set ``get_cached_input_ids`` returns (CPython's
    set order; see ``EncoderCacheManager.free``), which fixes their order in
    the eviction queue.  Unlike ``free``, the set itself is iterated, not a
    copy, and the two orders can differ.  ``drafter_lookahead``: tokens the computed ones
    must pass the item's end by (encoder_outputs_held_for_the_drafter).
    """
    for input_id in list(cache.get_cached_input_ids(request)):
        item = request.encoder_inputs[input_id]
        done = ((is_encoder_decoder and num_computed_tokens > 0)
                or already_in_kv(item, num_computed_tokens - drafter_lookahead))
        if done:
            cache.free_encoder_input(request, input_id)
