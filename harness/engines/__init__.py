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


class EngineUnavailable(RuntimeError):
    """The installed vLLM cannot be driven: not installed, or a symbol the adapter needs is gone."""


def get_engine(name: str):
    """The engine called ``name``, built on first use and shared within the process."""
    if name not in _BUILT:
        if name == "reference":
            from harness.engines.reference_engine import ReferenceEngine
            _BUILT[name] = ReferenceEngine()
        elif name == "vllm":
            _BUILT[name] = _vllm_engine()
        else:
            raise UnknownEngine(f"--engine: unknown engine {name!r} ({' or '.join(ENGINE_NAMES)})")
    return _BUILT[name]


def _vllm_engine():
    try:
        from harness.engines.vllm_adapter import VllmEngine
    except ModuleNotFoundError as exc:
        if exc.name and exc.name.split(".")[0] in ("vllm", "torch"):
            raise EngineUnavailable(f"vLLM cannot be driven: {exc.name} is not installed "
                                    "(pip install -e '.[vllm]')") from None
        raise
    except ImportError as exc:  # a name the adapter imports is gone from this vLLM
        raise EngineUnavailable(f"vLLM cannot be driven: {_one_line(exc)}") from None
    return VllmEngine()


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())
