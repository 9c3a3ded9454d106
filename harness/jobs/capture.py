"""Captures: traces in which a real model chose the tokens, replayed as scripted streams.

A *capture* is a trace (docs/trace-format.md) recorded from an engine whose
model really samples -- on a GPU, vLLM's own executor and model runner with
dummy weights (``make gpu-check``, docs/gpu-check.md).  Its ``emitted`` tokens
are the model's, not the stream's script.  :func:`stream_from_capture` turns it
into a stream whose output scripts are those tokens, so the reference and the
CPU engines, driven by the scripted model, must give the capture's steps
exactly: the same token counts, pages, preemptions and hits, and the same
tokens.

On a machine without a GPU the same path runs on captures of the ``vllm-core``
engine (whose tokens are the script's): ``tests/test_capture.py``.
"""

from __future__ import annotations

from typing import Any

import json
from pathlib import Path

from harness.checks.diff import Divergence, first_divergence
from harness.engines import get_engine
from harness.checks.golden import read_trace
from harness.formats.paths import write_atomic
from harness.loop.runner import run
from harness.formats.stream import Stream, StreamError, load_stream, parse_stream


def tokens_kept(capture: dict[str, Any]) -> dict[str, list[int]]:
    """Per request, the tokens the model gave it up to the step it was seen finished:
    what it kept, plus any its stop cut from that step's tokens.  Tokens of a batch
    applied after that (async scheduling: the position scheduled past the stop) are
    not the request's."""
    kept: dict[str, list[int]] = {}
    done: set[str] = set()
    for step in capture["steps"]:
        for rid, tokens in step["emitted"].items():
            if rid not in done:
                kept.setdefault(rid, []).extend(tokens)
        done |= {rid for rid, status in step["status"].items() if status.startswith("FINISHED")}
    return kept


def stream_from_capture(capture: dict[str, Any]) -> Stream:
    """The capture's stream with each request's output script starting with the tokens
    its model gave it.  The rest of the old script stays behind them: the capture never
    sampled there (the request stopped, was aborted, or the run ended), and it keeps the
    script long enough to reach the request's stop."""
    data = capture["stream"]
    kept = tokens_kept(capture)
    requests = []
    for r in data["requests"]:
        got = kept.get(r["id"], [])
        requests.append({**r, "output": got + list(r["output"][len(got):])})
    return parse_stream({**data, "requests": requests})


def check_capture(capture: dict[str, Any], engine_names: tuple[str, ...] = ("reference",)
                  ) -> list[tuple[str, Divergence | None, str]]:
    """Each engine's trace of the capture's stream against the capture's steps:
    (engine, first divergence or None, why the engine did not run or "")."""
    stream = stream_from_capture(capture)
    out = []
    for name in engine_names:
        engine = get_engine(name)
        why = engine.refuses(stream)
        if why is not None:
            out.append((name, None, why))
            continue
        trace = run(engine, stream).to_json()
        # The capture's stream scripted other tokens: compare what the engines decided.
        theirs = {**capture, "stream": trace["stream"], "stream_sha256": trace["stream_sha256"]}
        out.append((name, first_divergence(theirs, trace), ""))
    return out


def read_capture(path: Path) -> dict[str, Any]:
    """A capture file: a trace with its stream and steps (else one StreamError line)."""
    capture = read_trace(path)
    if not (isinstance(capture, dict) and isinstance(capture.get("stream"), dict)
            and isinstance(capture.get("steps"), list) and "engine" in capture):
        raise StreamError(f"{path}: not a trace (needs engine, stream and steps; "
                          "see docs/trace-format.md)")
    try:
        stream_from_capture(capture)
    except StreamError as exc:
        raise StreamError([f"{path}: {e}" for e in exc.errors]) from None
    return capture


def capture_check(paths: list[Path], engines: tuple[str, ...],
                  streams_out: Path | None = None) -> int:
    """The ``capture-check`` command: 0 every engine gives every capture's steps, else 1.
    Every capture is read and checked before an engine runs."""
    captures = [(p, read_capture(p)) for p in paths]
    bad = 0
    for path, capture in captures:
        if streams_out is not None:
            stream = stream_from_capture(capture)
            write_atomic(streams_out / f"{path.stem}.json",
                         json.dumps(stream.to_json(), indent=1) + "\n")
        for name, d, why in check_capture(capture, engines):
            if why:
                print(f"{path.name} [{name}]: not taken: {why}")
            elif d is None:
                print(f"{path.name} [{name}]: equal ({len(capture['steps'])} steps)")
            else:
                bad += 1
                where = "the end of the run" if d.step is None else f"step {d.step}"
                print(f"{path.name} [{name}]: DIVERGENCE at {where}, field {d.field!r}: "
                      f"capture {json.dumps(d.left)[:200]}, {name} {json.dumps(d.right)[:200]}")
    print(f"{len(captures)} capture(s), {bad} divergence(s)")
    return 1 if bad else 0


def gpu_check(streams: list[Path], out: Path | None) -> int:
    """``make gpu-check``: capture the streams with a model that samples, then check the
    captures.  The GPU half (vLLM's own executor and model runner with dummy weights,
    engine ``vllm-gpu``) is not built yet; on every machine the CPU half runs: captures
    by ``vllm-core`` checked against the reference and the ``vllm`` engine."""
    from harness.engines import gpu_available
    gpu = gpu_available()
    print("GPU: " + ("found, but the vllm-gpu engine is not built yet (issue 14): running the "
                     "CPU half" if gpu else "none: running the CPU half"))
    core = get_engine("vllm-core")
    captures, skipped = [], 0
    for path in streams:
        stream = load_stream(path)
        if core.refuses(stream) is not None:
            skipped += 1
            continue
        capture = run(core, stream).to_json()
        captures.append((path, capture))
        if out is not None:
            write_atomic(out / f"{path.stem}.json", json.dumps(capture, sort_keys=True) + "\n")
    bad = sum(1 for _, capture in captures
              for _, d, why in check_capture(capture, ("reference", "vllm"))
              if d is not None and not why)
    print(f"{len(captures)} captures by vllm-core ({skipped} streams it does not take); "
          f"{bad} divergence(s) from the reference or the vllm engine")
    return 1 if bad else 0
