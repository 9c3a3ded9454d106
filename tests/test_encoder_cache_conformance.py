"""The reference's encoder cache against vLLM's, operation by operation.

Random workloads (requests with several multimodal items, some content shared
between requests or repeated inside one) drive both caches through the same
operations, in the ways vLLM's scheduler uses them: scheduling a request's
encoder inputs (``Scheduler._try_schedule_encoder_inputs``, then ``allocate``
for each input returned if the request gets its KV pages), letting go of
computed inputs (``Scheduler._free_encoder_inputs``), freeing a finished or
preempted request, and the cache's own calls one at a time (an ``allocate``
after a lone ``can_allocate`` only where the scheduler could make it: see
``Pair.scheduler_may_allocate``).  After every
operation the answers and the whole observable state must agree: both
counters, the holders of each entry, the freeable entries in eviction order
and the freed-hash list.

vLLM's classes are reached through ``harness.engines.vllm_compat`` (the only
place vLLM is imported): ``EncoderCacheManager`` is the class vLLM's scheduler
module binds, and the two scheduler methods are called unbound with a stand-in
for the scheduler holding only what they read (``encoder_cache_manager``,
``is_encoder_decoder``, ``scheduler_config.disable_chunked_mm_input``).
"""

from __future__ import annotations

import inspect
import random
from dataclasses import dataclass
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reference.encoder_cache import EncoderCacheManager, EncoderInput
from reference.encoder_inputs import free_encoder_inputs, try_schedule_encoder_inputs

pytestmark = [pytest.mark.conformance, pytest.mark.needs_vllm]


@pytest.fixture(scope="module")
def vllm_side():
    """vLLM's EncoderCacheManager class and its Scheduler class."""
    from harness.engines import vllm_compat
    manager = inspect.getmodule(vllm_compat.Scheduler).EncoderCacheManager
    assert manager.__module__ == "vllm.v1.core.encoder_cache_manager"
    return manager, vllm_compat.Scheduler


class VllmRequestStandIn:
    """The members of ``vllm.v1.request.Request`` the encoder cache and the two
    scheduler methods read, and nothing else: ``request_id``, ``mm_features``
    (each with ``identifier`` and ``mm_position.offset`` / ``.length``),
    ``has_encoder_inputs``, ``get_num_encoder_tokens`` (the placeholder length,
    as in 0.11.0) and ``num_computed_tokens``.
    """

    def __init__(self, request_id: str, items: list[EncoderInput]):
        self.request_id = request_id
        self.mm_features = [
            SimpleNamespace(identifier=it.mm_hash,
                            mm_position=SimpleNamespace(offset=it.offset, length=it.length))
            for it in items]
        self.num_computed_tokens = 0

    @property
    def has_encoder_inputs(self) -> bool:
        return len(self.mm_features) > 0

    def get_num_encoder_tokens(self, input_id: int) -> int:
        return self.mm_features[input_id].mm_position.length


@dataclass
class RefRequest:
    request_id: str
    encoder_inputs: list[EncoderInput]


class Pair:
    """One vLLM cache and one reference cache, driven together."""

    def __init__(self, vllm_side, cache_size: int, is_encoder_decoder: bool):
        manager_cls, self.scheduler_cls = vllm_side
        self.vllm = manager_cls(cache_size=cache_size)
        self.ref = EncoderCacheManager(cache_size)
        self.is_encoder_decoder = is_encoder_decoder

    def scheduler(self, disable_chunked_mm_input: bool) -> SimpleNamespace:
        return SimpleNamespace(
            encoder_cache_manager=self.vllm, is_encoder_decoder=self.is_encoder_decoder,
            scheduler_config=SimpleNamespace(disable_chunked_mm_input=disable_chunked_mm_input))

    def scheduler_may_allocate(self, vreq, rreq, input_id: int) -> bool:
        """Whether vLLM's scheduler could go on to ``allocate`` this item after
        asking ``can_allocate`` about it alone, as the ``can_allocate`` operation does.

        The scheduler calls ``allocate`` only for the items
        ``_try_schedule_encoder_inputs`` returned (scheduler.py, ``schedule``: the
        loops over ``encoder_inputs_to_schedule``), and for a model that is not
        encoder-decoder that method looks every item up first:
        ``if self.encoder_cache_manager.check_and_update_cache(request, i):
        continue`` comes before ``can_allocate``.  So an item whose hash is in the
        cache, held or freeable, is taken back, never allocated again; between
        that lookup and ``allocate`` only evictions and frees happen, which put no
        hash into the cache.  ``allocate`` relies on it: on a hash already in the
        cache it takes the room a second time and leaves a freeable entry in
        ``freeable`` while a request holds it, ``num_freeable_slots`` then counts
        that entry twice, and a later eviction pops the empty ``freeable``
        (``KeyError: 'dictionary is empty'``, the sequence of
        ``test_freeable_entry_is_taken_back_not_allocated_again``).  An
        encoder-decoder model skips the lookup (and the per-step deduplication),
        so there it may -- and 0.11.0's scheduler can then reach the same
        ``KeyError`` through ``_try_schedule_encoder_inputs`` alone (a freeable hash
        scheduled again): a real vLLM crash, left in the operations on purpose.
        """
        if self.is_encoder_decoder:
            return True
        absent = vreq.mm_features[input_id].identifier not in self.vllm.cached
        assert absent == (rreq.encoder_inputs[input_id].mm_hash not in self.ref.holders)
        return absent

    def assert_same_state(self, after: str) -> None:
        v, r = self.vllm, self.ref
        assert (v.num_free_slots, v.num_freeable_slots) == (r.num_free_slots, r.num_freeable_slots), after
        assert v.cached == r.holders, after
        assert list(v.freeable.items()) == r.freeable_order(), after
        assert v.freed == r.freed, after


@st.composite
def workloads(draw):
    """A cache size and a few requests whose items share a small pool of contents."""
    is_encoder_decoder = draw(st.booleans()) and draw(st.booleans())
    lengths = draw(st.lists(st.integers(1, 8), min_size=1, max_size=6))
    requests = []
    for n in range(draw(st.integers(1, 4))):
        pos, items = draw(st.integers(0, 3)), []
        for _ in range(draw(st.integers(1, 12))):
            h = draw(st.integers(0, len(lengths) - 1))
            offset = 0 if is_encoder_decoder else pos
            items.append(EncoderInput(offset, lengths[h], f"h{h}"))
            pos += lengths[h] + draw(st.integers(0, 3))
        prompt_len = max(it.end for it in items) + draw(st.integers(0, 3))
        requests.append((f"r{n}", items, prompt_len))
    return draw(st.integers(0, 30)), is_encoder_decoder, requests


@dataclass(frozen=True)
class Crash:
    """What a call raised: its exception's type and message."""

    kind: str
    message: str


def both(vllm_call, ref_call) -> tuple:
    """Each side's answer, or the :class:`Crash` it raised: a crash of vLLM's (a
    ``KeyError`` out of its encoder cache, quirks.ENCODER_DECODER_FREEABLE_COUNTED_TWICE)
    must be the reference's too.  Any other exception of vLLM's fails the test."""
    def outcome(call):
        try:
            return call()
        except KeyError as exc:
            return Crash(type(exc).__name__, str(exc))
    return outcome(vllm_call), outcome(ref_call)


OPS = ["schedule", "schedule", "schedule", "computed", "free", "freed", "lookup",
       "can_allocate", "free_input", "cached_ids"]


@settings(max_examples=200, deadline=None)
@given(workload=workloads(), data=st.data())
def test_encoder_cache_matches_vllm(vllm_side, workload, data):
    cache_size, is_encoder_decoder, specs = workload
    pair = Pair(vllm_side, cache_size, is_encoder_decoder)
    reqs = [(VllmRequestStandIn(rid, items), RefRequest(rid, items), prompt_len)
            for rid, items, prompt_len in specs]
    for step in range(data.draw(st.integers(1, 40))):
        op = data.draw(st.sampled_from(OPS))
        vreq, rreq, prompt_len = data.draw(st.sampled_from(reqs))
        i = data.draw(st.integers(0, len(rreq.encoder_inputs) - 1))
        after = f"step {step}: {op} {rreq.request_id}"
        if op == "schedule":
            computed = data.draw(st.integers(0, prompt_len))
            new = data.draw(st.integers(0, prompt_len - computed))
            budget = data.draw(st.integers(0, 30))
            no_chunks = data.draw(st.booleans())
            got, want = both(
                lambda: pair.scheduler_cls._try_schedule_encoder_inputs(
                    pair.scheduler(no_chunks), vreq, computed, new, budget),
                lambda: try_schedule_encoder_inputs(
                    rreq, computed, new, budget, pair.ref,
                    disable_chunked_mm_input=no_chunks, is_encoder_decoder=is_encoder_decoder))
            if isinstance(want, Crash):
                assert got == want, after
                return  # both crashed: the engine would stop here
            assert tuple(got) == want, after
            if want[1] > 0 and data.draw(st.booleans()):  # the request got its KV pages
                for input_id in want[0]:
                    pair.vllm.allocate(vreq, input_id)
                    pair.ref.allocate(rreq, input_id)
        elif op == "computed":
            vreq.num_computed_tokens = computed = data.draw(st.integers(0, prompt_len))
            pair.scheduler_cls._free_encoder_inputs(pair.scheduler(False), vreq)
            free_encoder_inputs(rreq, computed, pair.ref, is_encoder_decoder=is_encoder_decoder)
        elif op == "free":
            pair.vllm.free(vreq)
            pair.ref.free(rreq)
        elif op == "freed":
            assert pair.vllm.get_freed_mm_hashes() == pair.ref.get_freed_mm_hashes(), after
        elif op == "lookup":
            assert pair.vllm.check_and_update_cache(vreq, i) == pair.ref.check_and_update_cache(rreq, i)
        elif op == "can_allocate":
            budget = data.draw(st.integers(0, 30))
            accepted = data.draw(st.integers(0, 20)) if data.draw(st.booleans()) else 0
            may_allocate = pair.scheduler_may_allocate(vreq, rreq, i)
            ok, want = both(lambda: pair.vllm.can_allocate(vreq, i, budget, accepted),
                            lambda: pair.ref.can_allocate(rreq, i, budget, accepted))
            assert ok == want, after
            if isinstance(want, Crash):
                return  # both crashed: the engine would stop here
            # The boolean is drawn whatever the gate says, so that the draws (and
            # the examples saved in the database) stay those of the earlier model.
            if ok and accepted == 0 and data.draw(st.booleans()) and may_allocate:
                pair.vllm.allocate(vreq, i)
                pair.ref.allocate(rreq, i)
        elif op == "free_input":
            pair.vllm.free_encoder_input(vreq, i)
            pair.ref.free_encoder_input(rreq, i)
        elif op == "cached_ids":
            assert pair.vllm.get_cached_input_ids(vreq) == pair.ref.get_cached_input_ids(rreq), after
        pair.assert_same_state(after)


def test_freeable_entry_is_taken_back_not_allocated_again(vllm_side):
    """The example a random seed found (cache of 4, one request whose item h0
    comes three times).  h0 is encoded, the request is freed (h0 freeable), and
    the ``can_allocate`` operation asks about h0 again and used to ``allocate`` it:
    vLLM's ``allocate`` then took h0's room a second time and left h0 in
    ``freeable`` while the request held it, so after the next ``free``
    ``num_freeable_slots`` counted h0 twice and scheduling h1 with 1 token of
    budget emptied ``freeable`` and raised ``KeyError: 'dictionary is empty'``.
    The scheduler cannot do that: it looks h0 up first and takes it back."""
    items = [EncoderInput(0, 2, "h0"), EncoderInput(2, 1, "h1"),
             EncoderInput(3, 2, "h0"), EncoderInput(5, 2, "h0")]
    pair = Pair(vllm_side, 4, is_encoder_decoder=False)
    vreq, rreq = VllmRequestStandIn("r0", items), RefRequest("r0", items)

    def schedule(computed, new, budget):
        got = pair.scheduler_cls._try_schedule_encoder_inputs(
            pair.scheduler(False), vreq, computed, new, budget)
        want = try_schedule_encoder_inputs(rreq, computed, new, budget, pair.ref)
        assert tuple(got) == want
        return want

    assert schedule(0, 1, 2) == ([0], 1, 0)          # h0 is encoded
    pair.vllm.allocate(vreq, 0)
    pair.ref.allocate(rreq, 0)
    pair.vllm.free(vreq)                              # the request is freed: h0 freeable
    pair.ref.free(rreq)
    pair.assert_same_state("free")
    assert (pair.vllm.num_free_slots, pair.vllm.num_freeable_slots) == (2, 4)
    assert list(pair.vllm.freeable.items()) == [("h0", 2)]

    # h0 is in the cache: the scheduler would not allocate it ...
    assert not pair.scheduler_may_allocate(vreq, rreq, 0)
    assert pair.vllm.can_allocate(vreq, 0, 2, 0) and pair.ref.can_allocate(rreq, 0, 2, 0)
    # ... it takes it back instead (what _try_schedule_encoder_inputs does first).
    assert pair.vllm.check_and_update_cache(vreq, 0) and pair.ref.check_and_update_cache(rreq, 0)
    pair.assert_same_state("h0 taken back")
    assert (pair.vllm.num_free_slots, pair.vllm.num_freeable_slots) == (2, 2)
    assert not pair.vllm.freeable

    pair.vllm.free(vreq)
    pair.ref.free(rreq)
    pair.assert_same_state("free again")
    assert (pair.vllm.num_free_slots, pair.vllm.num_freeable_slots) == (2, 4)
    # h0 is taken back again, and h1 fits in the free slots: no eviction at all.
    assert schedule(0, 3, 1) == ([1], 3, 0)
    pair.assert_same_state("schedule")
    assert pair.vllm.cached == {"h0": {"r0"}} and pair.vllm.get_freed_mm_hashes() == []


def encoder_decoder_crash(vllm_side) -> tuple:
    """Four requests of one two-token item each, an encoder-decoder model, a cache of 4:
    A(h0) is encoded and computed (h0 freeable); B(h0) is scheduled without a lookup
    and h0 allocated again, then computed (h0's room now counted twice as freeable);
    C(h1) is encoded; scheduling D(h2) must evict and finds nothing freeable.  Both
    sides' answers to that last step."""
    pair = Pair(vllm_side, 4, is_encoder_decoder=True)

    def step(rid: str, mm_hash: str, computed_after: bool):
        items = [EncoderInput(0, 2, mm_hash)]
        vreq, rreq = VllmRequestStandIn(rid, items), RefRequest(rid, items)
        got, want = both(
            lambda: pair.scheduler_cls._try_schedule_encoder_inputs(
                pair.scheduler(False), vreq, 0, 2, 10),
            lambda: try_schedule_encoder_inputs(rreq, 0, 2, 10, pair.ref,
                                                is_encoder_decoder=True))
        if isinstance(want, Crash):
            return got, want
        assert tuple(got) == want == ([0], 2, 8)
        pair.vllm.allocate(vreq, 0)
        pair.ref.allocate(rreq, 0)
        if computed_after:
            vreq.num_computed_tokens = 2
            pair.scheduler_cls._free_encoder_inputs(pair.scheduler(False), vreq)
            free_encoder_inputs(rreq, 2, pair.ref, is_encoder_decoder=True)
        pair.assert_same_state(rid)
        return None

    assert step("A", "h0", True) is None and step("B", "h0", True) is None
    assert (pair.vllm.num_free_slots, pair.vllm.num_freeable_slots) == (0, 4)
    assert step("C", "h1", False) is None
    return step("D", "h2", False)


def test_encoder_decoder_crash_is_reproduced(vllm_side):
    """vLLM 0.11.0 raises KeyError scheduling D; so does the reference."""
    got, want = encoder_decoder_crash(vllm_side)
    assert got == want == Crash("KeyError", "'dictionary is empty'")


def test_encoder_decoder_crash_check_can_fail(vllm_side):
    """Under the quirk's mutant (the reference's eviction runs past an empty freeable set
    with another exception) the check above no longer holds."""
    from harness.checks.mutants import find
    with find("encoder_eviction_of_nothing_raises_keyerror").patch():
        with pytest.raises(StopIteration):
            encoder_decoder_crash(vllm_side)


@pytest.mark.parametrize("how", ["free", "computed"])
def test_many_items_are_let_go_in_vllms_order(vllm_side, how):
    """Requests of up to 20 distinct items, a random subset cached: the order in
    which ``free`` and ``_free_encoder_inputs`` make them freeable is CPython's
    set order, not index order, and the two need not agree with each other."""
    rng = random.Random(0)
    orders = set()
    for _ in range(400):
        n = rng.randint(1, 20)
        items = [EncoderInput(k, 1, f"h{k}") for k in range(n)]
        cached = [k for k in range(n) if rng.random() < rng.random()]
        pair = Pair(vllm_side, n, is_encoder_decoder=False)
        vreq, rreq = VllmRequestStandIn("r", items), RefRequest("r", items)
        for k in cached:
            pair.vllm.allocate(vreq, k)
            pair.ref.allocate(rreq, k)
        if how == "free":
            pair.vllm.free(vreq)
            pair.ref.free(rreq)
        else:
            vreq.num_computed_tokens = n
            pair.scheduler_cls._free_encoder_inputs(pair.scheduler(False), vreq)
            free_encoder_inputs(rreq, n, pair.ref)
        pair.assert_same_state(f"{how} {cached}")
        orders.add([h for h, _ in pair.ref.freeable_order()] == [f"h{k}" for k in cached])
    assert orders == {True, False}  # some subsets really are let go out of index order


@settings(max_examples=40, deadline=None)
@given(batched=st.integers(4, 24), budget=st.none() | st.integers(1, 24),
       cache=st.none() | st.integers(1, 24), largest=st.integers(0, 24),
       whole_items=st.booleans())
def test_encoder_sizes_match_vllms_start_up(vllm_side, batched, budget, cache, largest,
                                            whole_items):
    """vLLM's Scheduler sizes its encoder budget and cache itself, from the scheduler
    config and the model's largest item (the stand-in registry's one number); the
    reference's sizes agree, and so does the refusal of an item that cannot fit one step
    with chunked multimodal input off."""
    from harness.engines.reference_engine import reference_config
    from harness.engines.vllm_adapter import build_scheduler
    from harness.formats.stream import Config, Stream
    from reference.scheduler import Scheduler

    config = Config(max_num_batched_tokens=batched, max_num_seqs=2, max_model_len=24,
                    num_gpu_blocks=16, encoder_compute_budget=budget, encoder_cache_size=cache,
                    max_tokens_per_mm_item=largest or None, disable_chunked_mm_input=whole_items)
    try:
        vllm = build_scheduler(config, largest)
        got = (vllm.max_num_encoder_input_tokens, vllm.encoder_cache_manager.cache_size)
    except ValueError:
        got = "refused"
    try:
        ref = Scheduler(reference_config(Stream(name="s", config=config, requests=())))
        want = (ref.encoder_compute_budget, ref.encoder_cache.cache_size)
    except ValueError:
        want = "refused"
    assert got == want
    assert (got == "refused") == (whole_items and largest > batched)
