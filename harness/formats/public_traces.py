"""Real traffic: public request traces cut into streams, and what a stream asks of the KV cache.

``python -m harness import FORMAT TRACE -o DIR`` (:func:`import_trace`) reads a
request trace (Mooncake's FAST'25 JSONL, Azure's LLM inference CSV, BurstGPT's
CSV, or this project's generic JSONL), cuts it into windows of consecutive
requests and writes each window, under one or more engine configs, as a
stream.  (``python -m harness workload DIR``, which reports what such streams ask of the
KV cache, is :mod:`harness.jobs.workload_report`.)

What an imported stream keeps of its trace (docs/workloads.md):

* the requests and their order (index in the window = ``arrival_time``);
* arrival spacing: ``arrival_step = round((t - t_first) / ms_per_step)``;
* prefix sharing, exactly: page ``i`` of a prompt holds the tokens of the
  request's ``i``-th hash id (a trace block of ``trace_block`` tokens is one
  page of ``block_size`` tokens), so two requests share a page's tokens
  exactly when they share the hash id and every one before it; tokens past
  the hash ids, and every output token, are the request's own;
* ratios of lengths: prompt and output lengths are both multiplied by one
  scale (``block_size / trace_block`` by default) and rounded half up.

What it changes: absolute lengths (scaled, at least one token each, clipped
to ``max_model_len``), and times (rounded to whole steps).

The reading is bounded: a trace file of at most 1 GiB, lines of at most
1 MiB, at most 10,000,000 requests; it is read twice (once to check every
line and count the requests, once to take the windows), so memory holds
only the windows.  Every error is one line naming the option or the line
and field, raised as :class:`WorkloadError` before anything is written."""

from __future__ import annotations

import csv
import datetime
import decimal
import json
import math
import random
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from harness.formats.paths import MODELS_DIR
from harness.formats.stream import (
    MAX_TOTAL_TOKENS,
    Config,
    KVCacheGroup,
    Stream,
    StreamError,
    max_pages_per_request,
    parse_stream,
    safe_name,
)

FORMATS = ("mooncake", "azure", "burstgpt", "jsonl")


#: Tokens per hash id in Mooncake's traces (their README: "The block size is 512 tokens").
TRACE_BLOCK = 512


MAX_TRACE_BYTES = 1 << 30


MAX_LINE_BYTES = 1 << 20


MAX_RECORDS = 10_000_000


#: A trace's lengths and times: beyond these a value is refused as absurd.
MAX_TRACE_TOKENS = 1 << 40


MAX_TRACE_MS = 10 ** 13  # about 317 years


# Bounds of the stream format (harness/formats/schemas/stream.schema.json).
MAX_REQUESTS = 4096


MAX_ARRIVAL_STEP = 100_000


MAX_STEPS = 100_000


MAX_POOL = 1_048_576


#: Streams one import may write (windows times configs).
MAX_STREAMS = 1000


#: Config fields the import sets itself (everything else keeps the stream format's default).
DERIVED = ("max_model_len", "num_gpu_blocks", "max_steps")


class WorkloadError(ValueError):
    """Bad trace or options: one line, ``<where>: <rule>``."""


@dataclass(frozen=True)
class TraceRequest:
    """One request of a trace, in the trace's units (tokens, milliseconds)."""

    index: int  # 0-based among the trace's requests
    line: int  # 1-based line of the file
    arrival_ms: Fraction
    prompt_tokens: int
    output_tokens: int
    hash_ids: tuple | None = None  # one id per trace block of the prompt
    prefix_group: str | None = None  # jsonl: requests of one group share a prefix
    prefix_tokens: int | None = None  # jsonl: how much of the prompt is the group's


def _count(value: Any, where: str) -> int:
    """A token count: an integer >= 0 (JSON integer, or digits in a CSV cell)."""
    if isinstance(value, str):
        text = value.strip()
        if not text.isdigit() or not text.isascii():
            raise WorkloadError(f"{where}: must be an integer >= 0, got {value[:40]!r}")
        value = int(text)
    if isinstance(value, bool) or not isinstance(value, int):
        raise WorkloadError(f"{where}: must be an integer >= 0")
    if value < 0:
        raise WorkloadError(f"{where}: must be an integer >= 0")
    if value > MAX_TRACE_TOKENS:
        raise WorkloadError(f"{where}: {value} tokens is absurd (at most 2**40)")
    return value


def _time(value: Any, where: str, unit_ms: int) -> Fraction:
    """A time >= 0 in ``unit_ms`` milliseconds, exactly (decimal text or JSON number)."""
    if isinstance(value, bool):
        raise WorkloadError(f"{where}: must be a number >= 0")
    try:
        if isinstance(value, str):
            value = decimal.Decimal(value.strip())
        if isinstance(value, decimal.Decimal):
            # Refused before it becomes a Fraction: 1e999999999 would take forever.
            if not value.is_finite() or value.adjusted() > 15 or value.as_tuple().exponent < -30:
                raise ValueError
        elif not isinstance(value, int):
            raise TypeError
        t = Fraction(value)
    except (TypeError, ValueError, ArithmeticError):
        raise WorkloadError(f"{where}: must be a number >= 0 (at most 10**15, 30 decimals), "
                            f"got {str(value)[:40]!r}") from None
    t *= unit_ms
    if t < 0:
        raise WorkloadError(f"{where}: must be a number >= 0")
    if t > MAX_TRACE_MS:
        raise WorkloadError(f"{where}: {float(t):g} ms is absurd (at most 10**13 ms)")
    return t


def _datetime_ms(value: str, where: str) -> Fraction:
    """Azure's ``2023-11-16 18:17:03.9799600`` in milliseconds since 0001-01-01, exactly."""
    text = value.strip()
    whole, _, frac = text.partition(".")
    try:
        moment = datetime.datetime.strptime(whole, "%Y-%m-%d %H:%M:%S")
        if frac and not (frac.isdigit() and frac.isascii() and len(frac) <= 9):
            raise ValueError
    except ValueError:
        raise WorkloadError(f"{where}: not a time like 2023-11-16 18:17:03.9799600: "
                            f"{value[:40]!r}") from None
    seconds = (moment - datetime.datetime(1, 1, 1)) // datetime.timedelta(seconds=1)
    return Fraction(seconds * 1000) + Fraction(int(frac or 0), 10 ** len(frac)) * 1000


def _json_object(text: str, where: str) -> dict:
    try:
        data = json.loads(text, parse_float=decimal.Decimal,
                          parse_constant=_refuse_constant)
    except ValueError as exc:
        raise WorkloadError(f"{where}: not valid JSON: {str(exc).splitlines()[0][:80]}") from None
    except RecursionError:
        raise WorkloadError(f"{where}: not valid JSON: nested too deeply") from None
    if not isinstance(data, dict):
        raise WorkloadError(f"{where}: must be a JSON object")
    return data


def _refuse_constant(name: str):
    raise ValueError(f"{name} is not a number")


def _hash_ids(value: Any, where: str) -> tuple:
    if not isinstance(value, list):
        raise WorkloadError(f"{where}: must be a list of integers >= 0 or strings")
    for v in value:
        if isinstance(v, bool) or not isinstance(v, (int, str)) or (isinstance(v, int) and v < 0):
            raise WorkloadError(f"{where}: must be a list of integers >= 0 or strings")
    return tuple(value)


def _mooncake(data: dict, line: int, index: int) -> TraceRequest:
    """Mooncake FAST'25: ``timestamp`` (ms), ``input_length``, ``output_length``,
    ``hash_ids``; other fields are ignored."""
    where = f"line {line}"
    for key in ("timestamp", "input_length", "output_length", "hash_ids"):
        if key not in data:
            raise WorkloadError(f"{where}: {key}: missing (a Mooncake request has timestamp, "
                                "input_length, output_length, hash_ids)")
    return TraceRequest(index, line, _time(data["timestamp"], f"{where}: timestamp", 1),
                        _count(data["input_length"], f"{where}: input_length"),
                        _count(data["output_length"], f"{where}: output_length"),
                        _hash_ids(data["hash_ids"], f"{where}: hash_ids"))


#: The generic JSONL format's fields.
JSONL_FIELDS = ("arrival_ms", "timestamp", "prompt_tokens", "output_tokens", "hash_ids",
                "prefix_group", "prefix_tokens")


def _generic(data: dict, line: int, index: int) -> TraceRequest:
    """The generic JSONL format (docs/workloads.md): strict, unknown fields are errors."""
    where = f"line {line}"
    unknown = sorted(set(data) - set(JSONL_FIELDS))
    if unknown:
        raise WorkloadError(f"{where}: {unknown[0][:40]}: unknown field (allowed: "
                            f"{', '.join(JSONL_FIELDS)})")
    times = [k for k in ("arrival_ms", "timestamp") if k in data]
    if len(times) != 1:
        raise WorkloadError(f"{where}: arrival_ms: give exactly one of arrival_ms and timestamp "
                            "(milliseconds)")
    for key in ("prompt_tokens", "output_tokens"):
        if key not in data:
            raise WorkloadError(f"{where}: {key}: missing")
    hash_ids = None
    if "hash_ids" in data:
        hash_ids = _hash_ids(data["hash_ids"], f"{where}: hash_ids")
    group = data.get("prefix_group")
    if group is not None:
        if isinstance(group, bool) or not isinstance(group, (str, int)):
            raise WorkloadError(f"{where}: prefix_group: must be a string or an integer")
        if hash_ids is not None:
            raise WorkloadError(f"{where}: prefix_group: not with hash_ids (both say what is "
                                "shared)")
        group = str(group)
    prefix = data.get("prefix_tokens")
    if prefix is not None:
        if group is None:
            raise WorkloadError(f"{where}: prefix_tokens: needs prefix_group")
        prefix = _count(prefix, f"{where}: prefix_tokens")
    return TraceRequest(index, line, _time(data[times[0]], f"{where}: {times[0]}", 1),
                        _count(data["prompt_tokens"], f"{where}: prompt_tokens"),
                        _count(data["output_tokens"], f"{where}: output_tokens"),
                        hash_ids, group, prefix)


@dataclass(frozen=True)
class CsvFormat:
    time_column: str
    prompt_column: str
    output_column: str
    parse_time: Callable[[str, str], Fraction]


CSV_FORMATS = {
    # Azure LLM inference trace 2023: TIMESTAMP,ContextTokens,GeneratedTokens.
    "azure": CsvFormat("TIMESTAMP", "ContextTokens", "GeneratedTokens", _datetime_ms),
    # BurstGPT: Timestamp (s),Model,Request tokens,Response tokens,Total tokens,Log Type
    # (BurstGPT_3 adds Session ID and Elapsed time); read by column name.
    "burstgpt": CsvFormat("Timestamp", "Request tokens", "Response tokens",
                          lambda v, where: _time(v, where, 1000)),
}


def _lines(path: Path) -> Iterator[tuple[int, str]]:
    """(line number, text without its line break) of a bounded UTF-8 text file."""
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise WorkloadError(f"{path}: cannot read: {exc.strerror}") from None
    if not path.is_file():
        raise WorkloadError(f"{path}: not a file")
    if size > MAX_TRACE_BYTES:
        raise WorkloadError(f"{path}: file is larger than 1 GiB; cut it (e.g. head -n)")
    try:
        with path.open("rb") as f:
            number = 0
            while True:
                raw = f.readline(MAX_LINE_BYTES + 1)
                if not raw:
                    return
                number += 1
                if len(raw) > MAX_LINE_BYTES:
                    raise WorkloadError(f"line {number}: longer than 1 MiB")
                try:
                    text = raw.decode("utf-8")
                except UnicodeDecodeError as exc:
                    raise WorkloadError(f"line {number}: not UTF-8 text (byte {exc.start})") from None
                if number == 1:
                    text = text.removeprefix("\ufeff")
                yield number, text.rstrip("\r\n")
    except OSError as exc:
        raise WorkloadError(f"{path}: cannot read: {exc.strerror}") from None


def read_trace(path: Path, fmt: str, wanted: set[int] | None = None) -> tuple[int, list[TraceRequest]]:
    """Check every request of the trace: (their number, the requests whose index is in
    ``wanted``, in order).  Times must not go back (a trace is in arrival order)."""
    if fmt not in FORMATS:
        raise WorkloadError(f"FORMAT: {fmt!r} is not one of {', '.join(FORMATS)}")
    kept: list[TraceRequest] = []
    count = 0
    previous: TraceRequest | None = None
    try:
        for r in _records(path, fmt):
            if previous is not None and r.arrival_ms < previous.arrival_ms:
                raise WorkloadError(f"line {r.line}: time goes back (before line "
                                    f"{previous.line}'s); a trace must be in arrival order")
            previous = r
            count += 1
            if wanted is not None and r.index in wanted:
                kept.append(r)
    except WorkloadError as exc:
        if str(exc).startswith("line "):
            raise WorkloadError(f"{path}: {exc}") from None
        raise
    if count == 0:
        raise WorkloadError(f"{path.name}: holds no request")
    return count, kept


def _records(path: Path, fmt: str) -> Iterator[TraceRequest]:
    if fmt in CSV_FORMATS:
        yield from _csv_records(path, CSV_FORMATS[fmt])
        return
    parse = _mooncake if fmt == "mooncake" else _generic
    index = 0
    for line, text in _lines(path):
        if not text.strip():
            continue
        if index >= MAX_RECORDS:
            raise WorkloadError(f"line {line}: more than {MAX_RECORDS:,} requests; cut the trace")
        yield parse(_json_object(text, f"line {line}"), line, index)
        index += 1


def _csv_records(path: Path, fmt: CsvFormat) -> Iterator[TraceRequest]:
    numbered = _lines(path)
    line_of: list[int] = [0]

    def texts():
        for number, text in numbered:
            line_of[0] = number
            yield text

    reader = csv.reader(texts())
    try:
        header = [h.strip() for h in next(reader)]
    except StopIteration:
        raise WorkloadError(f"{path.name}: empty file (a CSV with a header line)") from None
    except csv.Error as exc:
        raise WorkloadError(f"line 1: not CSV: {exc}") from None
    columns = {}
    for name in (fmt.time_column, fmt.prompt_column, fmt.output_column):
        if name not in header:
            raise WorkloadError(f"line 1: {name}: missing column (the header has "
                                f"{', '.join(h[:30] for h in header[:8])})")
        columns[name] = header.index(name)
    width = max(columns.values()) + 1
    index = 0
    while True:
        try:
            row = next(reader)
        except StopIteration:
            return
        except csv.Error as exc:
            raise WorkloadError(f"line {line_of[0]}: not CSV: {exc}") from None
        line = line_of[0]
        if not any(cell.strip() for cell in row):
            continue
        if len(row) < width:
            raise WorkloadError(f"line {line}: {len(row)} columns, the header has {len(header)}")
        if index >= MAX_RECORDS:
            raise WorkloadError(f"line {line}: more than {MAX_RECORDS:,} requests; cut the trace")
        where = f"line {line}"
        yield TraceRequest(
            index, line,
            fmt.parse_time(row[columns[fmt.time_column]], f"{where}: {fmt.time_column}"),
            _count(row[columns[fmt.prompt_column]], f"{where}: {fmt.prompt_column}"),
            _count(row[columns[fmt.output_column]], f"{where}: {fmt.output_column}"))
        index += 1


@dataclass(frozen=True)
class ImportOptions:
    """What ``python -m harness import`` was asked (the CLI's arguments)."""

    window: int = 32
    windows: int = 1
    seed: int = 0
    ms_per_step: Fraction = Fraction(100)
    scale: Fraction | None = None  # None: block_size / trace_block
    trace_block: int = TRACE_BLOCK
    configs: int | None = None  # None: one config from the options; N: N drawn configs
    draft_acceptance: Fraction | None = None  # None: 1, or drawn
    config: dict[str, Any] = field(default_factory=dict)  # fields fixed by the user


def parse_fraction(text: str) -> Fraction:
    """``0.25``, ``1/32`` or ``100``, exactly."""
    try:
        value = Fraction(text.strip())
    except (ValueError, ZeroDivisionError):
        raise ValueError(f"{text!r} is not a number (like 0.25 or 1/32)") from None
    return value


def window_starts(total: int, options: ImportOptions) -> list[int]:
    """The first request of each window: distinct, sorted, drawn from the seed."""
    if options.window > total:
        raise WorkloadError(f"--window: {options.window} requests, but the trace holds {total}")
    choices = total - options.window + 1
    if options.windows > choices:
        raise WorkloadError(f"--windows: {options.windows} windows of {options.window} requests, "
                            f"but the trace has only {choices} place(s) to start one")
    rng = random.Random(f"workloads:windows:{options.seed}")
    return sorted(rng.sample(range(choices), options.windows))


def round_half_up(x: Fraction) -> int:
    return math.floor(x + Fraction(1, 2))


class Tokens:
    """Token ids of one stream, handed out in order from 1: a page's tokens on the first
    use of its key (a hash id), then the same tokens on every later use; every other
    token (prompt tails, outputs) new.  No two keys and no two requests' own tokens ever
    get the same id, so the only sharing is the trace's."""

    def __init__(self, block_size: int):
        self.block_size = block_size
        self.next = 1
        self.pages: dict[Any, tuple[int, ...]] = {}

    def fresh(self, n: int) -> tuple[int, ...]:
        out = tuple(range(self.next, self.next + n))
        self.next += n
        return out

    def page(self, key: Any) -> tuple[tuple[int, ...], bool]:
        """The page's tokens, and whether an earlier request used it already."""
        seen = key in self.pages
        if not seen:
            self.pages[key] = self.fresh(self.block_size)
        return self.pages[key], seen


@dataclass(frozen=True)
class Scaled:
    """One request in stream units."""

    record: TraceRequest
    arrival_step: int
    prompt: tuple[int, ...]
    output: tuple[int, ...]
    shared_pages: int  # prompt pages whose hash id (or group page) an earlier request used
    clipped: bool


def scale_of(records: Sequence[TraceRequest], block_size: int, options: ImportOptions) -> Fraction:
    """Stream tokens per trace token: ``--scale``, else block_size / trace_block.  With hash
    ids a trace block must be exactly one page, so no other scale is taken."""
    natural = Fraction(block_size, options.trace_block)
    if options.scale is None:
        return natural
    if options.scale != natural and any(r.hash_ids is not None for r in records):
        raise WorkloadError(f"--scale: the trace has hash ids, and each trace block of "
                            f"{options.trace_block} tokens is one page of {block_size}: the "
                            f"scale is {natural} (change --block-size or --trace-block instead)")
    return options.scale


def _page_keys(r: TraceRequest, scale: Fraction, length: int, block_size: int) -> list:
    """The key of each prompt page drawn from the trace's sharing (hash ids or a prefix
    group); the pages after these are the request's own."""
    if r.hash_ids is not None:
        return [("hash", h) for h in r.hash_ids]
    if r.prefix_group is not None:
        shared = length if r.prefix_tokens is None else min(
            length, round_half_up(r.prefix_tokens * scale))
        # Whole pages only: a partial last page of a group holds the request's own tokens.
        return [("group", r.prefix_group, i) for i in range(shared // block_size)]
    return []


def scale_window(records: Sequence[TraceRequest], block_size: int, scale: Fraction,
                 ms_per_step: Fraction, max_model_len: int) -> list[Scaled]:
    """The window's requests in stream units, tokens handed out in request order."""
    tokens = Tokens(block_size)
    t0 = records[0].arrival_ms
    out = []
    for r in records:
        step = round_half_up((r.arrival_ms - t0) / ms_per_step)
        want_prompt = max(1, round_half_up(r.prompt_tokens * scale))
        want_output = max(1, round_half_up(r.output_tokens * scale))
        length = min(want_prompt, max_model_len - 1)
        outputs = min(want_output, max_model_len - length)
        keys = _page_keys(r, scale, length, block_size)
        prompt: list[int] = []
        shared = 0
        for key in keys:
            if len(prompt) >= length:
                break
            page, seen = tokens.page(key)
            prompt += page[:length - len(prompt)]
            shared += seen
        prompt += tokens.fresh(length - len(prompt))
        out.append(Scaled(r, step, tuple(prompt), tokens.fresh(outputs), shared,
                          (length, outputs) != (want_prompt, want_output)))
    return out


def _model_limit(model: str) -> int | None:
    try:
        limit = json.loads((MODELS_DIR / model / "config.json").read_text()).get(
            "max_position_embeddings")
    except (OSError, ValueError):
        return None
    return limit if isinstance(limit, int) and limit > 0 else None


#: What ``--configs N`` draws from (each option given fixes its field instead).
DRAWS = {
    "max_num_seqs": (2, 4, 8, 16, 32),
    "max_num_batched_tokens": (32, 64, 128, 256, 512),
    "policy": ("fcfs", "priority"),
    "num_speculative_tokens": (0, 0, 1, 2, 4),
}


#: The pool, as a share of the way from the smallest valid pool to one that holds every
#: request of the window at once.
POOL_SHARES = (Fraction(0), Fraction(1, 10), Fraction(1, 4), Fraction(1, 2), Fraction(1))


ACCEPTANCES = (Fraction(1), Fraction(3, 4), Fraction(1, 2))


def pages_of(tokens: int, block_size: int) -> int:
    return -(-tokens // block_size)


def smallest_valid_pool(c: Config) -> int:
    """The fewest pages the stream format accepts for ``c`` (vLLM's start-up check)."""
    if c.kv_cache_groups is None:
        return max(2, pages_of(c.max_model_len, c.block_size))
    return max(2, sum(max_pages_per_request(g, c) for g in c.groups))


def drafts_of(output: tuple[int, ...], k: int, acceptance: Fraction,
            rng: random.Random) -> tuple[tuple[int, ...], ...]:
    """Draft lists: the next k output tokens as if every earlier list had been accepted
    whole (the first output comes from the prefill); each token is replaced by 0 (never
    an output token) with probability 1 - acceptance."""
    lists = []
    for start in range(1, len(output), k + 1):
        chunk = list(output[start:start + k])
        if acceptance < 1:
            chunk = [t if rng.random() < acceptance else 0 for t in chunk]
        lists.append(tuple(chunk))
    return tuple(lists)


def _configs(scaled: list[Scaled], options: ImportOptions, block_size: int,
             max_model_len: int, window_index: int) -> list[tuple[dict, Fraction]]:
    """(config fields, draft acceptance) of each stream of one window."""
    fixed = options.config
    count = options.configs or 1
    out = []
    for k in range(count):
        rng = random.Random(f"workloads:config:{options.seed}:{window_index}:{k}")
        config = {"block_size": block_size, "max_model_len": max_model_len}
        drawn = options.configs is not None
        if drawn:
            for name, choices in DRAWS.items():
                config[name] = rng.choice(choices)
        config.update(fixed)
        if drawn and "max_num_batched_tokens" not in fixed:
            config["max_num_batched_tokens"] = max(config["max_num_batched_tokens"],
                                                   config.get("max_num_seqs", 8))
        spec = config.get("num_speculative_tokens", 0)
        acceptance = options.draft_acceptance
        if acceptance is None:
            acceptance = rng.choice(ACCEPTANCES) if drawn and spec else Fraction(1)
        share = rng.choice(POOL_SHARES) if drawn else Fraction(1)
        if "num_gpu_blocks" not in fixed and fixed.get("kv_cache_memory_bytes") is None:
            try:
                probe = {**config, "num_gpu_blocks": 2}
                if probe.get("kv_cache_groups") is not None:
                    probe["kv_cache_groups"] = tuple(KVCacheGroup(**g)
                                                     for g in probe["kv_cache_groups"])
                least = smallest_valid_pool(Config(**probe))
            except Exception:  # the stream's own rules report the bad field
                least = 2
            least = max(least, pages_of(max_model_len + spec, block_size) + 1)
            whole = 1 + sum(pages_of(len(s.prompt) + len(s.output) + spec, block_size)
                            for s in scaled)
            whole = max(whole, least)
            config["num_gpu_blocks"] = min(MAX_POOL, least + round_half_up((whole - least) * share))
        if "max_steps" not in fixed:
            config["max_steps"] = _max_steps(scaled, config)
        out.append((config, acceptance))
    return out


def _max_steps(scaled: list[Scaled], config: dict) -> int:
    """Enough steps for the window four times over, run one request at a time (with
    chunked prefill), past its last arrival; at most the format's bound."""
    budget = config.get("max_num_batched_tokens", Config.max_num_batched_tokens)
    if not isinstance(budget, int) or budget <= 0:
        budget = Config.max_num_batched_tokens
    work = sum(pages_of(len(s.prompt), budget) + len(s.output) for s in scaled)
    return min(MAX_STEPS, scaled[-1].arrival_step + 4 * work + 64)


@dataclass(frozen=True)
class Imported:
    stream: Stream
    shared_pages: int
    prompt_pages: int
    clipped: int


def build_streams(path: Path, fmt: str, options: ImportOptions) -> list[Imported]:
    """Every stream of the import, validated; nothing is written."""
    if options.window > MAX_REQUESTS:
        raise WorkloadError(f"--window: at most {MAX_REQUESTS} requests (a stream's bound)")
    if options.windows * (options.configs or 1) > MAX_STREAMS:
        raise WorkloadError(f"--windows: {options.windows} windows times "
                            f"{options.configs or 1} configs is more than {MAX_STREAMS} streams")
    if options.ms_per_step <= 0:
        raise WorkloadError("--ms-per-step: must be > 0")
    if options.scale is not None and not 0 < options.scale <= 1024:
        raise WorkloadError("--scale: must be > 0 and at most 1024")
    if options.draft_acceptance is not None and not 0 <= options.draft_acceptance <= 1:
        raise WorkloadError("--draft-acceptance: must be between 0 and 1")
    unknown = sorted(set(options.config) - {f for f in Config.__dataclass_fields__})
    if unknown:
        raise WorkloadError(f"--config: {unknown[0][:40]}: unknown config field")
    for name in ("block_size", "max_model_len", "num_speculative_tokens", "max_num_seqs",
                 "max_num_batched_tokens", "num_gpu_blocks", "max_steps"):
        value = options.config.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or value < 0):
            raise WorkloadError(f"--config: {name}: must be an integer >= 0")
    block_size = options.config.get("block_size", Config.block_size)
    if not 0 < block_size <= 1024:
        raise WorkloadError("--block-size: must be an integer from 1 to 1024")
    if options.config.get("num_speculative_tokens", 0) > 64:
        raise WorkloadError("--num-speculative-tokens: at most 64 (a stream's bound)")

    total, _ = read_trace(path, fmt)
    starts = window_starts(total, options)
    wanted = {s + i for s in starts for i in range(options.window)}
    _, records = read_trace(path, fmt, wanted)
    by_index = {r.index: r for r in records}
    stem = safe_name(path.stem)[:100]
    model = options.config.get("model", Config.model)
    limit = _model_limit(model) if isinstance(model, str) else None
    out = []
    for w, start in enumerate(starts):
        window = [by_index[start + i] for i in range(options.window)]
        scale = scale_of(window, block_size, options)
        max_model_len = options.config.get("max_model_len")
        if max_model_len is None:
            longest = max(max(1, round_half_up(r.prompt_tokens * scale))
                          + max(1, round_half_up(r.output_tokens * scale)) for r in window)
            max_model_len = max(block_size, pages_of(longest, block_size) * block_size)
            if limit is not None:
                max_model_len = min(max_model_len, limit)
        if not isinstance(max_model_len, int) or isinstance(max_model_len, bool) \
                or max_model_len < 2:
            raise WorkloadError("--max-model-len: must be an integer >= 2")
        scaled = scale_window(window, block_size, scale, options.ms_per_step, max_model_len)
        last = scaled[-1].arrival_step
        if last > MAX_ARRIVAL_STEP:
            raise WorkloadError(
                f"--ms-per-step: the window at line {window[0].line} spans "
                f"{float(window[-1].arrival_ms - window[0].arrival_ms):,.0f} ms = {last:,} steps, "
                f"more than {MAX_ARRIVAL_STEP:,} (a stream's bound); raise --ms-per-step")
        tokens = sum(len(s.prompt) + len(s.output) for s in scaled)
        if tokens > MAX_TOTAL_TOKENS:
            raise WorkloadError(f"--window: the window at line {window[0].line} holds "
                                f"{tokens:,} tokens once scaled, more than {MAX_TOTAL_TOKENS:,} "
                                "(a stream's bound); lower --window or --scale")
        for k, (config, acceptance) in enumerate(_configs(scaled, options, block_size,
                                                          max_model_len, w)):
            spec = config.get("num_speculative_tokens", 0)
            rng = random.Random(f"workloads:drafts:{options.seed}:{w}:{k}")
            requests = []
            for s in scaled:
                r = {"id": f"r{s.record.index}", "prompt": list(s.prompt),
                     "output": list(s.output), "arrival_step": s.arrival_step}
                if isinstance(spec, int) and spec > 0:
                    r["drafts"] = [list(d) for d in drafts_of(s.output, spec, acceptance, rng)]
                requests.append(r)
            name = f"{stem}_w{start}_c{k}"
            clipped = sum(s.clipped for s in scaled)
            description = (
                f"Imported from {path.name[:200]} ({fmt}): requests {start} to "
                f"{start + options.window - 1} of {total} (lines {window[0].line}-"
                f"{window[-1].line}); config {k}"
                + (f" drawn from seed {options.seed}" if options.configs else "")
                + f". Scale {scale} stream tokens per trace token, {options.ms_per_step} ms "
                f"per step; {clipped} request(s) clipped to max_model_len"
                + (f"; drafts accepted with probability {acceptance}"
                   if isinstance(spec, int) and spec > 0 else "") + ".")
            data = {"name": name, "description": description, "config": config,
                    "requests": requests}
            try:
                stream = parse_stream(data)
            except StreamError as exc:
                raise StreamError([f"{name}: {e}" for e in exc.errors]) from None
            out.append(Imported(stream, sum(s.shared_pages for s in scaled),
                                sum(pages_of(len(s.prompt), block_size) for s in scaled),
                                clipped))
    return out


def stream_text(stream: Stream) -> str:
    """The bytes an imported stream is written as: its canonical form (sorted keys, every
    default explicit), the config and each request on one line."""
    data = stream.to_json()
    lines = ["{"]
    for key in sorted(data):
        if key == "requests":
            continue
        lines.append(f" {json.dumps(key)}: {json.dumps(data[key], sort_keys=True)},")
    requests = [f"  {json.dumps(r, sort_keys=True)}" for r in data["requests"]]
    lines.append(' "requests": [')
    lines.append(",\n".join(requests))
    lines.append(" ]")
    lines.append("}")
    return "\n".join(lines) + "\n"
