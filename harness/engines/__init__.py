"""The engines the harness drives, by name; the only place that touches vLLM.

Everything that imports ``vllm`` or ``torch`` lives in this package:

* :mod:`harness.formats.steps` -- the engine interface and the one translation
  of a scheduler output into the engine-neutral :class:`~harness.formats.steps.Scheduled`;
* :mod:`harness.engines.reference_engine` -- the clean-room reference (never imports vLLM);
* :mod:`harness.engines.vllm_adapter` -- vLLM's real scheduler, instrumented;
* :mod:`harness.engines.vllm_core` -- vLLM's real ``EngineCore`` over a scripted executor
  (engine ``vllm-core``: vLLM's own step loop);
* :mod:`harness.engines.vllm_bare` -- vLLM's scheduler in a bare loop, no trace (the
  benchmark's yardstick);
* :mod:`harness.engines.vllm_kv_sizing` -- vLLM's start-up KV sizing, in plain values
  (:func:`vllm_kv_sizes`: bytes per token and per page of a model, for the seed table);
* :mod:`harness.engines.vllm_connector` -- the scripted KV connector vLLM loads by
  module path;
* :mod:`harness.engines.vllm_mutants` -- patches of vLLM that stand in for an upgrade;
* :mod:`harness.engines.plugin` -- engines from outside the harness (``module:Class``);
* :mod:`harness.engines.line_protocol` -- an engine in another process, in any language,
  over JSON lines (``cmd:<command>``), and the engine side in Python (``serve``).

An engine is built once per process (importing vLLM takes seconds) and reused
for every stream: ``start(stream)`` resets it.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
import sys
from pathlib import Path

ENGINE_NAMES = ("vllm", "vllm-core", "reference")

_BUILT: dict[str, object] = {}
_KV_SIZING: dict[Path, object] = {}


class UnknownEngine(ValueError):
    """A name that is not in ENGINE_NAMES."""


class EngineUnavailable(RuntimeError):
    """The installed vLLM cannot be driven: not installed, or a symbol the adapter needs is gone."""


def get_engine(name: str, release: str | None = None):
    """The engine called ``name``, built on first use and shared within the process.

    The reference states the rules of ``release``; by default those of the
    installed vLLM (see :func:`reference_release`).
    """
    if name == "reference":
        release = release or reference_release()
        key = f"reference@{release}"
        if key not in _BUILT:
            from harness.engines.reference_engine import ReferenceEngine
            _BUILT[key] = ReferenceEngine(release)
        return _BUILT[key]
    if name not in _BUILT:
        if name == "vllm":
            _BUILT[name] = _vllm_engine()
            _freeze_what_imports_made()
        elif name == "vllm-core":
            _BUILT[name] = _vllm_core_engine()
            _freeze_what_imports_made()
        elif name.startswith("cmd:"):
            from harness.engines.line_protocol import EngineProcessError, load_process_engine
            try:
                _BUILT[name] = load_process_engine(name)
            except EngineProcessError as exc:
                raise UnknownEngine(f"--engine {name}: {exc}") from None
        elif ":" in name:
            from harness.engines.plugin import PluginError, load_plugin
            try:
                _BUILT[name] = load_plugin(name)
            except PluginError as exc:
                raise UnknownEngine(str(exc)) from None
        else:
            raise UnknownEngine(f"--engine: unknown engine {name!r} ({', '.join(ENGINE_NAMES)}, "
                                "or module:Class or cmd:<command> for an engine of your own)")
    return _BUILT[name]


def _freeze_what_imports_made() -> None:
    """Move every object alive now (vLLM's, torch's and pydantic's imports: about 450,000)
    out of the cyclic collector's sight, as ``gc.freeze`` is meant for: they live as long
    as the process, yet each full collection walked all of them, a tenth of a campaign's
    time.  Forked workers then share those pages instead of copying them."""
    import gc
    gc.collect()
    gc.freeze()


def installed_vllm_version() -> str | None:
    """The vLLM release on the import path, read from its metadata (vLLM is not imported);
    once it is imported, the one imported (asked on every check)."""
    if "vllm" in sys.modules:
        return _imported_vllm_version()
    spec = importlib.util.find_spec("vllm")
    return _version_beside(spec.origin if spec is not None else None)


@functools.lru_cache(maxsize=1)
def _imported_vllm_version() -> str | None:
    """The imported vLLM's release: a process imports vLLM once, so it is read once
    (looking it up again took 5 µs a check)."""
    return _version_beside(getattr(sys.modules["vllm"], "__file__", None))


def _version_beside(origin: str | None) -> str | None:
    """The release of the vLLM whose ``__init__.py`` is ``origin`` (None: not found)."""
    return _vllm_version_in(os.path.dirname(os.path.dirname(origin))) if origin else None


@functools.lru_cache(maxsize=None)
def _vllm_version_in(site: str) -> str | None:
    """The version of the vLLM installed in ``site``: read once per folder and process
    (reading every package's metadata took ~0.2 s, on every check of a stream)."""
    import importlib.metadata
    for dist in importlib.metadata.distributions(path=[site]):
        if dist.metadata["Name"] == "vllm":
            return dist.version
    try:
        return importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        return None


def reference_release() -> str:
    """The release the reference states by default: the installed vLLM's when the
    reference describes it, else the newest described release before it, else 0.11.0."""
    return _described_release(installed_vllm_version())


@functools.lru_cache(maxsize=None)
def _described_release(installed: str | None) -> str:
    from reference import releases
    return releases.newest_described(installed) if installed else releases.RELEASES[0]


def _vllm_engine():
    with _vllm_importable():
        from harness.engines.vllm_adapter import VllmEngine
    return VllmEngine()


def _vllm_core_engine():
    with _vllm_importable():
        from harness.engines.vllm_core import VllmCoreEngine
    return VllmCoreEngine()


def vllm_bare_loop():
    """The bare vLLM scheduler loop (:mod:`harness.engines.vllm_bare`): ``(run_bare,
    refuses)``, the benchmark's yardstick for what checking a stream costs."""
    with _vllm_importable():
        from harness.engines.vllm_bare import refuses, run_bare
    return run_bare, refuses


def vllm_sizing(model_dir: Path):
    """vLLM's start-up KV sizing for a model config folder (a ``VllmKVSizing``, one per
    folder and process; it keeps vLLM's configs, never a size)."""
    key = Path(model_dir).resolve()
    if key not in _KV_SIZING:
        with _vllm_importable():
            from harness.engines.vllm_kv_sizing import VllmKVSizing
        _KV_SIZING[key] = VllmKVSizing(key)
    return _KV_SIZING[key]


def vllm_kv_sizes(model_dir: Path, block_size: int, max_model_len: int) -> tuple[int, int]:
    """(bytes per token, bytes per ``block_size``-token page), over all layers, from vLLM's
    KV cache spec for the model as vLLM's ModelConfig reads it; computed on every call."""
    return vllm_sizing(model_dir).model_kv_sizes(block_size, max_model_len)


@contextlib.contextmanager
def _vllm_importable():
    """Turn a missing vLLM (or a name gone from it) into EngineUnavailable."""
    if importlib.util.find_spec("vllm") is None:  # before the adapters import numpy and torch
        raise EngineUnavailable("vLLM cannot be driven: vllm is not installed "
                                "(pip install -e '.[vllm]')")
    try:
        yield
    except ModuleNotFoundError as exc:
        if exc.name and exc.name.split(".")[0] in ("vllm", "torch"):
            raise EngineUnavailable(f"vLLM cannot be driven: {exc.name} is not installed "
                                    "(pip install -e '.[vllm]')") from None
        raise
    except ImportError as exc:  # a name the adapter imports is gone from this vLLM
        raise EngineUnavailable(f"vLLM cannot be driven: {_one_line(exc)}") from None


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())


def gpu_available() -> bool:
    """Whether torch sees a CUDA device (the GPU half of ``make gpu-check``)."""
    with _vllm_importable():
        import torch
    return bool(torch.cuda.is_available())
