"""The command line, ``python -m harness`` (or ``vllm-conformance``): it parses arguments
and dispatches; nothing else.  ``main`` is in :mod:`harness.cli.main`."""

from harness.cli.main import main, run

__all__ = ["main", "run"]
