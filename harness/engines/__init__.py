"""The engines the harness drives, by name; the only place that touches vLLM.

Everything that imports ``vllm`` or ``torch`` lives in this package:

* :mod:`harness.engines.base` -- the engine interface and the one translation
  of a scheduler output into the engine-neutral :class:`~harness.engines.base.Scheduled`;
* :mod:`harness.engines.reference_engine` -- the clean-room reference (never imports vLLM);
* :mod:`harness.engines.vllm_adapter` -- vLLM's real scheduler, instrumented;
* :mod:`harness.engines.vllm_kv_sizing` -- vLLM's start-up KV sizing, in plain values;
* :mod:`harness.engines.vllm_mutants` -- patches of vLLM that stand in for an upgrade.

An engine is built once per process (importing vLLM takes seconds) and reused
for every stream: ``start(stream)`` resets it.
"""

from __future__ import annotations

ENGINE_NAMES = ("vllm", "reference")

_BUILT: dict[str, object] = {}


class UnknownEngine(ValueError):
    """A name that is not in ENGINE_NAMES."""


def get_engine(name: str):
    """The engine called ``name``, built on first use and shared within the process."""
    if name not in _BUILT:
        if name == "reference":
            from harness.engines.reference_engine import ReferenceEngine
            _BUILT[name] = ReferenceEngine()
        elif name == "vllm":
            from harness.engines.vllm_adapter import VllmEngine
            _BUILT[name] = VllmEngine()
        else:
            raise UnknownEngine(f"--engine: unknown engine {name!r} ({' or '.join(ENGINE_NAMES)})")
    return _BUILT[name]
