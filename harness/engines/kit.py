"""The adapter kit: vLLM's conventions, kept once, for a simulator plugged into the harness.

A simulator decides who runs, how many tokens each computes, which pages each holds and
whom it preempts.  Everything else a trace holds is a convention of vLLM's, not a
scheduling decision, and an adapter that gets one wrong shows divergences that say
nothing about the simulator.  :class:`Adapter` keeps them:

* **the null page.**  vLLM's pool keeps page 0 back; its ``num_gpu_blocks`` counts it.
  The simulator is given ``num_gpu_blocks - 1`` pages, numbered from 0, and the kit
  hands the worker each page id plus one (``null_page = False`` turns this off, for a
  simulator that keeps a null page of its own);
* **finished next step.**  A request that stops in step *s*'s update is reported to the
  worker in step *s + 1*'s output, as vLLM's ``finished_req_ids`` are;
* **the stop rule and the statuses.**  After each step the kit applies vLLM's stop rule
  to the sampled tokens: length first (``max_model_len``, then ``max_tokens``), then
  EOS unless ``ignore_eos``, then stop tokens (from 0.11.1, EOS and stop tokens
  first), and gives the status vLLM gives: ``FINISHED_LENGTH_CAPPED`` or
  ``FINISHED_STOPPED``; ``WAITING`` until first scheduled, ``RUNNING``, ``PREEMPTED``
  until scheduled again.  The simulator still decides when it lets a request go: the
  kit tells it which requests vLLM stops (:meth:`Adapter.advance`) and reports what it
  does (a request it keeps is still ``RUNNING``);
* **what the worker is handed.**  A new or resumed request's whole page table, a
  running one's new pages only; the KV slots its tokens are written to (the worker's
  block table, :class:`reference.slot_mapping.WorkerBlockTable`); tokens computed
  before the step, reset to 0 on preemption;
* ``evicted``: the cached pages whose hash was dropped because they were handed out
  again; a simulator that reports nothing here has none.

An adapter implements five methods -- :meth:`build`, :meth:`admit`, :meth:`decide`,
:meth:`advance`, :meth:`free_pages` -- and, where the simulator keeps a page table,
:meth:`pages`; docs/engine-interface.md shows one.  ``features`` declares what the
simulator models (:mod:`harness.formats.features`); streams are drawn inside it.

Adapters translate; they never fix a simulator's behaviour.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from harness.formats.steps import NEW, RESUMED, RUNNING, Handed, Observed, RequestState, \
    Scheduled, nothing_scheduled, to_scheduled
from harness.formats.stream import RequestSpec, Stream
from reference.slot_mapping import WorkerBlockTable

#: Releases from which EOS and stop tokens are checked before length (stop_tokens_before_length).
_STOP_TOKENS_FIRST_FROM = (0, 11, 1)


@dataclass(frozen=True)
class SimConfig:
    """What a simulator is built from, in its own terms: ``num_pages`` excludes vLLM's
    null page (``num_gpu_blocks - 1``, unless the adapter keeps its own)."""

    num_pages: int
    block_size: int
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    enable_chunked_prefill: bool
    enable_prefix_caching: bool
    long_prefill_token_threshold: int
    stream: Stream


@dataclass
class Request:
    """One request as the simulator sees it: its tokens so far and vLLM's stopping
    parameters.  ``num_outputs_to_stop``: the outputs vLLM lets it produce before its stop
    rule stops it (for a simulator that knows each request's output length up front)."""

    id: str
    arrival_index: int
    prompt: tuple[int, ...]
    max_tokens: int
    eos_token_id: int | None
    ignore_eos: bool
    stop_token_ids: tuple[int, ...]
    priority: int
    num_outputs_to_stop: int
    outputs: list[int] = field(default_factory=list)

    @property
    def token_ids(self) -> list[int]:
        return [*self.prompt, *self.outputs]


@dataclass
class Decision:
    """What the simulator decided in one step.

    ``scheduled``: ``[(req_id, tokens)]`` in the order the batch holds them (running
    requests first, then those admitted now, as vLLM orders them); ``preempted``: ids,
    in order; ``hits``: for requests admitted now, the prompt tokens found in the prefix
    cache; ``evicted``: cached pages (the simulator's ids) whose hash was dropped."""

    scheduled: list[tuple[str, int]] = field(default_factory=list)
    preempted: list[str] = field(default_factory=list)
    hits: dict[str, int] = field(default_factory=dict)
    evicted: list[int] = field(default_factory=list)


class Adapter:
    """The engine interface (docs/engine-interface.md) over a simulator; see the module
    docstring for what it keeps and what a subclass maps."""

    name = "simulator"
    #: The vLLM release the simulator claims to follow.
    release = "0.11.0"
    #: The features of the stream format it models (harness.formats.features).
    features: frozenset[str] = frozenset()
    #: Features it cannot turn off: streams drawn for it have them on.
    always_on: frozenset[str] = frozenset()
    #: Whether the kit shifts page ids past vLLM's null page.
    null_page = True

    # -- what an adapter implements -------------------------------------------------------

    def build(self, config: SimConfig) -> None:
        """Build a fresh simulator for one stream."""
        raise NotImplementedError

    def admit(self, request: Request) -> None:
        """A request arrives (before this step's :meth:`decide`)."""
        raise NotImplementedError

    def decide(self) -> Decision:
        """Run the simulator's scheduler for one step."""
        raise NotImplementedError

    def advance(self, decision: Decision, sampled: dict[str, list[int]],
                stopping: set[str]) -> set[str]:
        """Apply the step's output: ``sampled`` tokens per request (already appended to
        each :class:`Request`'s ``outputs``); ``stopping``: the requests vLLM's stop rule
        stops now.  Returns the requests the simulator lets go (finished) now."""
        raise NotImplementedError

    def free_pages(self) -> int:
        """Free pages of the simulator's pool."""
        raise NotImplementedError

    def pages(self, req_id: str) -> list[int] | None:
        """The request's page table in the simulator (its own ids), or None when the
        simulator keeps counts, not ids (pages are then left out of the trace)."""
        return None

    # -- the engine interface, kept by the kit ---------------------------------------------

    def version(self) -> str:
        return self.release

    def start(self, stream) -> None:
        c = stream.config
        self._max_model_len = c.max_model_len
        self._requests: dict[str, Request] = {}
        self._status: dict[str, str] = {}
        self._computed: dict[str, int] = {}
        self._handed: dict[str, int] = {}  # pages of each request's table the worker has
        self._rows: dict[str, int] = {}
        self._told: list[str] = []  # finished, to be reported in the next output
        self._reasons: dict[str, str] = {}  # the status vLLM's stop rule gives
        self._last: Decision | None = None
        self._stop_tokens_first = _release(self.release) >= _STOP_TOKENS_FIRST_FROM
        self._shift = 1 if self.null_page else 0
        self._worker = WorkerBlockTable(c.block_size, -(-c.max_model_len // c.block_size) + 1)
        self.build(SimConfig(
            num_pages=c.num_gpu_blocks - self._shift, block_size=c.block_size,
            max_num_seqs=c.max_num_seqs, max_num_batched_tokens=c.max_num_batched_tokens,
            max_model_len=c.max_model_len, enable_chunked_prefill=c.enable_chunked_prefill,
            enable_prefix_caching=c.enable_prefix_caching,
            long_prefill_token_threshold=c.long_prefill_token_threshold,
            stream=stream.to_json()))

    def add(self, req: RequestSpec, arrival_index: int) -> None:
        r = Request(req.id, arrival_index, tuple(req.prompt), req.effective_max_tokens,
                    req.eos_token_id, req.ignore_eos, tuple(req.stop_token_ids), req.priority,
                    req.stop_index(self._max_model_len) + 1)
        self._requests[r.id] = r
        self._status[r.id] = "WAITING"
        self._computed[r.id] = 0
        self._rows[r.id] = len(self._rows)
        self.admit(r)

    def schedule(self) -> Scheduled:
        told, self._told = self._told, []
        decision = self.decide()
        self._check(decision)
        self._last = decision
        if not decision.scheduled and not decision.preempted:
            out = nothing_scheduled()
            out.finished = sorted(told)
            return out
        for rid in decision.preempted:
            self._status[rid] = "PREEMPTED"
            self._computed[rid] = 0
            self._handed.pop(rid, None)
        handed, before = self._hand_over(decision)
        # vLLM reports a lookup (0 tokens without a prefix cache) for every admitted request.
        hits = {h.req_id: decision.hits.get(h.req_id, 0) for h in handed if h.kind != RUNNING}
        observed = Observed(preempted=list(decision.preempted), hits=hits,
                            evicted=[p + self._shift for p in decision.evicted])
        reqs = self._requests
        out = to_scheduled(handed, decision.scheduled, {}, told, before, observed,
                           [self._worker], self._rows,
                           lambda rid: (len(reqs[rid].token_ids), len(reqs[rid].outputs)))
        for rid, n in decision.scheduled:
            self._computed[rid] = before[rid] + n
            self._status[rid] = "RUNNING"
        if not self.keeps_pages:
            out.new_block_ids, out.slots = {}, {}
        return out

    def _hand_over(self, decision: Decision) -> tuple[list[Handed], dict[str, int]]:
        """What the worker is handed for each scheduled request (a new or resumed one's
        whole table, a running one's new pages), and the tokens each computed before."""
        handed, before = [], dict(self._computed)
        for rid, _ in decision.scheduled:
            table = self._table(rid)
            if self._status[rid] in ("WAITING", "PREEMPTED"):
                kind = NEW if self._status[rid] == "WAITING" else RESUMED
                before[rid] = decision.hits.get(rid, 0)
                new = table
            else:
                kind = RUNNING
                new = None if table is None else table[self._handed.get(rid, 0):]
            if table is not None:
                self._handed[rid] = len(table)
            blocks = None if table is None or (kind == RUNNING and not new) else [new]
            handed.append(Handed(rid, kind, blocks, before[rid]))
        return handed, before

    def update(self, scheduled: Scheduled, sampled: dict[str, list[int]],
               finished_recving=(), finished_sending=()) -> None:
        stopping = set()
        for rid, tokens in sampled.items():
            r = self._requests[rid]
            for token in tokens:
                r.outputs.append(token)
                reason = self._stop_reason(r)
                if reason:
                    stopping.add(rid)
                    self._reasons[rid] = reason
                    break
        let_go = self.advance(self._last or Decision(), sampled, stopping)
        for rid in sorted(let_go):
            self._status[rid] = self._reasons.get(rid, "FINISHED_STOPPED")
            self._told.append(rid)

    def state(self, req_id: str) -> RequestState:
        return RequestState(self._status[req_id], self._computed[req_id],
                            len(self._requests[req_id].outputs))

    def num_unfinished(self) -> int:
        return sum(not s.startswith("FINISHED") for s in self._status.values())

    def has_requests(self) -> bool:
        return self.num_unfinished() > 0 or bool(self._told)

    def num_free_blocks(self) -> int:
        return self.free_pages()

    # -- helpers ---------------------------------------------------------------------------

    @property
    def keeps_pages(self) -> bool:
        """Whether the simulator keeps page ids (its adapter maps :meth:`pages`)."""
        return type(self).pages is not Adapter.pages

    def _check(self, d: Decision) -> None:
        """A decision the harness cannot turn into a step is the simulator's failure, said
        in one line: an id twice, no tokens, a request not running, one past its stop."""
        seen = set()
        for rid, n in d.scheduled:
            if rid in seen:
                raise ValueError(f"{self.name} scheduled {rid} twice in one step")
            seen.add(rid)
            if rid not in self._requests:
                raise ValueError(f"{self.name} scheduled {rid}, which never arrived")
            if self._status[rid].startswith("FINISHED"):
                raise ValueError(f"{self.name} scheduled {rid} after it finished "
                                 f"({self._status[rid]})")
            if n <= 0:
                raise ValueError(f"{self.name} scheduled {rid} for {n} tokens")
            r = self._requests[rid]
            if len(r.outputs) >= r.num_outputs_to_stop:
                raise ValueError(f"{self.name} kept {rid} running past the output at which "
                                 f"vLLM stops it ({r.num_outputs_to_stop} outputs)")
        for rid in d.preempted:
            if rid not in self._requests:
                raise ValueError(f"{self.name} preempted {rid}, which never arrived")

    def _table(self, rid: str) -> list[int] | None:
        pages = self.pages(rid)
        return None if pages is None else [p + self._shift for p in pages]

    def _stop_reason(self, r: Request) -> str | None:
        """vLLM's stop rule (reference.request.check_stop) on the newest output."""
        capped = len(r.prompt) + len(r.outputs) >= self._max_model_len \
            or len(r.outputs) >= r.max_tokens
        token = r.outputs[-1]
        stopped = (not r.ignore_eos and token == r.eos_token_id) or token in r.stop_token_ids
        if capped and not self._stop_tokens_first:
            return "FINISHED_LENGTH_CAPPED"
        if stopped:
            return "FINISHED_STOPPED"
        return "FINISHED_LENGTH_CAPPED" if capped else None


def _release(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split(".")[:3] if p.isdigit())


def record_calls(obj, method: str, into: list, key=lambda *args: args[0]) -> None:
    """Record every call of ``obj.method`` (its ``key`` of the arguments) in ``into``, in
    order, and then make the call: how an adapter sees a simulator's preemptions without
    changing them."""
    original = getattr(obj, method)

    def recording(*args, **kwargs):
        into.append(key(*args, **kwargs))
        return original(*args, **kwargs)
    setattr(obj, method, recording)
