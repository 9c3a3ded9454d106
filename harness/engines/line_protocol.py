"""An engine in another process, in any language: ``--engine "cmd:<command>"``.

The harness starts ``<command>`` once (split as a shell would, run without a
shell), and drives it with the calls of the engine interface, one JSON object
per line each way: the harness writes a call to the engine's stdin, the engine
writes one answer to its stdout.  Its stderr is left alone (it reaches the
terminal).  docs/engine-interface.md describes every call with an example
session; :func:`serve` is the engine side in Python (``python -m harness serve
module:Class`` puts any Python engine behind it, which is how the protocol is
tested).

A call is ``{"call": NAME, ...arguments}``; the answer is ``{"result": VALUE}``
or ``{"error": "one line"}``.  The first call is ``hello``; the answer says
which optional calls the engine implements (``"implements"``), and streams
that need a call it lacks are not given to it (:mod:`harness.engines.plugin`).
Requests are named by id: ``start`` hands over the whole stream, so ``add``
needs only the id and the arrival index.  ``schedule`` answers a step's
decisions with an ``id``; ``update`` names the schedule it applies by that id.
"""

from __future__ import annotations

import atexit
import json
import os
import select
import shlex
import subprocess
import sys
from dataclasses import asdict, fields
from typing import IO, Any

from harness.formats.steps import RequestState, Scheduled
from harness.engines.plugin import CORE, FEATURES, Plugged
from harness.formats.stream import Stream, parse_stream

PROTOCOL = 1

def answer_timeout() -> float:
    """Seconds the harness waits for one answer before it calls the engine hung
    (``HARNESS_ENGINE_TIMEOUT``, default 60)."""
    text = os.environ.get("HARNESS_ENGINE_TIMEOUT", "60")
    try:
        seconds = float(text)
    except ValueError:
        seconds = 0.0
    if not seconds > 0:
        raise EngineProcessError(f"HARNESS_ENGINE_TIMEOUT: {text!r} is not a positive number "
                                 "of seconds")
    return seconds

#: Optional calls besides the features': an engine may answer them or leave the default.
OPTIONAL = ("refuses", "version", "has_requests", "end_step", "shutdown")


class EngineProcessError(RuntimeError):
    """The engine process answered with an error, garbage, nothing, or died."""


# -- values on the wire ------------------------------------------------------------------

def scheduled_to_json(s: Scheduled) -> dict[str, Any]:
    d = asdict(s)
    d["scheduled"] = [[rid, n] for rid, n in s.scheduled]
    return d


def scheduled_from_json(d: dict[str, Any]) -> Scheduled:
    known = {f.name for f in fields(Scheduled)}
    unknown = sorted(set(d) - known - {"id"})
    if unknown:
        raise EngineProcessError(f"schedule: unknown field(s) {', '.join(unknown)}")
    args = {k: v for k, v in d.items() if k in known}
    args["scheduled"] = [(rid, n) for rid, n in d.get("scheduled", [])]
    try:
        return Scheduled(**args)
    except TypeError as exc:
        raise EngineProcessError(f"schedule: {exc}") from None


def state_from_json(d: dict[str, Any]) -> RequestState:
    try:
        return RequestState(**d)
    except TypeError as exc:
        raise EngineProcessError(f"state: {exc}") from None


# -- the harness side ----------------------------------------------------------------------

class ProcessEngine:
    """The engine interface, each call sent to the engine process as one line."""

    def __init__(self, command: str):
        self.command = command
        self.timeout = answer_timeout()
        argv = shlex.split(command)
        if not argv:
            raise EngineProcessError("cmd: no command given")
        try:
            self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         text=True, bufsize=1)
        except OSError as exc:
            raise EngineProcessError(f"cannot start {argv[0]}: {exc.strerror}") from None
        atexit.register(self.close)
        hello = self._call("hello", protocol=PROTOCOL)
        if not isinstance(hello, dict):
            raise EngineProcessError("hello: the answer must be an object")
        self.name = str(hello.get("name") or command)
        self._version = str(hello.get("version") or "unknown")
        self.implements = set(hello.get("implements") or ())
        declared = hello.get("features")
        # The stream features it models (harness.formats.features); None: not declared.
        self.features = None if declared is None else frozenset(declared)
        self.always_on = frozenset(hello.get("always_on") or ())
        self._sent: dict[int, int] = {}  # id() of a Scheduled returned -> the engine's id

    # The protocol: one line out, one line back.
    def _call(self, call: str, **args) -> Any:
        if self.proc.poll() is not None:
            raise EngineProcessError(f"the engine process exited ({self.proc.returncode})")
        try:
            self.proc.stdin.write(json.dumps({"call": call, **args}) + "\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            raise EngineProcessError(f"{call}: the engine process closed its input") from None
        ready, _, _ = select.select([self.proc.stdout], [], [], self.timeout)
        if not ready:
            self.close()
            raise EngineProcessError(f"{call}: no answer within {self.timeout:g} s "
                                     "(HARNESS_ENGINE_TIMEOUT)")
        line = self.proc.stdout.readline()
        if not line:
            raise EngineProcessError(f"{call}: the engine process ended without answering")
        try:
            answer = json.loads(line)
        except json.JSONDecodeError:
            raise EngineProcessError(f"{call}: the answer is not JSON: {line.strip()[:120]!r}") \
                from None
        if not isinstance(answer, dict) or not ({"result", "error"} & set(answer)):
            raise EngineProcessError(f"{call}: the answer must be an object with result or error")
        if "error" in answer:
            raise EngineProcessError(f"{call}: {answer['error']}")
        return answer["result"]

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.close()
                self.proc.wait(timeout=5)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()

    # The engine interface.
    def version(self) -> str:
        return self._version

    def start(self, stream: Stream) -> None:
        self._sent.clear()
        self._call("start", stream=stream.to_json())

    def refuses(self, stream: Stream) -> str | None:
        return self._call("refuses", stream=stream.to_json())

    def add(self, req, arrival_index: int) -> None:
        self._call("add", req_id=req.id, arrival_index=arrival_index)

    def schedule(self) -> Scheduled:
        d = self._call("schedule")
        if not isinstance(d, dict):
            raise EngineProcessError("schedule: the answer must be an object")
        s = scheduled_from_json(d)
        self._sent[id(s)] = d.get("id", 0)
        return s

    def update(self, scheduled: Scheduled, sampled: dict[str, list[int]],
               finished_recving=(), finished_sending=()) -> None:
        self._call("update", id=self._sent.pop(id(scheduled), 0), sampled=sampled,
                   finished_recving=list(finished_recving),
                   finished_sending=list(finished_sending))

    def state(self, req_id: str) -> RequestState:
        return state_from_json(self._call("state", req_id=req_id))

    def num_unfinished(self) -> int:
        return self._call("num_unfinished")

    def num_free_blocks(self) -> int:
        return self._call("num_free_blocks")

    def has_requests(self) -> bool:
        return self._call("has_requests")

    def abort(self, req_id: str) -> None:
        self._call("abort", req_id=req_id)

    def reset_prefix_cache(self) -> bool:
        return self._call("reset_prefix_cache")

    def set_drafts(self, drafts: dict[str, list[int]]) -> None:
        self._call("set_drafts", drafts=drafts)

    def grammar_ready(self, req_id: str) -> None:
        self._call("grammar_ready", req_id=req_id)

    def stats(self) -> dict | None:
        return self._call("stats")

    def kv_events(self) -> list[dict]:
        return self._call("kv_events")

    def connector_calls(self) -> list[list]:
        return self._call("connector_calls")

    def kv_cache_header(self) -> dict | None:
        return self._call("kv_cache_header")

    def applies_oldest_now(self, in_flight: int, runs_work: bool, worker_done: bool) -> bool:
        return self._call("applies_oldest_now", in_flight=in_flight, runs_work=runs_work,
                          worker_done=worker_done)

    def end_step(self) -> None:
        self._call("end_step")

    def shutdown(self) -> None:
        self._call("shutdown")


class _Declared:
    """A ProcessEngine showing only the calls its hello declared (for :class:`Plugged`)."""

    def __init__(self, engine: ProcessEngine):
        self._engine = engine

    def __getattr__(self, attr):
        if attr in FEATURES or attr in OPTIONAL:
            if attr not in self._engine.implements and attr != "version":
                raise AttributeError(attr)
        return getattr(self._engine, attr)


def load_process_engine(spec: str) -> Plugged:
    """The engine of ``cmd:<command>``, started and greeted."""
    engine = ProcessEngine(spec.removeprefix("cmd:"))
    plugged = Plugged(_Declared(engine), spec)
    plugged.name = engine.name
    return plugged


# -- the engine side, in Python --------------------------------------------------------

def serve(engine, stdin: IO[str] = sys.stdin, stdout: IO[str] = sys.stdout) -> int:
    """Answer the protocol's calls on ``stdin`` with ``engine`` until stdin closes."""
    stream: Stream | None = None
    by_id: dict[str, Any] = {}
    schedules: dict[int, Scheduled] = {}  # handed out, not updated yet
    next_id = 0
    implements = [m for m in (*FEATURES, *OPTIONAL) if callable(getattr(engine, m, None))]

    def answer(**kwargs) -> None:
        stdout.write(json.dumps(kwargs) + "\n")
        stdout.flush()

    for line in stdin:
        if not line.strip():
            continue
        try:
            call = json.loads(line)
            name = call.pop("call")
            if name == "hello":
                result = {"name": getattr(engine, "name", type(engine).__name__),
                          "version": engine.version() if hasattr(engine, "version") else None,
                          "implements": implements, "protocol": PROTOCOL}
                if getattr(engine, "features", None) is not None:
                    result["features"] = sorted(engine.features)
                if getattr(engine, "always_on", None):
                    result["always_on"] = sorted(engine.always_on)
            elif name == "start":
                stream = parse_stream(call["stream"])
                by_id = {r.id: r for r in stream.requests}
                schedules.clear()
                result = engine.start(stream)
            elif name == "refuses":
                result = engine.refuses(parse_stream(call["stream"]))
            elif name == "add":
                result = engine.add(by_id[call["req_id"]], call["arrival_index"])
            elif name == "schedule":
                s = engine.schedule()
                next_id += 1
                schedules[next_id] = s
                result = {**scheduled_to_json(s), "id": next_id}
            elif name == "update":
                result = engine.update(schedules.pop(call["id"]), call["sampled"],
                                       call["finished_recving"], call["finished_sending"])
            elif name == "state":
                result = asdict(engine.state(call["req_id"]))
            elif name in CORE or name in FEATURES or name in OPTIONAL:
                result = getattr(engine, name)(**call)
            else:
                raise ValueError(f"unknown call {name!r}")
        except Exception as exc:  # the harness reads the error and fails the stream
            answer(error=f"{type(exc).__name__}: {' '.join(str(exc).split())}")
            continue
        answer(result=result)
    return 0
