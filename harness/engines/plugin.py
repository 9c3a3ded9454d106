"""Engines from outside the harness, plugged in by name: ``--engine module:Class``.

A plug-in is a class, importable from the current folder or the import path, whose
instances implement the engine interface of :mod:`harness.formats.steps`; it is
built once per process with no arguments and reset by ``start(stream)`` for every
stream, as the harness's own engines are.  ``schedule()`` returns a
:class:`~harness.formats.steps.Scheduled`, ``state(req_id)`` a
:class:`~harness.formats.steps.RequestState` (docs/engine-interface.md).

Seven methods make an engine (:data:`CORE`).  Every other method belongs to a
feature of the stream format; an engine without it does not take the streams
that use that feature (:data:`FEATURES`): ``refuses`` names the method, the
stream is reported as not taken rather than as a divergence, and a simulator
that models only part of vLLM gets a report on that part.  Without
``has_requests`` the engine counts as having work while a request is unfinished
(vLLM also counts finished requests the worker has not been told of yet).
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import Any, Callable

from harness.formats import features as feature_space
from harness.formats.stream import Stream

#: The methods every plugged-in engine has.
CORE = ("start", "add", "schedule", "update", "state", "num_unfinished", "num_free_blocks")

#: Optional methods, each with the streams that need it.
FEATURES: dict[str, tuple[str, Callable[[Stream], bool]]] = {
    "abort": ("requests aborted (abort_step)",
              lambda s: any(r.abort_step is not None for r in s.requests)),
    "reset_prefix_cache": ("prefix cache resets (reset_prefix_cache_steps)",
                           lambda s: bool(s.reset_prefix_cache_steps)),
    "set_drafts": ("speculative decoding (num_speculative_tokens)",
                   lambda s: s.config.num_speculative_tokens > 0),
    "grammar_ready": ("structured output",
                      lambda s: any(r.structured_output is not None for r in s.requests)),
    "stats": ("scheduler stats (log_stats)", lambda s: s.config.log_stats),
    "kv_events": ("KV cache events (kv_cache_events)", lambda s: s.config.kv_cache_events),
    "connector_calls": ("a KV connector (kv_role)", lambda s: s.config.kv_role is not None),
    "applies_oldest_now": ("a batch queue (async_scheduling, pipeline_parallel_size)",
                           lambda s: s.config.batch_queue),
    "kv_cache_header": ("a pool sized from memory (kv_cache_memory_bytes)",
                        lambda s: s.config.kv_cache_memory_bytes is not None),
}


#: Optional methods that only observe: an engine without them takes the streams that use
#: them, and its traces carry no stats or events (they differ only where those are compared).
OBSERVING = {"stats": lambda: None, "kv_events": lambda: []}


class PluginError(ValueError):
    """An ``--engine`` that names no usable engine: one line, naming the rule broken."""


def load_plugin(spec: str) -> "Plugged":
    """The engine ``module:Class`` names, built with no arguments."""
    module_name, _, class_name = spec.partition(":")
    if not module_name or not class_name.isidentifier():
        raise PluginError(f"--engine {spec}: must be module:Class, e.g. "
                          "examples.simplified_pool:SimplifiedPoolEngine")
    if "" not in sys.path and str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))  # as `python -m` would: the current folder first
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise PluginError(f"--engine {spec}: cannot import {module_name} ({exc})") from None
    cls = getattr(module, class_name, None)
    if not callable(cls):
        raise PluginError(f"--engine {spec}: {module_name} has no class {class_name}")
    try:
        engine = cls()
    except Exception as exc:
        raise PluginError(f"--engine {spec}: {class_name}() raised "
                          f"{type(exc).__name__}: {' '.join(str(exc).split())}") from None
    missing = [m for m in CORE if not callable(getattr(engine, m, None))]
    if missing:
        raise PluginError(f"--engine {spec}: {class_name} lacks {', '.join(missing)} "
                          f"(an engine has {', '.join(CORE)})")
    for attribute in ("features", "always_on"):
        declared = getattr(engine, attribute, None)
        if declared is None:
            continue
        try:
            feature_space.check_declared(declared, f"--engine {spec}: {class_name}.{attribute}")
        except ValueError as exc:
            raise PluginError(str(exc)) from None
    return Plugged(engine, spec)


class Plugged:
    """A plugged-in engine, with the defaults and refusals of the module docstring."""

    def __init__(self, engine, spec: str):
        self.engine = engine
        self.name = spec
        self.lacks = tuple(m for m in FEATURES if not callable(getattr(engine, m, None)))

    def __getattr__(self, attr):
        if attr in OBSERVING and not callable(getattr(self.engine, attr, None)):
            return OBSERVING[attr]
        return getattr(self.engine, attr)

    def refuses(self, stream: Stream) -> str | None:
        for method in self.lacks:
            feature, needs = FEATURES[method]
            if method in OBSERVING:
                continue  # its fields are left empty; only a level that compares them sees it
            if needs(stream):
                return f"{self.name} has no {method}(): it does not take {feature}"
        declared = self.features
        if declared is not None:
            lacks = feature_space.missing(stream.to_json(), declared)
            if lacks:
                return f"{self.name} does not model {feature_space.DESCRIBED[lacks[0]]}"
        own = getattr(self.engine, "refuses", None)
        return own(stream) if callable(own) else None

    @property
    def features(self) -> frozenset[str] | None:
        """The stream features the engine declares it models (harness.formats.features);
        None when it declares none (it is then given every stream its calls allow)."""
        declared = getattr(self.engine, "features", None)
        return None if declared is None else frozenset(declared)

    def _own(self, method: str, default: Callable[[], Any]) -> Any:
        """The engine's own ``method()`` where it has one, else ``default()``."""
        own = getattr(self.engine, method, None)
        return own() if callable(own) else default()

    def version(self) -> str:
        return str(self._own("version", lambda: "unknown"))

    def has_requests(self) -> bool:
        return self._own("has_requests", lambda: self.engine.num_unfinished() > 0)

    def kv_cache_header(self) -> dict | None:
        return self._own("kv_cache_header", lambda: None)

    def end_step(self) -> None:
        self._own("end_step", lambda: None)

    def shutdown(self) -> None:
        self._own("shutdown", lambda: None)
