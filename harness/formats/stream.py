"""Request streams: the input format, its defaults and its validation.

A stream is plain JSON: ``{"config": {...}, "requests": [...]}`` plus optional
``name``, ``description`` and ``reset_prefix_cache_steps``.  The format is
documented in ``docs/stream-format.md``.

Two sources of truth, no third: the JSON Schema
``harness/formats/schemas/stream.schema.json`` holds every shape and bound (types,
ranges, sizes, unknown and missing fields, the message of each rule), and
:func:`rule_errors` holds the rules that compare fields.  A stream that breaks
rules raises one :class:`StreamError` listing every broken rule, one line
each, naming the field and the rule; the CLI turns it into exit code 2.
Validation happens before any engine runs, so nothing is written half-way."""

from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from harness.formats.paths import MODELS_DIR
from harness.formats.stream_schema import shape_errors
from reference import kv_sizing
from reference.arith import cdiv


class StreamError(ValueError):
    """A stream or config that breaks rules: one line per broken rule, in ``errors``."""

    def __init__(self, errors: str | list[str]):
        self.errors = [_one_line(str(e)) for e in ([errors] if isinstance(errors, str) else errors)]
        super().__init__("\n".join(self.errors))


def _one_line(text: str) -> str:
    """Escape line breaks and other control characters (e.g. inside an id)."""
    return "".join(ch if ch.isprintable() else ch.encode("unicode_escape").decode("ascii")
                   for ch in text)


@dataclass(frozen=True)
class KVCacheGroup:
    """One KV cache group of the model: its layers' attention type and that type's parameter."""

    type: str = "full"
    sliding_window: int | None = None
    attention_chunk_size: int | None = None

    def to_json(self) -> dict[str, Any]:
        """Only the fields that are set: the type and its parameter."""
        return {k: v for k, v in asdict(self).items() if v is not None}


#: The parameter each group type needs (and no other type may have).
GROUP_PARAMETER = {"full": None, "sliding_window": "sliding_window",
                   "chunked_local": "attention_chunk_size", "mamba": None}


PARAMETER_OWNER = {param: kind for kind, param in GROUP_PARAMETER.items() if param}


@dataclass(frozen=True)
class Config:
    """Engine configuration of a stream (vLLM's scheduler/cache/spec config)."""

    block_size: int = 16
    num_gpu_blocks: int = 64
    max_num_batched_tokens: int = 128
    max_num_seqs: int = 8
    max_model_len: int = 256
    enable_chunked_prefill: bool = True
    enable_prefix_caching: bool = True
    long_prefill_token_threshold: int = 0
    policy: str = "fcfs"
    num_speculative_tokens: int = 0
    speculative_method: str = "ngram"
    # None: one full-attention group, the model of every stream before groups existed.
    kv_cache_groups: tuple[KVCacheGroup, ...] | None = None
    # None: LoRA off (vLLM has no LoRAConfig); else at most this many adapters per step.
    max_loras: int | None = None
    # Multimodal inputs: the encoder's tokens per step and its cache's room as configured
    # (None: max_num_batched_tokens, as vLLM sets them), the model's largest item (None:
    # the stream's longest), and whether a placeholder may be split across steps.  Any of
    # the first three makes the model one with an encoder.
    encoder_compute_budget: int | None = None
    encoder_cache_size: int | None = None
    max_tokens_per_mm_item: int | None = None
    disable_chunked_mm_input: bool = False
    # Whether the scheduler keeps stats (vLLM's log_stats, on in a server unless
    # --disable-log-stats): the trace then carries each step's SchedulerStats.
    log_stats: bool = False
    # Whether the block pool publishes KV cache events (vLLM's KVEventsConfig
    # enable_kv_cache_events, what KV-aware routers read): each step of the trace then
    # carries the events published that step.
    kv_cache_events: bool = False
    # A KV connector (vLLM's KVTransferConfig) in this role: kv_producer (sends finished
    # requests' pages), kv_consumer (loads prompts' pages) or kv_both; None: no connector.
    # The connector is scripted per request (RequestSpec.kv_transfer).
    kv_role: str | None = None
    # vLLM's --async-scheduling: the AsyncScheduler under EngineCore's batch queue, which
    # schedules the next batch before the last one's output is back (output placeholders).
    async_scheduling: bool = False
    # Async scheduling: the steps whose batch the worker has finished by the time the
    # engine looks, right after scheduling it; that step also applies its output.  Every
    # other batch is applied one step later, after the next batch is scheduled.
    async_ready_steps: tuple[int, ...] = ()
    # vLLM's --pipeline-parallel-size as the engine loop sees it: the executor takes this
    # many batches at once (max_concurrent_batches), so EngineCore keeps a batch queue
    # over the synchronous Scheduler; a request whose batch is in flight has nothing
    # to schedule.  The ready steps are those of async_ready_steps.
    pipeline_parallel_size: int = 1
    # The KV cache memory the worker reports free at start-up, in bytes (vLLM's
    # determine_available_memory).  When given, the pool is what vLLM's start-up makes
    # of it for the model (num_gpu_blocks is then computed, not given).
    kv_cache_memory_bytes: int | None = None
    model: str = "qwen2.5-0.5b"
    max_steps: int = 1000

    @property
    def groups(self) -> tuple[KVCacheGroup, ...]:
        return self.kv_cache_groups or (KVCacheGroup(),)

    @property
    def has_encoder(self) -> bool:
        return not (self.encoder_compute_budget is None and self.encoder_cache_size is None
                    and self.max_tokens_per_mm_item is None)

    @property
    def uses_eagle(self) -> bool:
        return self.num_speculative_tokens > 0 and self.speculative_method == "eagle"

    @property
    def batch_queue(self) -> bool:
        """Whether vLLM's engine steps with a batch queue (``step_with_batch_queue``):
        under async scheduling, and under pipeline parallelism."""
        return self.async_scheduling or self.pipeline_parallel_size > 1

    def to_json(self) -> dict[str, Any]:
        """Every field, except the optional features' fields when they are left out (so
        streams written before those features existed keep their bytes and hashes)."""
        out = _without_absent(_fields_of(self), OPTIONAL_CONFIG_FIELDS)
        if self.async_ready_steps:
            out["async_ready_steps"] = list(self.async_ready_steps)
        if self.kv_cache_memory_bytes is not None:
            del out["num_gpu_blocks"]  # computed from the memory
        if self.kv_cache_groups is not None:
            out["kv_cache_groups"] = [g.to_json() for g in self.kv_cache_groups]
        return out


#: Fields written to canonical JSON only when they differ from their default (added after
#: streams were first recorded, so older streams keep their bytes).
OPTIONAL_CONFIG_FIELDS = {"kv_cache_groups": None, "max_loras": None,
                          "encoder_compute_budget": None, "encoder_cache_size": None,
                          "max_tokens_per_mm_item": None, "disable_chunked_mm_input": False,
                          "log_stats": False, "kv_cache_events": False, "kv_role": None,
                          "async_scheduling": False, "async_ready_steps": (),
                          "kv_cache_memory_bytes": None, "pipeline_parallel_size": 1}


OPTIONAL_REQUEST_FIELDS = {"lora": None, "structured_output": None, "mm_inputs": (),
                           "pooling": False, "kv_transfer": None}


def _fields_of(obj) -> dict[str, Any]:
    """A dataclass's fields as they are (``asdict`` without its deep copy): the callers
    replace every field that is not a plain value, and a stream is written for every
    trace."""
    return {name: getattr(obj, name) for name in _field_names(type(obj))}


@functools.cache
def _field_names(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in fields(cls))


def _without_absent(d: dict[str, Any], optional: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if not (k in optional and v == optional[k])}


@dataclass(frozen=True)
class MMInput:
    """One multimodal item of a prompt (an image, an audio clip): its placeholder's first
    position and length in the prompt, and its content hash (vLLM's mm_hash)."""

    offset: int
    length: int
    hash: str

    @property
    def end(self) -> int:
        return self.offset + self.length


@dataclass(frozen=True)
class StructuredOutput:
    """A grammar-constrained request (vLLM's structured outputs), with a scripted grammar.

    ``ready_step``: the step before whose ``schedule()`` the grammar has compiled
    (until then the request waits in WAITING_FOR_FSM).  ``rejected_tokens``: the
    tokens the grammar never accepts; a draft list is cut before the first of them.
    """

    ready_step: int
    rejected_tokens: tuple[int, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"ready_step": self.ready_step, "rejected_tokens": list(self.rejected_tokens)}


@dataclass(frozen=True)
class KVTransfer:
    """What the scripted KV connector holds for one request (see docs/stream-format.md).

    ``external_tokens``: the prompt's first tokens are held outside (by a prefill node,
    an offload store); the connector offers those past the local prefix hit, all but
    the request's last token unless the load is asynchronous.  ``load_async``: the
    load runs in the background; the worker reports it done ``load_steps`` steps after
    the step that started it (0: that step).  ``unknown_lookups``: the connector's
    first answers are "cannot tell yet".  ``send_steps``: when the request finishes,
    the connector keeps its pages to send them, reported done that many steps later;
    None: the pages are freed at once.
    """

    external_tokens: int = 0
    load_async: bool = False
    load_steps: int = 0
    unknown_lookups: int = 0
    send_steps: int | None = None


KV_ROLES = ("kv_producer", "kv_consumer", "kv_both")


@dataclass(frozen=True)
class RequestSpec:
    """One request with its scripted model output.

    ``max_tokens`` defaults to ``len(output)``: the script is the whole answer.
    """

    id: str
    prompt: tuple[int, ...]
    output: tuple[int, ...]
    arrival_step: int = 0
    max_tokens: int | None = None
    eos_token_id: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    priority: int = 0
    abort_step: int | None = None
    cache_salt: str | None = None
    prompt_logprobs: int | None = None
    drafts: tuple[tuple[int, ...], ...] = ()
    lora: str | None = None  # the LoRA adapter's name; None: the base model
    structured_output: StructuredOutput | None = None
    mm_inputs: tuple[MMInput, ...] = ()  # in prompt order
    pooling: bool = False  # an embedding: no sampling, finished once its prefill is done
    kv_transfer: KVTransfer | None = None  # the scripted KV connector's part; needs kv_role

    @property
    def effective_max_tokens(self) -> int:
        return len(self.output) if self.max_tokens is None else self.max_tokens

    def stop_index(self, max_model_len: int) -> int:
        """Index of the output token at which the request must stop."""
        limit = min(self.effective_max_tokens, max_model_len - len(self.prompt))
        for i, token in enumerate(self.output[:limit]):
            if token in self.stop_token_ids:
                return i
            if not self.ignore_eos and token == self.eos_token_id:
                return i
        return limit - 1


@dataclass(frozen=True)
class Stream:
    config: Config
    requests: tuple[RequestSpec, ...]
    name: str = ""
    description: str = ""
    reset_prefix_cache_steps: tuple[int, ...] = ()

    def to_json(self) -> dict[str, Any]:
        """The canonical JSON form: every field, defaults made explicit."""
        out: dict[str, Any] = {
            "config": self.config.to_json(),
            "requests": [_request_json(r) for r in self.requests],
        }
        if self.name:
            out["name"] = self.name
        if self.description:
            out["description"] = self.description
        if self.reset_prefix_cache_steps:
            out["reset_prefix_cache_steps"] = list(self.reset_prefix_cache_steps)
        return out

    def canonical_bytes(self) -> bytes:
        return canonical_json(self.to_json()).encode()

    def sha256(self) -> str:
        """The hash of the canonical form, computed once (a stream is immutable)."""
        digest = self.__dict__.get("_sha256")
        if digest is None:
            digest = hashlib.sha256(self.canonical_bytes()).hexdigest()
            object.__setattr__(self, "_sha256", digest)
        return digest

    @property
    def speculative(self) -> bool:
        return self.config.num_speculative_tokens > 0


@dataclass(frozen=True)
class Timeline:
    """When a stream's requests come and go, step by step: what every step loop reads."""

    arrivals: dict[int, list[tuple[int, RequestSpec]]]  # step -> [(arrival index, request)]
    aborts: dict[int, list[RequestSpec]]  # step -> requests aborted then
    resets: frozenset[int]  # steps whose prefix cache is reset first
    last_arrival: int


def timeline(stream: Stream) -> Timeline:
    arrivals: dict[int, list[tuple[int, RequestSpec]]] = {}
    aborts: dict[int, list[RequestSpec]] = {}
    for index, r in enumerate(stream.requests):
        arrivals.setdefault(r.arrival_step, []).append((index, r))
        if r.abort_step is not None:
            aborts.setdefault(r.abort_step, []).append(r)
    return Timeline(arrivals, aborts, frozenset(stream.reset_prefix_cache_steps), max(arrivals))


def lora_ids(stream: Stream) -> dict[str, int]:
    """Each adapter's integer id: 1, 2, ... in order of first mention in the stream (a
    server gives ids as it loads adapters; any order serves, as long as both engines
    use the same one)."""
    ids: dict[str, int] = {}
    for r in stream.requests:
        if r.lora is not None and r.lora not in ids:
            ids[r.lora] = len(ids) + 1
    return ids


def canonical_json(obj: Any) -> str:
    """Deterministic compact JSON: sorted keys, no spaces."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"))


def _request_json(r: RequestSpec) -> dict[str, Any]:
    d = _without_absent(_fields_of(r), OPTIONAL_REQUEST_FIELDS)
    d["prompt"] = list(r.prompt)
    d["output"] = list(r.output)
    d["stop_token_ids"] = list(r.stop_token_ids)
    d["drafts"] = [list(x) for x in r.drafts]
    if r.structured_output is not None:
        d["structured_output"] = r.structured_output.to_json()
    if r.mm_inputs:
        d["mm_inputs"] = [asdict(m) for m in r.mm_inputs]
    if r.kv_transfer is not None:
        d["kv_transfer"] = asdict(r.kv_transfer)
    return d


#: A stream file larger than this is refused before it is read.
MAX_FILE_BYTES = 64 << 20


#: Prompt, output and draft tokens of all requests together.
MAX_TOTAL_TOKENS = 4_000_000


def load_stream(path: str | Path) -> Stream:
    """Read and validate a stream file; raises StreamError with one line per error."""
    path = Path(path)
    try:
        if path.stat().st_size > MAX_FILE_BYTES:
            raise StreamError(f"{path}: file is larger than {MAX_FILE_BYTES >> 20} MiB")
        text = path.read_bytes().decode("utf-8")
    except OSError as exc:
        raise StreamError(f"{path}: cannot read: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise StreamError(f"{path}: not valid JSON: not UTF-8 text (byte {exc.start})") from None
    try:
        data = json.loads(text, object_pairs_hook=_refuse_duplicate_keys)
    except json.JSONDecodeError as exc:
        raise StreamError(f"{path}: not valid JSON: {exc.msg} at line {exc.lineno}") from None
    except RecursionError:
        raise StreamError(f"{path}: not valid JSON: nested too deeply") from None
    except _DuplicateKey as exc:
        raise StreamError(f"{path}: not valid JSON: key {exc.args[0]!r} appears twice in one object") from None
    try:
        return parse_stream(data, default_name=safe_name(path.stem))
    except StreamError as exc:
        raise StreamError([f"{path}: {m}" for m in exc.errors]) from None


class _DuplicateKey(ValueError):
    pass


def _refuse_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(key)
        out[key] = value
    return out


def safe_name(text: str) -> str:
    """A stream name from any text (a file name): every character a name may not hold becomes '_'."""
    name = "".join(ch if ch.isascii() and (ch.isalnum() or ch in "_.-") else "_" for ch in text)
    if name[:1] in (".", "-"):
        name = "_" + name[1:]
    return name[:128] or "stream"


def parse_stream(data: Any, default_name: str = "") -> Stream:
    """Build a validated Stream from JSON data; every error of the data at once."""
    errors = shape_errors(data)
    if errors:
        raise StreamError(errors)
    return parse_drawn_stream(data, default_name)


def parse_drawn_stream(data: dict[str, Any], default_name: str = "") -> Stream:
    """A Stream from data that ``harness.checks.strategies`` drew: every cross-field rule is
    checked, the schema's walk is not.

    The walk costs about 5 ms a stream, a tenth of drawing it, and the strategies build
    each field within the schema's bounds; ``tests/test_strategies.py`` holds every
    strategy's output to the whole of :func:`parse_stream`.  Data from anywhere else
    (a file, a user, a recorded trace) goes through :func:`parse_stream`.
    """
    stream = _build(data, default_name)
    errors = _pool_given_twice(data) + rule_errors(stream)
    if errors:
        raise StreamError(errors)
    return stream


def _pool_given_twice(data: dict[str, Any]) -> list[str]:
    config = data.get("config", {})
    if "num_gpu_blocks" in config and config.get("kv_cache_memory_bytes") is not None:
        return ["config.num_gpu_blocks: not with kv_cache_memory_bytes (the pool is computed "
                "from the memory)"]
    return []


@functools.lru_cache(maxsize=64)
def model_shape(model: str) -> kv_sizing.ModelShape:
    """The KV shape of a bundled model (``fixtures/models/<model>``), read once per model;
    raises as ``ModelShape.load`` raises (nothing is kept then)."""
    return kv_sizing.ModelShape.load(MODELS_DIR / model)


def kv_cache_layout(c: Config, null_page_held_back: bool = False) -> kv_sizing.KVCacheLayout:
    """What vLLM's start-up makes of ``kv_cache_memory_bytes`` for the stream's model
    (reference.kv_sizing; raises NotEnoughKVCacheMemory as vLLM raises at start-up;
    ``null_page_held_back``: the check of 0.29.0 on)."""
    shape = model_shape(c.model)
    return kv_sizing.kv_cache_layout(shape, c.block_size, c.kv_cache_memory_bytes,
                                     c.max_model_len, null_page_held_back=null_page_held_back)


def pages_in_memory(c: Config) -> int:
    """How many pages ``kv_cache_memory_bytes`` holds for the stream's model, without
    vLLM's start-up check (reference.kv_sizing)."""
    shape = model_shape(c.model)
    return kv_sizing.num_blocks_for_budget(shape, c.block_size, c.kv_cache_memory_bytes)


def _pool_from_memory(config: dict[str, Any]) -> dict[str, Any]:
    """The config with num_gpu_blocks estimated from kv_cache_memory_bytes, where it can be
    (the rules report a model, memory or groups it cannot be estimated for).  Only for
    reading and drawing streams: each engine sizes its own pool at start-up (the vLLM
    engines with vLLM's sizing, the reference with its own), and whether a memory is
    enough is their start-up check's to say, compared like any other step."""
    try:
        c = Config(**config)
        if c.kv_cache_groups is None and (MODELS_DIR / c.model / "config.json").is_file():
            return {**config, "num_gpu_blocks": pages_in_memory(c)}
    except (TypeError, ValueError, KeyError, OSError):
        pass
    return config


def _build(data: dict[str, Any], default_name: str) -> Stream:
    """A Stream from data whose shape the schema accepted."""
    requests = tuple(RequestSpec(**{
        **r,
        "prompt": tuple(r["prompt"]), "output": tuple(r["output"]),
        "stop_token_ids": tuple(r.get("stop_token_ids", ())),
        "drafts": tuple(tuple(d) for d in r.get("drafts", ())),
        "structured_output": _structured_output(r),
        "mm_inputs": tuple(MMInput(**m) for m in r.get("mm_inputs", ())),
        "kv_transfer": None if r.get("kv_transfer") is None else KVTransfer(**r["kv_transfer"]),
    }) for r in data["requests"])
    config = dict(data.get("config", {}))
    if config.get("kv_cache_groups") is not None:
        config["kv_cache_groups"] = tuple(KVCacheGroup(**g) for g in config["kv_cache_groups"])
    if "async_ready_steps" in config:
        config["async_ready_steps"] = tuple(sorted(set(config["async_ready_steps"])))
    if config.get("kv_cache_memory_bytes") is not None:
        config = _pool_from_memory(config)
    return Stream(Config(**config), requests,
                  data.get("name", default_name), data.get("description", ""),
                  tuple(sorted(set(data.get("reset_prefix_cache_steps", ())))))


def _structured_output(r: dict[str, Any]) -> StructuredOutput | None:
    """The grammar is ready at the request's arrival unless the stream says later."""
    so = r.get("structured_output")
    if so is None:
        return None
    ready = so.get("ready_step")
    return StructuredOutput(r.get("arrival_step", 0) if ready is None else ready,
                            tuple(so.get("rejected_tokens", ())))


def rule_errors(s: Stream) -> list[str]:
    """One line per cross-field rule the (well-shaped) stream breaks."""
    return _config_errors(s.config) + _request_errors(s)


#: The schema's bound on num_gpu_blocks, which a pool computed from memory keeps too.
MAX_POOL_PAGES = 1048576


def _memory_errors(c: Config) -> list[str]:
    """The pool from memory: one full-attention group (vLLM's start-up for the bundled
    models), and no more pages than the harness runs.  Whether the memory holds one
    max_model_len request is not asked here: that is vLLM's start-up check, which each
    engine applies with its own sizing (a memory too small ends both runs at start-up)."""
    if c.kv_cache_memory_bytes is None:
        return []
    if c.kv_cache_groups is not None:
        return ["config.kv_cache_memory_bytes: not with kv_cache_groups (the pool of a "
                "stream with its own groups is given as num_gpu_blocks)"]
    try:
        pages = pages_in_memory(c)
    except (ValueError, KeyError, OSError):
        return []  # the model's own error is reported
    if pages > MAX_POOL_PAGES:
        return [f"config.kv_cache_memory_bytes: makes {pages} pages, more than "
                f"the {MAX_POOL_PAGES} num_gpu_blocks may be (a limit of the harness)"]
    return []


def _async_errors(c: Config) -> list[str]:
    """vLLM 0.11.0 refuses speculative decoding with async scheduling at start-up, and
    async scheduling with pipeline parallelism; the harness does not script a KV
    connector's transfers (nor drafts) under a batch queue."""
    errors = []
    if c.async_ready_steps and not c.batch_queue:
        errors.append("config.async_ready_steps: needs async_scheduling or "
                      "pipeline_parallel_size > 1")
    if c.pipeline_parallel_size > 1:
        if c.async_scheduling:
            errors.append("config.pipeline_parallel_size: not with async_scheduling "
                          "(vLLM 0.11.0 refuses it at start-up)")
        if c.kv_cache_memory_bytes is not None:
            errors.append("config.pipeline_parallel_size: not with kv_cache_memory_bytes "
                          "(each stage holds a share of the layers; the harness sizes "
                          "the pool of one worker holding them all)")
        if c.num_speculative_tokens > 0 or c.kv_role is not None:
            errors.append("config.pipeline_parallel_size: not with speculative decoding nor "
                          "a KV connector (kv_role) (the harness does not script them "
                          "under a batch queue)")
    if c.async_scheduling and c.num_speculative_tokens > 0:
        errors.append("config.async_scheduling: not with speculative decoding "
                      "(vLLM 0.11.0 refuses it at start-up)")
    if c.async_scheduling and c.kv_role is not None:
        errors.append("config.async_scheduling: not with a KV connector (kv_role) "
                      "(the harness does not script transfers under async scheduling)")
    return errors


#: Each bundled model's max_position_embeddings, read once from its config.json.
_POSITION_LIMITS: dict[str, Any] = {}


def _position_limit(model: str) -> Any:
    """The model's ``max_position_embeddings`` (None when its config has none), or
    :data:`_NO_MODEL` when ``fixtures/models/<model>/config.json`` is not there (asked
    again next time); a config is read once per model."""
    if model in _POSITION_LIMITS:
        return _POSITION_LIMITS[model]
    path = MODELS_DIR / model / "config.json"
    if model.startswith(".") or not path.is_file():
        return _NO_MODEL
    limit = _POSITION_LIMITS[model] = json.loads(path.read_text()).get("max_position_embeddings")
    return limit


_NO_MODEL = object()


def _config_errors(c: Config) -> list[str]:
    errors = []
    limit = _position_limit(c.model)
    if limit is _NO_MODEL:
        return [f"config.model: no model config at fixtures/models/{c.model}/config.json"]
    # The rules below are the ones vLLM 0.11.0 itself enforces at start-up.
    if isinstance(limit, int) and c.max_model_len > limit:
        errors.append(f"config.max_model_len: must be <= the model's max_position_embeddings ({limit})")
    if c.max_num_batched_tokens < c.max_num_seqs:
        errors.append("config.max_num_batched_tokens: must be >= max_num_seqs (vLLM SchedulerConfig)")
    if not c.enable_chunked_prefill and c.max_num_batched_tokens < c.max_model_len:
        errors.append("config.max_num_batched_tokens: must be >= max_model_len when "
                      "enable_chunked_prefill is false (vLLM SchedulerConfig)")
    if (c.disable_chunked_mm_input and c.max_tokens_per_mm_item is not None
            and c.max_tokens_per_mm_item > c.max_num_batched_tokens):
        errors.append("config.max_tokens_per_mm_item: must be <= max_num_batched_tokens when "
                      "disable_chunked_mm_input is true (vLLM refuses it at start-up)")
    errors += _group_errors(c)
    if c.kv_role is not None and len(c.groups) > 1:
        errors.append("config.kv_role: a KV connector needs a single KV cache group "
                      "(vLLM 0.11.0's scheduler asserts it)")
    errors += _async_errors(c)
    errors += _memory_errors(c)
    if c.kv_cache_events and len(c.groups) > 1:
        errors.append("config.kv_cache_events: needs a single KV cache group (vLLM 0.11.0 turns "
                      "its hybrid KV cache manager off when KV cache events are on)")
    if c.kv_cache_memory_bytes is not None:
        pass  # the engines' start-up check (see _memory_errors)
    elif c.kv_cache_groups is None:
        needed = cdiv(c.max_model_len, c.block_size)
        if c.num_gpu_blocks < needed:
            errors.append(f"config.num_gpu_blocks: must be >= ceil(max_model_len / block_size) = "
                          f"{needed}, enough KV cache for one max_model_len request "
                          "(vLLM start-up check)")
    elif not errors:
        needed = sum(max_pages_per_request(g, c) for g in c.groups)
        if c.num_gpu_blocks < needed:
            errors.append(f"config.num_gpu_blocks: must be >= {needed}, the pages one "
                          "max_model_len request can hold in all KV cache groups together "
                          "(vLLM start-up check)")
    return errors


def largest_mm_item(s: Stream) -> int:
    """The model's largest multimodal item, in placeholder tokens: as the stream's config
    says, else its longest item (0 for a stream with no items)."""
    if s.config.max_tokens_per_mm_item is not None:
        return s.config.max_tokens_per_mm_item
    return max((m.length for r in s.requests for m in r.mm_inputs), default=0)


def max_pages_per_request(g: KVCacheGroup, c: Config) -> int:
    """The pages vLLM's start-up check reserves for one request in one group
    (``KVCacheSpec.max_memory_usage_bytes`` over the page size)."""
    if g.type == "sliding_window":
        tokens = min(g.sliding_window - 1 + c.max_num_batched_tokens, c.max_model_len)
        return cdiv(tokens, c.block_size) + 1  # the window may start mid-page
    if g.type == "chunked_local":
        tokens = min(g.attention_chunk_size + c.max_num_batched_tokens, c.max_model_len)
        return cdiv(tokens, c.block_size)
    if g.type == "mamba":
        return 1
    return cdiv(c.max_model_len, c.block_size)


def _group_errors(c: Config) -> list[str]:
    """The KV cache groups vLLM 0.11.0 can run (kv_cache_coordinator.py refuses the rest)."""
    if c.kv_cache_groups is None:
        return []
    errors = []
    for i, g in enumerate(c.kv_cache_groups):
        needs = GROUP_PARAMETER[g.type]
        for param in PARAMETER_OWNER:
            given = getattr(g, param) is not None
            if param == needs and not given:
                errors.append(f"config.kv_cache_groups[{i}].{param}: required for type {g.type}")
            elif param != needs and given:
                errors.append(f"config.kv_cache_groups[{i}].{param}: only for type "
                              f"{PARAMETER_OWNER[param]}")
    if errors or not c.enable_prefix_caching:
        return errors
    types = [g.type for g in c.kv_cache_groups]
    if "mamba" in types:
        errors.append("config.enable_prefix_caching: must be false with a mamba group "
                      "(vLLM 0.11.0 turns prefix caching off for models with Mamba layers)")
    elif "chunked_local" in types and c.uses_eagle:
        errors.append("config.speculative_method: eagle cannot be used with a chunked_local group "
                      "while prefix caching is on (vLLM 0.11.0 asserts it)")
    elif len(types) > 1:
        full = [i for i, t in enumerate(types) if t == "full"]
        others = [g for g in c.kv_cache_groups if g.type != "full"]
        if not full or not others:
            errors.append("config.kv_cache_groups: with prefix caching on, several groups must be "
                          "full attention plus one other type (vLLM 0.11.0's hybrid coordinator)")
        elif len(set(others)) > 1:
            errors.append("config.kv_cache_groups: with prefix caching on, the groups that are not "
                          "full attention must all have the same type and parameter "
                          "(vLLM 0.11.0's hybrid coordinator)")
        elif full != list(range(len(full))) and full != list(range(len(types) - len(full), len(types))):
            errors.append("config.kv_cache_groups: with prefix caching on, the full-attention groups "
                          "must all come before or all after the others "
                          "(vLLM 0.11.0's hybrid coordinator)")
    return errors


def _request_errors(s: Stream) -> list[str]:
    c = s.config
    errors = []
    seen: set[str] = set()
    total = 0
    for i, r in enumerate(s.requests):
        where = f"requests[{i}] ({r.id})"
        total += len(r.prompt) + len(r.output) + sum(len(d) for d in r.drafts)
        if r.id in seen:
            errors.append(f"{where}.id: duplicate request id")
        seen.add(r.id)
        if r.abort_step is not None and r.abort_step <= r.arrival_step:
            errors.append(f"{where}.abort_step: must be > arrival_step")
        if r.pooling:
            errors += _pooling_errors(r, where)
        elif not r.output:
            errors.append(f"{where}.output: must hold at least 1 token(s)")
        if len(r.prompt) >= c.max_model_len:
            errors.append(f"{where}.prompt: length {len(r.prompt)} must be < max_model_len "
                          f"({c.max_model_len})")
        elif not r.pooling:
            needed = r.stop_index(c.max_model_len) + 1
            if len(r.output) < needed:
                errors.append(f"{where}.output: script has {len(r.output)} token(s) but the request "
                              "can only stop after "
                              f"{needed} (max_tokens, max_model_len, EOS or stop token)")
        if r.drafts and not s.speculative:
            errors.append(f"{where}.drafts: needs config.num_speculative_tokens > 0")
        for j, d in enumerate(r.drafts):
            if s.speculative and len(d) > c.num_speculative_tokens:
                errors.append(f"{where}.drafts[{j}]: at most num_speculative_tokens "
                              f"({c.num_speculative_tokens}) tokens")
        if r.lora is not None and c.max_loras is None:
            errors.append(f"{where}.lora: needs config.max_loras (vLLM refuses LoRA requests "
                          "when LoRA is not enabled)")
        errors += _structured_output_errors(r, where, c)
        errors += _kv_transfer_errors(r, where, c)
        errors += _mm_input_errors(r, where, c)
    pooling = [r for r in s.requests if r.pooling]
    if pooling and len(pooling) < len(s.requests):
        first = next(i for i, r in enumerate(s.requests) if r.pooling != s.requests[0].pooling)
        errors.append(f"requests[{first}] ({s.requests[first].id}).pooling: every request of a "
                      "stream must pool or none (vLLM's model runner either pools or generates)")
    if pooling and s.speculative:
        errors.append("config.num_speculative_tokens: must be 0 for pooling requests "
                      "(a pooling model drafts nothing)")
    if total > MAX_TOTAL_TOKENS:
        errors.append(f"requests: {total:,} tokens in all (prompts, outputs, drafts); "
                      f"at most {MAX_TOTAL_TOKENS:,}")
    return errors


#: A pooling request has no sampling parameters: these fields must keep their defaults.
SAMPLING_FIELDS = {"max_tokens": None, "eos_token_id": None, "stop_token_ids": (),
                   "ignore_eos": False, "prompt_logprobs": None, "drafts": (),
                   "structured_output": None}


def _pooling_errors(r: RequestSpec, where: str) -> list[str]:
    errors = [f"{where}.output: must be empty for a pooling request (a pooling model "
              "samples no token)"] if r.output else []
    errors += [f"{where}.{name}: a pooling request has no sampling parameters"
               for name, default in SAMPLING_FIELDS.items() if getattr(r, name) != default]
    return errors


def _kv_transfer_errors(r: RequestSpec, where: str, c: Config) -> list[str]:
    t = r.kv_transfer
    if t is None:
        return []
    if c.kv_role is None:
        return [f"{where}.kv_transfer: needs config.kv_role (a KV connector)"]
    errors = []
    if t.external_tokens > len(r.prompt):
        errors.append(f"{where}.kv_transfer.external_tokens: must be <= the prompt's length "
                      f"({len(r.prompt)})")
    if c.kv_role == "kv_producer" and (t.external_tokens or t.load_async):
        errors.append(f"{where}.kv_transfer.external_tokens: a kv_producer loads nothing "
                      "(use kv_consumer or kv_both)")
    if c.kv_role == "kv_consumer" and t.send_steps is not None:
        errors.append(f"{where}.kv_transfer.send_steps: a kv_consumer sends nothing "
                      "(use kv_producer or kv_both)")
    return errors


def _structured_output_errors(r: RequestSpec, where: str, c: Config) -> list[str]:
    so = r.structured_output
    if so is None:
        return []
    errors = []
    if so.ready_step < r.arrival_step:
        errors.append(f"{where}.structured_output.ready_step: must be >= arrival_step "
                      "(a grammar compiles after its request arrives)")
    rejected = set(so.rejected_tokens)
    spoken = r.output[:r.stop_index(c.max_model_len) + 1] if len(r.prompt) < c.max_model_len else ()
    bad = sorted({t for t in spoken if t in rejected})
    if bad:
        errors.append(f"{where}.output: holds token(s) {bad} that structured_output rejects "
                      "(the grammar's bitmask keeps the model from sampling them)")
    return errors


def _mm_input_errors(r: RequestSpec, where: str, c: Config) -> list[str]:
    """Placeholders in the prompt, in order, apart; an encoder that can take each whole."""
    if not r.mm_inputs:
        return []
    errors = []
    if not c.has_encoder:
        return [f"{where}.mm_inputs: needs a model with an encoder (config.max_tokens_per_mm_item, "
                "encoder_compute_budget or encoder_cache_size)"]
    end = 0
    for j, m in enumerate(r.mm_inputs):
        at = f"{where}.mm_inputs[{j}]"
        if m.offset < end:
            errors.append(f"{at}.offset: placeholders must be in prompt order and must not "
                          "overlap (vLLM sorts them by offset)")
        if m.end > len(r.prompt):
            errors.append(f"{at}: the placeholder must lie inside the prompt "
                          f"(offset + length <= {len(r.prompt)})")
        if c.max_tokens_per_mm_item is not None and m.length > c.max_tokens_per_mm_item:
            errors.append(f"{at}.length: must be <= config.max_tokens_per_mm_item "
                          f"({c.max_tokens_per_mm_item}, the model's largest item)")
        elif c.disable_chunked_mm_input and m.length > c.max_num_batched_tokens:
            errors.append(f"{at}.length: must be <= max_num_batched_tokens when "
                          "disable_chunked_mm_input is true (vLLM refuses it at start-up)")
        end = max(end, m.end)
    return errors
