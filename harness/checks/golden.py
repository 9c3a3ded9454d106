"""Golden traces: vLLM's traces recorded once, replayed against the reference without vLLM.

A recorded trace is the vLLM trace plus an ``_info`` block::

    {"vllm_version", "stream_sha256", "steps_sha256", "recorder_version", "recorded_on"}

``stream_sha256`` is the sha256 of the canonical stream JSON and
``steps_sha256`` that of the canonical steps, so a trace whose stream changed
since it was recorded (stale) or whose steps were edited by hand is refused
before anything is compared.
"""

from __future__ import annotations

import datetime
import functools
import hashlib
import json
from collections import Counter
from pathlib import Path
from typing import Any

from harness.checks.diff import report
from harness.checks.levels import LEVELS, divergence, label, level_held
from harness.engines import get_engine
from harness.formats.paths import STREAMS_DIR, write_json
from harness.loop.runner import run
from harness.formats.stream import Stream, StreamError, canonical_json, load_stream, parse_stream

RECORDER_VERSION = "1"


class StaleTrace(Exception):
    """A recorded trace that no longer matches its stream, or was edited."""


def _sha(obj: Any) -> str:
    return hashlib.sha256(canonical_json(obj).encode()).hexdigest()


def recorded(trace: dict[str, Any]) -> dict[str, Any]:
    """A trace with its _info block."""
    out = dict(trace)
    out["_info"] = {
        "vllm_version": trace["vllm_version"],
        "stream_sha256": trace["stream_sha256"],
        "steps_sha256": _sha(trace["steps"]),
        "recorder_version": RECORDER_VERSION,
        "recorded_on": datetime.date.today().isoformat(),
    }
    return out


def record(streams, out_dir: Path) -> int:
    """Record vLLM's trace of each stream into ``out_dir/<name>.json``."""
    engine = get_engine("vllm")
    status = 0
    for stream in streams:
        trace = run(engine, stream).to_json()
        if trace["verdict"] == "engine_failure":
            print(f"{stream.name}: vLLM failed at step {trace['failure']['step']}: "
                  f"{trace['failure']['message']} (recorded as such)")
            status = 1
        write_json(out_dir / f"{stream.name}.json", recorded(trace))
        print(f"recorded {out_dir / (stream.name + '.json')} ({len(trace['steps'])} steps)")
    return status


def verify(trace: Any, streams_dir: Path | None = STREAMS_DIR) -> Stream:
    """Refuse a recorded trace that is stale or was edited by hand; its stream, parsed."""
    if not isinstance(trace, dict):
        raise StaleTrace("not a recorded trace: not a JSON object")
    info = trace.get("_info")
    if not isinstance(info, dict):
        raise StaleTrace("no _info block: not a recorded trace")
    missing = [k for k in ("stream", "steps", "stream_sha256") if k not in trace] + \
        [f"_info.{k}" for k in ("stream_sha256", "steps_sha256") if k not in info]
    if missing:
        raise StaleTrace(f"not a recorded trace: no {', '.join(missing)}")
    try:
        stream = parse_stream(trace["stream"])
    except StreamError as exc:
        raise StaleTrace(f"its stream is invalid: {exc}") from None
    if stream.sha256() != info["stream_sha256"] or trace["stream_sha256"] != info["stream_sha256"]:
        raise StaleTrace("its stream does not match the stream_sha256 it was recorded with")
    if _sha(trace["steps"]) != info["steps_sha256"]:
        raise StaleTrace("its steps do not match steps_sha256: edited after recording")
    if streams_dir is not None:
        source = streams_dir / f"{stream.name}.json"
        if source.exists() and _bundled_sha256(source) != info["stream_sha256"]:
            raise StaleTrace(f"{source} changed since the trace was recorded: run make record")
    return stream


def _bundled_sha256(path: Path) -> str:
    """The hash of a bundled stream, parsed once per process while the file is unchanged
    (every release's trace of it checks against it)."""
    st = path.stat()
    return _stream_sha256(path, st.st_mtime_ns, st.st_size)


@functools.lru_cache(maxsize=1024)
def _stream_sha256(path: Path, mtime_ns: int, size: int) -> str:
    return load_stream(path).sha256()


class NotTaken(Exception):
    """The engine replaying does not take this trace's stream (``Engine.refuses``)."""


def replay_one(path: Path, streams_dir: Path | None = STREAMS_DIR, engine: str = "reference",
               fields: tuple[str, ...] | None = None):
    """Run ``engine`` (the reference stating the trace's release, or another engine by
    name) on a recorded trace's stream; the first divergence on ``fields`` (None: every
    field) or None."""
    golden = read_trace(path)
    stream = verify(golden, streams_dir)
    runner = get_engine("reference", golden["vllm_version"]) if engine == "reference" \
        else get_engine(engine)
    why = runner.refuses(stream)
    if why is not None:
        raise NotTaken(why)
    mine = run(runner, stream).to_json()
    return divergence(golden, mine, fields), golden, mine


def replay_all_releases() -> tuple[int, int, list[str]]:
    """Replay the recorded traces of every release in fixtures/traces, each against the
    reference stating that release: (matching, total, one line per trace that does not)."""
    from harness.formats.paths import TRACES_DIR
    ok, total, bad = 0, 0, []
    for path in sorted(TRACES_DIR.glob("vllm-*/*.json")):
        total += 1
        try:
            d, _, _ = replay_one(path)
        except StaleTrace as exc:
            bad.append(f"{path.parent.name}/{path.name}: STALE: {exc}")
            continue
        if d is None:
            ok += 1
        else:
            bad.append(f"{path.parent.name}/{path.name}: step {d.step}, {d.field} differs")
    return ok, total, bad


def recorded_verdicts(verdict: str, vllm_version: str = "0.11.0") -> set[str]:
    """The bundled streams whose recorded trace on that vLLM release ends with ``verdict``."""
    from harness.formats.paths import golden_dir
    return {p.stem for p in golden_dir(vllm_version).glob("*.json")
            if json.loads(p.read_text()).get("verdict") == verdict}


def recorded_crashes(vllm_version: str = "0.11.0") -> set[str]:
    """The bundled streams on which that vLLM release fails (its recorded trace says
    ``engine_failure``): a vLLM crash is recorded, and the reference reproduces it."""
    return recorded_verdicts("engine_failure", vllm_version)


def read_trace(path: Path) -> Any:
    """A recorded trace file's JSON; unreadable or invalid JSON is a StreamError (bad input)."""
    try:
        return json.loads(path.read_bytes().decode("utf-8"))
    except OSError as exc:
        raise StreamError(f"{path}: cannot read: {exc.strerror}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise StreamError(f"{path}: not valid JSON: {getattr(exc, 'msg', 'not UTF-8 text')}") from None


def replay(folder: Path, verbose: bool = False, engine: str = "reference",
           fields: tuple[str, ...] | None = None) -> int:
    """Replay every recorded trace of ``folder`` on ``engine``: 0 all it takes match on
    ``fields`` (None: every field), 1 some do not.  For an engine of one's own the summary
    also grades every trace: the highest fidelity level it holds (harness.checks.levels).

    Files that are not JSON are bad input (StreamError, one line each) and
    stop the replay before anything runs.
    """
    paths = sorted(folder.glob("*.json"))
    if not paths:
        raise StreamError(f"{folder}: no recorded traces (*.json)")
    errors = []
    for path in paths:
        try:
            read_trace(path)
        except StreamError as exc:
            errors += exc.errors
    if errors:
        raise StreamError(errors)
    bad = not_taken = 0
    graded: Counter = Counter()
    for path in paths:
        try:
            d, golden, mine = replay_one(path, engine=engine, fields=fields)
        except StaleTrace as exc:
            print(f"{path.name}: STALE: {exc}")
            bad += 1
            continue
        except NotTaken as exc:
            if verbose:
                print(f"{path.name}: not taken: {exc}")
            not_taken += 1
            continue
        if engine != "reference":  # only an engine of one's own is graded
            graded[level_held(golden, mine)[0]] += 1
        if d is not None:
            print(f"{path.name}: {report(golden, mine, d)}")
            failed = mine.get("verdict") == "engine_failure"
            if failed and mine.get("failure") != golden.get("failure"):
                # The engine's own error and site (file:line): a crash is the engine's
                # defect before it is a divergence.
                print(f"  {engine} failed at step {mine['failure']['step']}: "
                      f"{mine['failure']['message']}")
            bad += 1
        elif verbose:
            on = "" if fields is None else f" ({label(fields)})"
            print(f"{path.name}: {engine} matches vLLM {golden['vllm_version']}{on}")
    if engine != "reference":
        print("highest level held: " + (", ".join(
            f"{level or 'none'} {graded[level]}" for level in (*reversed(LEVELS), None)
            if graded[level]) or "-"))
    print(f"{len(paths) - bad - not_taken} match, {bad} do not"
          + (f", {not_taken} not taken by {engine}" if not_taken else "")
          + ("" if fields is None else f"; compared: {label(fields)}"))
    return 0 if bad == 0 else 1
