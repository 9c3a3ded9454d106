"""The conformance harness: streams in, traces out, vLLM and the reference diffed step by step."""

from __future__ import annotations

from importlib import metadata

from harness.formats.compiled import use_requested

try:
    __version__ = metadata.version("vllm-conformance")
except metadata.PackageNotFoundError:  # run from a source tree that was never installed
    __version__ = "0+unknown"

# HARNESS_REFERENCE=compiled: the reference comes from its mypyc build (before anything
# imports it).
use_requested()
