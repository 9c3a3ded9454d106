"""Hypothesis profiles of the project, the same from pytest and from the CLI.

* ``ci``      -- derandomized, 250 streams per property (1,500 in all), no
                 example database: the same streams on every CI run.
* ``dev``     -- the default on a workstation: 50 streams per property, random.
* ``nightly`` -- 5,000 streams per property, random, with the example database
                 so that a failure found once is replayed first next time.

The default is ``ci`` when hypothesis itself detects a CI system (``CI``,
``GITHUB_ACTIONS``, ``TF_BUILD``, ... -- the variables hypothesis reads), and
``dev`` otherwise.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, Phase, settings

_SLOW_OK = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much]

PROFILES: dict[str, dict] = {
    "ci": dict(max_examples=250, derandomize=True, deadline=None, database=None,
               suppress_health_check=_SLOW_OK, print_blob=True),
    "dev": dict(max_examples=50, deadline=None, suppress_health_check=_SLOW_OK, print_blob=True),
    "nightly": dict(max_examples=5000, deadline=None, derandomize=False,
                    suppress_health_check=_SLOW_OK, print_blob=True, phases=list(Phase)),
}


def in_ci() -> bool:
    """Whether hypothesis would call this a CI run."""
    try:
        from hypothesis._settings import is_in_ci
    except ImportError:  # an older hypothesis: its own rule was the CI variable
        return "CI" in os.environ
    return is_in_ci()


def register() -> None:
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
