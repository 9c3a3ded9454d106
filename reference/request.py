"""A request: its tokens, its progress, its status, and when it stops.

Mirrors: vllm/v1/request.py (Request, RequestStatus) and
vllm/v1/core/sched/utils.py (check_stop).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from reference.block_hash import BlockHash, HashInputs, extend_block_hashes
from reference.encoder_cache import EncoderInput
from reference.structured_output import Grammar


class RequestStatus(enum.IntEnum):
    """Ordered as in vLLM: every status after PREEMPTED is a finished one."""

    WAITING = 1
    WAITING_FOR_FSM = 2  # structured output: its grammar is still compiling
    WAITING_FOR_REMOTE_KVS = 3  # a KV connector is still loading its pages
    RUNNING = 4
    PREEMPTED = 5
    FINISHED_STOPPED = 6
    FINISHED_LENGTH_CAPPED = 7
    FINISHED_ABORTED = 8
    FINISHED_ERROR = 9  # from 0.31.0: an image's length does not match its cached output

    @property
    def is_finished(self) -> bool:
        return self > RequestStatus.PREEMPTED


@dataclass(eq=False)
class Request:
    """One request inside the scheduler (compared by identity, like vLLM's)."""

    request_id: str
    prompt_token_ids: list[int]
    max_tokens: int
    arrival_time: float
    priority: int = 0
    eos_token_id: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    cache_salt: str | None = None
    wants_prompt_logprobs: bool = False
    lora_id: int | None = None  # the LoRA adapter's integer id; None: the base model
    grammar: Grammar | None = None  # structured output's grammar; None: unconstrained
    encoder_inputs: tuple[EncoderInput, ...] = ()  # multimodal items, in prompt order
    pooling: bool = False  # a pooling request (an embedding): no sampling at all
    # Set when prefix caching is on: keys are kept for every full block.
    hash_block_size: int | None = None
    # From 0.19.0 (mm_hash_keys_carry_the_offset) an item's key holds its place in the block.
    mm_keys_with_offset: bool = False
    # From 0.31.0 (later_hashing_sees_every_item) a later hashing looks from the first item.
    mm_later_hashing_sees_every_item: bool = False
    # From 0.33.0 with an eagle drafter (eagle_hashes_cover_the_next_token): tokens after a
    # block that its key covers; the block is hashed once they exist.
    hash_lookahead_tokens: int = 0

    status: RequestStatus = RequestStatus.WAITING
    output_token_ids: list[int] = field(default_factory=list)
    all_token_ids: list[int] = field(default_factory=list)
    spec_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    num_preemptions: int = 0
    # Async scheduling: positions scheduled past the known tokens whose sampled token
    # is not back yet (reference.async_scheduler).
    num_output_placeholders: int = 0
    # Whether the request's last grant left known tokens (or placeholders) uncomputed:
    # it was mid-prefill when that step was scheduled (vLLM's is_prefill_chunk).
    left_mid_prefill: bool = False
    # Tokens scheduled in batches whose output is not applied yet (vLLM's
    # num_in_flight_tokens; read from 0.26.0, window_frees_wait_for_outputs).
    num_in_flight_tokens: int = 0
    # From 0.29.0 (window_pages_cached_sparsely): where the full-attention groups' hit
    # ended at the last lookup when it went past the hit every group agreed on, else 0.
    shared_prefix_boundary: int = 0
    block_hashes: list[BlockHash] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.pooling:
            self.max_tokens = 1  # whatever was asked: a pooling request has no sampling
        self.all_token_ids = list(self.prompt_token_ids)
        if self.grammar is not None:
            self.status = RequestStatus.WAITING_FOR_FSM
        self._hash_new_full_blocks()

    @property
    def hash_inputs(self) -> HashInputs:
        return HashInputs(self.lora_id, self.cache_salt, self.encoder_inputs,
                          self.mm_keys_with_offset, self.mm_later_hashing_sees_every_item,
                          self.hash_lookahead_tokens)

    @property
    def num_tokens(self) -> int:
        """Prompt plus outputs: the tokens whose KV is eventually written."""
        return len(self.all_token_ids)

    @property
    def num_tokens_with_spec(self) -> int:
        return len(self.all_token_ids) + len(self.spec_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def is_finished(self) -> bool:
        return self.status.is_finished

    def append_output_token(self, token: int) -> None:
        self.output_token_ids.append(token)
        self.all_token_ids.append(token)
        if self.hash_block_size is not None and \
                (len(self.all_token_ids) - self.hash_lookahead_tokens) % self.hash_block_size == 0:
            self._hash_new_full_blocks()

    def _hash_new_full_blocks(self) -> None:
        size = self.hash_block_size
        if size is not None and len(self.all_token_ids) - self.hash_lookahead_tokens \
                >= (len(self.block_hashes) + 1) * size:
            extend_block_hashes(self.block_hashes, self.all_token_ids, self.hash_block_size,
                                self.hash_inputs)


def check_stop(request: Request, max_model_len: int, stop_tokens_first: bool = False) -> bool:
    """Apply the stop rules to the newest output token; set the finished status.

    Length comes first (``max_model_len``, then ``max_tokens``), then EOS unless
    ``ignore_eos``, then the stop tokens.  From 0.11.1 (stop_tokens_before_length)
    EOS and the stop tokens come first, then length.
    """
    capped = length_capped(request, max_model_len)
    if capped and not stop_tokens_first:
        request.status = RequestStatus.FINISHED_LENGTH_CAPPED
        return True
    if stopped_by_eos(request) or stopped_by_stop_token(request):
        request.status = RequestStatus.FINISHED_STOPPED
        return True
    if capped:
        request.status = RequestStatus.FINISHED_LENGTH_CAPPED
        return True
    return False


def check_pooled(request: Request) -> bool:
    """A pooling request stops as soon as the model hands back its pooled output,
    which it does once the prefill is computed.  (Its ``max_tokens`` is 1 and it never
    has an output token, so the length rules never apply to it.)"""
    request.status = RequestStatus.FINISHED_STOPPED
    return True


def length_capped(request: Request, max_model_len: int) -> bool:
    """The request fills the model, or has all the outputs it asked for."""
    return request.num_tokens >= max_model_len or request.num_output_tokens >= request.max_tokens


def stopped_by_eos(request: Request) -> bool:
    return not request.ignore_eos and request.output_token_ids[-1] == request.eos_token_id


def stopped_by_stop_token(request: Request) -> bool:
    return request.output_token_ids[-1] in request.stop_token_ids
