"""Shared pytest setup: hypothesis profiles and the vLLM availability gate.

Profiles are those of ``harness.checks.profiles`` (``ci``, ``fast``, ``dev``, ``nightly``,
``replay``): ``ci`` when hypothesis detects a CI system, ``dev`` otherwise; select one
with ``--hypothesis-profile NAME``.

Markers (``pyproject.toml``): ``conformance`` holds the installed vLLM to the
reference (``pytest -k conformance`` selects exactly these), ``selftest`` checks that
the harness itself can fail, ``slow`` is left out of ``make test-fast``.
"""

from __future__ import annotations

import importlib.util
import os

import pytest

from harness.checks import profiles

profiles.load()


def vllm_missing_reason() -> str | None:
    """Why the vLLM tier cannot run here, or None when it can."""
    if os.environ.get("HARNESS_NO_VLLM") == "1":
        return "HARNESS_NO_VLLM=1: vLLM tier switched off"
    if importlib.util.find_spec("vllm") is None:
        return "vllm is not installed in this environment (pip install -e '.[vllm]'); the replay tier still runs"
    return None


def pytest_addoption(parser):
    parser.addoption("--engine", default=None, metavar="ENGINE",
                     help="the engine the conformance properties hold to the reference: vllm "
                          "(default), vllm-core, module:Class or cmd:<command> (an engine of "
                          "your own; streams it does not take pass as not taken)")
    parser.addoption("--level", default=None, metavar="LEVEL",
                     help="with --engine: compare up to this fidelity level (tokens, "
                          "preemptions, prefix_hits, exact; default exact)")
    parser.addoption("--fields", default=None, metavar="F1,F2",
                     help="with --engine: compare only these step fields (not with --level)")


def pytest_collection_modifyitems(config, items):
    reason = vllm_missing_reason()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=reason)
    # With an engine of one's own, the conformance properties hold it to the reference:
    # no vLLM needed.
    own_engine = config.getoption("--engine") not in (None, "vllm", "vllm-core")
    for item in items:
        if "needs_vllm" in item.keywords and not (
                own_engine and item.module.__name__.endswith("test_conformance")):
            item.add_marker(skip)


@pytest.fixture(scope="session")
def vllm_engine():
    """One VllmEngine per test process (importing vLLM takes ~10 s).

    An installed vLLM that the adapter cannot drive stops the run with one line
    naming what is missing (exit 3), not a traceback per test.
    """
    reason = vllm_missing_reason()
    if reason:
        pytest.skip(reason)
    from harness.engines import EngineUnavailable, get_engine
    try:
        return get_engine("vllm")
    except EngineUnavailable as exc:
        pytest.exit(f"error: {exc}", returncode=3)


@pytest.fixture(scope="session", autouse=True)
def _mutant_from_environment():
    """HARNESS_MUTANT=<name> runs the whole suite against one mutant, to watch it fail."""
    name = os.environ.get("HARNESS_MUTANT")
    if not name:
        yield
        return
    from harness.checks.mutants import find
    mutant = find(name)
    if mutant is None or mutant.patch is None:
        raise pytest.UsageError(f"HARNESS_MUTANT: unknown mutant {name!r}")
    with mutant.patch():
        yield


# -- tests leave nothing behind ----------------------------------------------------------

# Caches and build output that are allowed to appear in the working tree.
_ALLOWED_LEFTOVERS = (".venv/", ".pytest_cache/", ".hypothesis/", "__pycache__/", ".egg-info/",
                      "build/")


def _leftovers(root) -> set[str] | None:
    """Untracked and ignored paths in the working tree (folders collapsed), or None outside git."""
    import subprocess
    try:
        out = subprocess.run(["git", "status", "--porcelain", "--ignored", "--untracked-files=normal"],
                             cwd=root, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    paths = {line[3:] for line in out.stdout.splitlines() if line[:2] in ("??", "!!")}
    return {p for p in paths if not any(a in p for a in _ALLOWED_LEFTOVERS)}


def pytest_sessionstart(session):
    session.config._leftovers_before = _leftovers(session.config.rootpath)


def pytest_sessionfinish(session, exitstatus):
    """A passing run must not have written files into the working tree."""
    before = getattr(session.config, "_leftovers_before", None)
    if exitstatus != 0 or before is None:
        return
    new = sorted((_leftovers(session.config.rootpath) or set()) - before)
    if new:
        print(f"\nerror: the tests left files in the working tree: {', '.join(new)}")
        session.exitstatus = 1


def pytest_report_header(config):
    from hypothesis import settings
    name = getattr(settings, "_current_profile", None) or "?"
    return f"hypothesis profile: {name} ({settings().max_examples} examples per property)"
