"""Request streams: the input format, its defaults and its validation.

A stream is plain JSON: ``{"config": {...}, "requests": [...]}`` plus optional
``name``, ``description`` and ``reset_prefix_cache_steps``.  The format is
documented in ``docs/stream-format.md`` and has a JSON Schema in
``docs/stream.schema.json``.

Every rule that a stream breaks is reported as a :class:`StreamError` whose
message names the field and the rule, in one line; the CLI turns it into exit
code 2.  Validation happens before any engine runs, so nothing is written
half-way.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from harness.paths import MODELS_DIR
from reference.arith import cdiv


class StreamError(ValueError):
    """A stream or config that breaks a rule; the message is one line."""

    def __init__(self, message: str):
        super().__init__(_one_line(str(message)))


def _one_line(text: str) -> str:
    """Escape line breaks and other control characters (e.g. inside an id)."""
    return "".join(ch if ch.isprintable() else ch.encode("unicode_escape").decode("ascii")
                   for ch in text)


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
    model: str = "qwen2.5-0.5b"
    max_steps: int = 1000


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
            "config": asdict(self.config),
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
        return hashlib.sha256(self.canonical_bytes()).hexdigest()

    @property
    def speculative(self) -> bool:
        return self.config.num_speculative_tokens > 0


def canonical_json(obj: Any) -> str:
    """Deterministic compact JSON: sorted keys, no spaces."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"))


def _request_json(r: RequestSpec) -> dict[str, Any]:
    d = asdict(r)
    d["prompt"] = list(r.prompt)
    d["output"] = list(r.output)
    d["stop_token_ids"] = list(r.stop_token_ids)
    d["drafts"] = [list(x) for x in r.drafts]
    return d


# ---------------------------------------------------------------------------
# Parsing and validation
# ---------------------------------------------------------------------------

_TOP_FIELDS = {"config", "requests", "name", "description", "reset_prefix_cache_steps"}
_CONFIG_TYPES = {f.name: f.type for f in fields(Config)}
_REQUEST_REQUIRED = ("id", "prompt", "output")
_REQUEST_FIELDS = {f.name for f in fields(RequestSpec)}


def load_stream(path: str | Path) -> Stream:
    """Read and validate a stream file; raises StreamError with one line."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise StreamError(f"{path}: cannot read: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise StreamError(f"{path}: not valid JSON: not UTF-8 text (byte {exc.start})") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise StreamError(f"{path}: not valid JSON: {exc.msg} at line {exc.lineno}") from None
    except RecursionError:
        raise StreamError(f"{path}: not valid JSON: nested too deeply") from None
    try:
        return parse_stream(data, default_name=path.stem)
    except StreamError as exc:
        raise StreamError(f"{path}: {exc}") from None


def parse_stream(data: Any, default_name: str = "") -> Stream:
    """Build a validated Stream from JSON data."""
    if not isinstance(data, dict):
        raise StreamError("stream: must be a JSON object")
    for key in data:
        if key not in _TOP_FIELDS:
            raise StreamError(f"{key}: unknown field (allowed: {', '.join(sorted(_TOP_FIELDS))})")
    config = _parse_config(data.get("config", {}))
    if "requests" not in data:
        raise StreamError("requests: required field is missing")
    raw_requests = data["requests"]
    if not isinstance(raw_requests, list):
        raise StreamError("requests: must be a list")
    if not raw_requests:
        raise StreamError("requests: must hold at least one request")
    requests = tuple(_parse_request(i, r) for i, r in enumerate(raw_requests))
    name = _expect_str(data, "name", "name", default=default_name)
    description = _expect_str(data, "description", "description", default="")
    resets = data.get("reset_prefix_cache_steps", [])
    if not isinstance(resets, list) or not all(_is_int(s) and s >= 0 for s in resets):
        raise StreamError("reset_prefix_cache_steps: must be a list of integers >= 0")
    stream = Stream(config, requests, name or "", description or "", tuple(sorted(set(resets))))
    _check_stream(stream)
    return stream


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _expect_str(d: dict, key: str, where: str, default: Any) -> Any:
    v = d.get(key, default)
    if not isinstance(v, str):
        raise StreamError(f"{where}: must be a string")
    return v


def _parse_config(raw: Any) -> Config:
    if not isinstance(raw, dict):
        raise StreamError("config: must be a JSON object")
    for key, value in raw.items():
        if key not in _CONFIG_TYPES:
            raise StreamError(f"config.{key}: unknown field")
        want = _CONFIG_TYPES[key]
        if want == "int" and not _is_int(value):
            raise StreamError(f"config.{key}: must be an integer")
        if want == "bool" and not isinstance(value, bool):
            raise StreamError(f"config.{key}: must be true or false")
        if want == "str" and not isinstance(value, str):
            raise StreamError(f"config.{key}: must be a string")
    c = Config(**raw)
    _check_config(c)
    return c


def _check_config(c: Config) -> None:
    for key in ("block_size", "num_gpu_blocks", "max_num_batched_tokens", "max_num_seqs",
                "max_model_len", "max_steps"):
        if getattr(c, key) <= 0:
            raise StreamError(f"config.{key}: must be > 0")
    for key in ("long_prefill_token_threshold", "num_speculative_tokens"):
        if getattr(c, key) < 0:
            raise StreamError(f"config.{key}: must be >= 0")
    if c.num_gpu_blocks < 2:
        raise StreamError("config.num_gpu_blocks: must be >= 2 (block 0 is the null block)")
    if c.policy not in ("fcfs", "priority"):
        raise StreamError('config.policy: must be "fcfs" or "priority"')
    if c.speculative_method not in ("ngram", "eagle"):
        raise StreamError('config.speculative_method: must be "ngram" or "eagle"')
    if (not c.model or "/" in c.model or "\\" in c.model or c.model.startswith(".")
            or not (MODELS_DIR / c.model / "config.json").is_file()):
        raise StreamError(f"config.model: no model config at fixtures/models/{c.model}/config.json")
    # The rules below are the ones vLLM 0.11.0 itself enforces at start-up.
    limit = json.loads((MODELS_DIR / c.model / "config.json").read_text()).get("max_position_embeddings")
    if isinstance(limit, int) and c.max_model_len > limit:
        raise StreamError(f"config.max_model_len: must be <= the model's max_position_embeddings ({limit})")
    if c.max_num_batched_tokens < c.max_num_seqs:
        raise StreamError("config.max_num_batched_tokens: must be >= max_num_seqs (vLLM SchedulerConfig)")
    if not c.enable_chunked_prefill and c.max_num_batched_tokens < c.max_model_len:
        raise StreamError("config.max_num_batched_tokens: must be >= max_model_len when "
                          "enable_chunked_prefill is false (vLLM SchedulerConfig)")
    needed = cdiv(c.max_model_len, c.block_size)
    if c.num_gpu_blocks < needed:
        raise StreamError(f"config.num_gpu_blocks: must be >= ceil(max_model_len / block_size) = {needed}, "
                          "enough KV cache for one max_model_len request (vLLM start-up check)")


def _int_list(value: Any, where: str, min_len: int = 0) -> tuple[int, ...]:
    if not isinstance(value, list) or not all(_is_int(t) for t in value):
        raise StreamError(f"{where}: must be a list of integers")
    if any(t < 0 for t in value):
        raise StreamError(f"{where}: token ids must be >= 0")
    if len(value) < min_len:
        raise StreamError(f"{where}: must hold at least {min_len} token(s)")
    return tuple(value)


def _parse_request(index: int, raw: Any) -> RequestSpec:
    where = f"requests[{index}]"
    if not isinstance(raw, dict):
        raise StreamError(f"{where}: must be a JSON object")
    for key in raw:
        if key not in _REQUEST_FIELDS:
            raise StreamError(f"{where}.{key}: unknown field")
    for key in _REQUEST_REQUIRED:
        if key not in raw:
            raise StreamError(f"{where}.{key}: required field is missing")
    if not isinstance(raw["id"], str) or not raw["id"]:
        raise StreamError(f"{where}.id: must be a non-empty string")
    where = f"requests[{index}] ({raw['id']})"
    kw: dict[str, Any] = {
        "id": raw["id"],
        "prompt": _int_list(raw["prompt"], f"{where}.prompt", min_len=1),
        "output": _int_list(raw["output"], f"{where}.output", min_len=1),
    }
    for key in ("arrival_step", "priority"):
        if key in raw:
            if not _is_int(raw[key]):
                raise StreamError(f"{where}.{key}: must be an integer")
            kw[key] = raw[key]
    if kw.get("arrival_step", 0) < 0:
        raise StreamError(f"{where}.arrival_step: must be >= 0")
    for key in ("max_tokens", "eos_token_id", "abort_step", "prompt_logprobs"):
        if raw.get(key) is not None:
            if not _is_int(raw[key]):
                raise StreamError(f"{where}.{key}: must be an integer or null")
            kw[key] = raw[key]
    if kw.get("max_tokens") is not None and kw["max_tokens"] <= 0:
        raise StreamError(f"{where}.max_tokens: must be > 0")
    if kw.get("eos_token_id") is not None and kw["eos_token_id"] < 0:
        raise StreamError(f"{where}.eos_token_id: must be >= 0")
    if kw.get("prompt_logprobs") is not None and kw["prompt_logprobs"] < 0:
        raise StreamError(f"{where}.prompt_logprobs: must be >= 0")
    if kw.get("abort_step") is not None and kw["abort_step"] <= kw.get("arrival_step", 0):
        raise StreamError(f"{where}.abort_step: must be > arrival_step")
    if "stop_token_ids" in raw:
        kw["stop_token_ids"] = _int_list(raw["stop_token_ids"], f"{where}.stop_token_ids")
    if "ignore_eos" in raw:
        if not isinstance(raw["ignore_eos"], bool):
            raise StreamError(f"{where}.ignore_eos: must be true or false")
        kw["ignore_eos"] = raw["ignore_eos"]
    if raw.get("cache_salt") is not None:
        if not isinstance(raw["cache_salt"], str):
            raise StreamError(f"{where}.cache_salt: must be a string or null")
        kw["cache_salt"] = raw["cache_salt"]
    if "drafts" in raw:
        if not isinstance(raw["drafts"], list):
            raise StreamError(f"{where}.drafts: must be a list of token lists")
        kw["drafts"] = tuple(_int_list(d, f"{where}.drafts[{j}]") for j, d in enumerate(raw["drafts"]))
    return RequestSpec(**kw)


def _check_stream(s: Stream) -> None:
    c = s.config
    seen: set[str] = set()
    for i, r in enumerate(s.requests):
        where = f"requests[{i}] ({r.id})"
        if r.id in seen:
            raise StreamError(f"{where}.id: duplicate request id")
        seen.add(r.id)
        if len(r.prompt) >= c.max_model_len:
            raise StreamError(f"{where}.prompt: length {len(r.prompt)} must be < max_model_len "
                              f"({c.max_model_len})")
        needed = r.stop_index(c.max_model_len) + 1
        if len(r.output) < needed:
            raise StreamError(f"{where}.output: script has {len(r.output)} token(s) but the request "
                              f"can only stop after {needed} (max_tokens, max_model_len, EOS or stop token)")
        if r.drafts and not s.speculative:
            raise StreamError(f"{where}.drafts: needs config.num_speculative_tokens > 0")
        for j, d in enumerate(r.drafts):
            if len(d) > c.num_speculative_tokens:
                raise StreamError(f"{where}.drafts[{j}]: at most num_speculative_tokens "
                                  f"({c.num_speculative_tokens}) tokens")
