"""Hypothesis profiles of the project, the same from pytest and from the CLI.

* ``ci``      -- derandomized, 250 streams per property (1,500 in all), no
                 example database: the same streams on every CI run.
* ``fast``    -- ``make test-fast``: derandomized, 30 streams per property; the
                 developer's inner loop, not a conformance verdict.
* ``dev``     -- the default on a workstation: 50 streams per property, random.
* ``nightly`` -- 5,000 streams per property, random, with the example database
                 so that a failure found once is replayed first next time.
* ``replay``  -- no new streams: only what the example database holds (failures
                 found by earlier runs or by HypoFuzz, ``make dashboard``), shrunk
                 and kept in counterexamples/ as any failure is.

The default is ``ci`` when hypothesis itself detects a CI system (``CI``,
``GITHUB_ACTIONS``, ``TF_BUILD``, ... -- the variables hypothesis reads), and
``dev`` otherwise.
"""

from __future__ import annotations

import contextlib
import os

from hypothesis import HealthCheck, Phase, settings

_SLOW_OK = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much]

#: Every profile stops at the first bug it finds.  With several, hypothesis goes on
#: looking for more for up to ten seconds of wall time, so which ones it shrinks, and
#: which stream ends up in counterexamples/<test>.json, would depend on the machine's
#: speed; one bug, shrunk, is what a counterexample file holds anyway.
_ONE_BUG = dict(report_multiple_bugs=False)

PROFILES: dict[str, dict] = {
    "ci": dict(max_examples=250, derandomize=True, deadline=None, database=None,
               suppress_health_check=_SLOW_OK, print_blob=True, **_ONE_BUG),
    "fast": dict(max_examples=30, derandomize=True, deadline=None, database=None,
                 suppress_health_check=_SLOW_OK, print_blob=True, **_ONE_BUG),
    "dev": dict(max_examples=50, deadline=None, suppress_health_check=_SLOW_OK, print_blob=True,
                **_ONE_BUG),
    "nightly": dict(max_examples=5000, deadline=None, derandomize=False,
                    suppress_health_check=_SLOW_OK, print_blob=True, phases=list(Phase),
                    **_ONE_BUG),
    "replay": dict(max_examples=50, deadline=None, suppress_health_check=_SLOW_OK,
                   print_blob=True, phases=[Phase.explicit, Phase.reuse, Phase.shrink],
                   **_ONE_BUG),
}

#: Profiles under which every property draws exactly ``max_examples`` streams: a
#: property's ``scale`` is there to reach rare rules, which the inner loop does not claim.
UNSCALED = frozenset({"fast"})


def in_ci() -> bool:
    """Whether hypothesis would call this a CI run."""
    try:
        from hypothesis._settings import is_in_ci
    except ImportError:  # an older hypothesis: its own rule was the CI variable
        return "CI" in os.environ
    return is_in_ci()


def pin_local_constants() -> None:
    """Keep hypothesis from mixing constants of the project's own source into draws.

    Hypothesis (6.13x and later) draws, now and then, a literal found in the "local"
    modules loaded so far -- every module not in site-packages or a test file.  Which of
    the harness's modules are loaded differs between ``pytest`` and the CLI, between
    pytest-xdist workers, between a forked worker and a Ray task, and between an
    editable and a wheel install, and a user's own code (a simulator, a test helper)
    would add its literals, so the same seed would draw different streams.  The
    strategies call this when imported (``harness.checks.strategies.draws``).  This
    empties that pool (hypothesis has no setting for it; the hook is internal, so an
    older or newer hypothesis without it is left as it is).  The strategies place the
    edges that matter (page boundaries, budgets) themselves.
    """
    try:
        from hypothesis.internal.conjecture import providers
    except ImportError:  # pragma: no cover
        return
    if callable(getattr(providers, "_get_local_constants", None)) and \
            hasattr(providers, "Constants") and not getattr(providers, "_harness_pinned", False):
        empty = providers.Constants()
        providers._get_local_constants = lambda: empty
        providers._harness_pinned = True
        cache = getattr(providers, "CONSTANTS_CACHE", None)
        if cache is not None and hasattr(cache, "cache"):
            cache.cache.clear()  # anything drawn before the pin


def aiming() -> bool:
    """Whether ``HARNESS_TARGET=1`` asks the conformance properties to steer generation.

    Each stream's rule counters then become ``hypothesis.target`` scores
    (:func:`harness.formats.rule_counters.aim_at`).  That changes which streams a seed draws, so it
    is off unless asked for; docs/performance.md measures what it buys.
    """
    return os.environ.get("HARNESS_TARGET") == "1"


def register() -> None:
    pin_local_constants()
    # Each on hypothesis's own defaults, not on whichever profile is loaded now.
    base = settings.get_profile("default")
    for name, kwargs in PROFILES.items():
        settings.register_profile(name, parent=base, **kwargs)


def default() -> str:
    return "ci" if in_ci() else "dev"


def load(name: str | None = None) -> str:
    """Register the profiles and load ``name`` (default: by CI detection); its name."""
    register()
    name = name or default()
    if name not in PROFILES:
        raise ValueError(f"--profile: unknown profile {name!r} ({', '.join(PROFILES)})")
    settings.load_profile(name)
    return name


@contextlib.contextmanager
def loaded(name: str):
    """``name`` loaded for the block, and the profile loaded before it back after it (a
    report built inside a test must not leave that test's worker on another profile)."""
    register()
    before = settings.get_current_profile_name()
    load(name)
    try:
        yield
    finally:
        settings.load_profile(before)
