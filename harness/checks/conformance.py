"""Comparing the reference with the installed vLLM, one stream at a time.

``assert_conforms(data)`` is what the property tests call for each generated
stream: it runs both engines and, on a divergence, writes the stream to
``counterexamples/<label>.json`` (overwritten on every failing call, so after
hypothesis has shrunk it holds the smallest stream) and raises with a report
and the command that replays it.  ``check_one`` is the same comparison for the
``check`` command: it keeps the stream under a unique name and returns the
report instead of raising.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from harness.formats import counterexamples, features
from harness.checks.diff import Divergence, report
from harness.checks.levels import describe, divergence, label, level_held
from harness.engines import get_engine
from harness.loop.runner import run
from harness.formats.rule_counters import Stats, aim_at
from harness.formats.stream import Stream, parse_stream
from harness.formats.trace import ENGINE_FAILURE


class Divergent(AssertionError):
    """The reference and vLLM disagree on a stream."""


@dataclass
class Comparison:
    """Both engines' traces of one stream and their first divergence, if any."""

    stream: Stream
    divergence: Divergence | None
    vllm: dict[str, Any]
    reference: dict[str, Any]

    @property
    def failures(self) -> list[dict[str, Any]]:
        """The traces whose engine failed (raised) on the stream, unless the reference
        reproduces vLLM's failure."""
        if self.crash_reproduced:
            return []
        return [t for t in (self.vllm, self.reference) if t["verdict"] == ENGINE_FAILURE]

    @property
    def crash_reproduced(self) -> bool:
        """vLLM raised, and the reference raised the same exception at the same step
        after the same steps: a vLLM crash the reference reproduces (reference.quirks
        names each one it knows)."""
        a, b = self.vllm, self.reference
        return (self.divergence is None
                and a["verdict"] == b["verdict"] == ENGINE_FAILURE
                and exception_name(a) == exception_name(b))

    @property
    def equal(self) -> bool:
        return self.divergence is None and not self.failures

    def failure_lines(self) -> list[str]:
        return [f"ENGINE FAILURE ({t['engine']}) at step {t['failure']['step']}: "
                f"{t['failure']['message']}" for t in self.failures]


def exception_name(trace: dict[str, Any]) -> str:
    """The exception an engine failed with (its failure message starts with the name)."""
    return trace["failure"]["message"].split(":", 1)[0]


#: The fields the conformance properties compare (None: every field); ``pytest --level``
#: sets it for an engine of one's own (harness.checks.levels).
COMPARED: tuple[str, ...] | None = None


def compare(stream: Stream, reference=None, vllm=None,
            fields: tuple[str, ...] | None = None) -> Comparison:
    """Run ``stream`` through both engines (the process's own unless given), compared on
    ``fields`` (default :data:`COMPARED`: every field)."""
    left = run(vllm or get_engine("vllm"), stream)
    right = run(reference or get_engine("reference"), stream)
    shared = stream.to_json()  # the two traces' stream, made once
    left, right = left.to_json(shared), right.to_json(shared)
    return Comparison(stream, divergence(left, right, fields or COMPARED), left, right)


def assert_conforms(data: dict[str, Any] | Stream, label: str = "counterexample", reference=None,
                    vllm=None, stats: Stats | None = None, replay_env: str = "",
                    folder: Path | None = None, aim: bool = False) -> None:
    """Raise Divergent (with a report and a replay command) if the engines disagree.

    ``replay_env`` (e.g. ``HARNESS_MUTANT=x``) is what the replay command needs set;
    the stream is kept in ``folder`` (default: the counterexamples folder).  With
    ``aim``, the stream's rule counters become hypothesis targets (:func:`harness.formats.rule_counters.aim_at`).
    ``data`` is the stream as JSON, or already parsed.
    """
    stream = data if isinstance(data, Stream) else parse_stream(data)
    c = compare(stream, reference, vllm)
    if stats is not None:
        stats.add(c.vllm)
    if aim and c.equal:
        aim_at(c.vllm)
    if c.equal:
        return
    path = counterexamples.save(stream, label, folder)
    text = report(c.vllm, c.reference, c.divergence) if c.divergence else "\n".join(c.failure_lines())
    message = (f"{text}\n\n{len(stream.requests)} request(s); stream written to {path}\n"
               f"replay: {replay_env + ' ' if replay_env else ''}python -m harness check {path}"
               + ("" if vllm is None or vllm.name == "vllm" else f" --engines {vllm.name}"))
    raise Divergent(message)


@dataclass
class Checked:
    """The ``check`` command's result for one stream."""

    stream: Stream
    comparison: Comparison
    saved: list[str]  # where the failing stream was kept
    text: str  # what to print

    @property
    def equal(self) -> bool:
        return self.comparison.equal

    def to_json(self) -> dict[str, Any]:
        c, d = self.comparison, self.comparison.divergence
        return {
            "stream": self.stream.name, "stream_sha256": self.stream.sha256(),
            "equal": c.equal, "steps": len(c.vllm["steps"]), "verdict": c.vllm["verdict"],
            "divergence": None if d is None else {
                "step": d.step, "field": d.field, d.left_engine: d.left, d.right_engine: d.right},
            "engine_failures": [{"engine": t["engine"], **t["failure"]} for t in c.failures],
            "saved": self.saved,
        }


def fitted(stream: Stream, engine) -> Stream:
    """``stream`` inside the features ``engine`` declares (itself when it declares none)."""
    if getattr(engine, "features", None) is None:
        return stream
    return parse_stream(features.fit_for(stream.to_json(), engine), stream.name)


def check_one(stream: Stream, quiet: bool = False, engine: str = "vllm",
              fields: tuple[str, ...] | None = None, folder: Path | None = None) -> Checked:
    """An engine (``vllm``, ``vllm-core`` or one's own) and the reference on one stream,
    compared on ``fields`` (None: every field); a failing stream is kept for replay in
    ``folder`` (default: the counterexamples folder)."""
    c = compare(stream, vllm=get_engine(engine), fields=fields)
    name = stream.name if engine == "vllm" else f"{stream.name} [{engine}]"
    lines, saved = [], []
    for t, line in zip(c.failures, c.failure_lines()):
        path = counterexamples.save(stream, counterexamples.unique_label(
            stream, f"{t['engine']}-failure"), folder)
        saved.append(str(path))
        lines.append(f"{name}: {line}\n  stream saved: {path}")
    if c.divergence is not None and engine not in ("vllm", "vllm-core"):
        held, d = level_held(c.vllm, c.reference)
        lines.append(f"{name}: graded: {describe(held, d)}")
    if c.divergence is not None:
        path = counterexamples.save(stream, counterexamples.unique_label(stream, "divergence"),
                                    folder)
        saved.append(str(path))
        lines.append(f"{name}: {report(c.vllm, c.reference, c.divergence)}\n"
                     f"  stream saved: {path}\n  replay: python -m harness check {path}")
    elif c.crash_reproduced and not quiet:
        lines.append(f"{name}: equal ({len(c.vllm['steps'])} steps, then both engines "
                     f"raise {exception_name(c.vllm)} at step {c.vllm['failure']['step']}: "
                     "a vLLM crash the reference reproduces)")
    elif c.equal and not quiet:
        on = "" if fields is None else f"; compared: {label(fields)}"
        lines.append(f"{name}: equal ({len(c.vllm['steps'])} steps, {c.vllm['verdict']}{on})")
    return Checked(stream, c, saved, "\n".join(lines))


def check_streams(streams: Sequence[Stream], quiet: bool = False, as_json: bool = False,
                  engines: Sequence[str] = ("vllm",), fields: tuple[str, ...] | None = None,
                  folder: Path | None = None, fit: bool = False) -> tuple[int, int]:
    """Check each stream with each vLLM engine, printing as it goes (a report, or a JSON
    line); (equal, checked).  A stream an engine does not take is said so and not
    counted.  With ``fit``, each stream is first fitted to the features an engine declares
    (harness.formats.features.fit), as its profile draws them."""
    import json
    ok = total = 0
    for given in streams:
        for name in engines:
            stream = fitted(given, get_engine(name)) if fit else given
            why = get_engine(name).refuses(stream)
            label = "" if name == "vllm" else f" [{name}]"
            if why is not None:
                if as_json:
                    print(json.dumps({"stream": stream.name, "engine": name, "skipped": why},
                                     sort_keys=True), flush=True)
                elif not quiet:
                    print(f"{stream.name}{label}: not taken by {name}: {why}", flush=True)
                continue
            checked = check_one(stream, quiet, name, fields, folder)
            ok += checked.equal
            total += 1
            if as_json:
                print(json.dumps({**checked.to_json(), "engine": name}, sort_keys=True),
                      flush=True)
            elif checked.text:
                print(checked.text, flush=True)
    return ok, total
