"""Hypothesis profiles: the same three from pytest and the CLI, CI detected as hypothesis does."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from hypothesis import settings

from harness.checks import profiles
from harness.formats.paths import ROOT

CI_VARIABLES = ["CI", "TF_BUILD", "BUILDKITE", "CIRCLECI", "CIRRUS_CI", "CODEBUILD_BUILD_ID",
                "GITHUB_ACTIONS", "GITLAB_CI", "HEROKU_TEST_RUN_ID", "TEAMCITY_VERSION",
                "bamboo.buildKey", "__TOX_ENVIRONMENT_VARIABLE_ORIGINAL_CI"]


def no_ci_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in CI_VARIABLES}


@pytest.mark.parametrize("variable, value", [("CI", "true"), ("CI", "1"), ("GITHUB_ACTIONS", "true"),
                                             ("GITLAB_CI", "yes"), ("BUILDKITE", "true")])
def test_ci_is_detected_as_hypothesis_detects_it(monkeypatch, variable, value):
    for k in CI_VARIABLES:
        monkeypatch.delenv(k, raising=False)
    assert profiles.default() == "dev"
    monkeypatch.setenv(variable, value)
    assert profiles.default() == "ci"


def test_each_profile_loads_with_its_settings():
    before = getattr(settings, "_current_profile", None) or profiles.default()
    try:
        for name, wanted in profiles.PROFILES.items():
            assert profiles.load(name) == name
            assert settings().max_examples == wanted["max_examples"]
        assert settings().database is not None  # nightly keeps its example database
        profiles.load("ci")
        assert settings().derandomize and settings().database is None
    finally:
        profiles.load(before)


def test_unknown_profile_is_refused():
    with pytest.raises(ValueError, match="unknown profile 'weekly'"):
        profiles.load("weekly")


def _pytest_header(*args: str, env: dict[str, str]) -> str:
    proc = subprocess.run([sys.executable, "-m", "pytest", "--co", "-p", "no:cacheprovider",
                           "tests/test_layers.py", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    return next(line for line in proc.stdout.splitlines() if line.startswith("hypothesis profile:"))


@pytest.mark.slow  # a pytest run in a fresh process each
@pytest.mark.parametrize("args, extra_env, expected", [
    ((), {}, "hypothesis profile: dev (50 examples"),
    ((), {"GITHUB_ACTIONS": "true"}, "hypothesis profile: ci (250 examples"),
    ((), {"CI": "1"}, "hypothesis profile: ci (250 examples"),
    (("--hypothesis-profile", "nightly"), {"CI": "true"}, "hypothesis profile: nightly (5000 examples"),
])
def test_pytest_picks_the_project_profile(args, extra_env, expected):
    assert _pytest_header(*args, env={**no_ci_env(), **extra_env}).startswith(expected)


@pytest.mark.needs_vllm
def test_cli_fuzz_uses_the_profile(monkeypatch):
    from harness.jobs.campaign import run_campaign
    before = getattr(settings, "_current_profile", None) or profiles.default()
    monkeypatch.setitem(profiles.PROFILES, "dev", {**profiles.PROFILES["dev"], "max_examples": 3})
    try:
        r = run_campaign(profile="dev", seed=1)
        assert (r.profile, r.examples, r.stats.counts["streams"]) == ("dev", 3, 3)
        r = run_campaign(profile="nightly", examples=2, seed=1)
        assert (r.profile, r.examples, r.stats.counts["streams"]) == ("nightly", 2, 2)
    finally:
        profiles.load(before)


def test_a_profile_loaded_for_a_block_is_unloaded_after_it():
    """A report built inside a test (the rule report) leaves the test's profile loaded."""
    from hypothesis import settings
    profiles.register()
    before = settings.get_current_profile_name()
    other = "nightly" if before != "nightly" else "ci"
    with profiles.loaded(other):
        assert settings.get_current_profile_name() == other
    assert settings.get_current_profile_name() == before
