"""Mutants of the releases: each takes one rule change out of the release that brought it
(``<change>_dropped``), or keeps it past the release that undid it (``<change>_kept``).

Everything a change's mutants say comes from its record in ``reference/releases.py``:
the vLLM file it mirrors and the streams it can matter on (``matters_on``).
"""

from __future__ import annotations

from harness.checks.mutants.applies import predicate
from harness.checks.mutants.registry import MUTANTS
from harness.formats.mutant import Mutant, replace
from reference import config as rconfig
from reference import releases

_has = rconfig.Config.has


def _without(name: str):
    def has(self, rule_change):
        return rule_change != name and _has(self, rule_change)
    return has


def _kept(name: str):
    def has(self, rule_change):
        return rule_change == name or _has(self, rule_change)
    return has


#: The rule report (harness.jobs.rule_report) runs the reference once per stream for each release
#: its rules are judged on.  The changes up to this release are judged on the ci profile's
#: streams as 0.11.0's rules are; later ones by the replay of their release's recorded
#: traces only (tests/test_releases.py, make mutants), which keeps the report's cost flat
#: as releases are added.  Their reach by the strategies is not measured yet.
STREAM_JUDGED_UNTIL = "0.13.0"


def matters_on(change: releases.RuleChange):
    """The streams a change's mutant can be killed on, as its record names them."""
    return predicate(change.matters_on)


for _change in releases.CHANGES:
    MUTANTS.append(Mutant(
        f"{_change.name}_dropped", f"{_change.since}: {_change.name}",
        _change.mirrors,
        replace(rconfig.Config, "has", _without(_change.name), question=True),
        side=f"release {_change.since}", applies=matters_on(_change),
        checked_by="streams" if releases.order(_change.since)
        <= releases.order(STREAM_JUDGED_UNTIL) else "recorded traces"))
    if _change.until is not None:
        # Kept past the release that undid it: that release's recorded traces must tell.
        MUTANTS.append(Mutant(
            f"{_change.name}_kept", f"{_change.until}: {_change.name} undone",
            _change.mirrors,
            replace(rconfig.Config, "has", _kept(_change.name), question=True),
            side=f"release {_change.until}", applies=matters_on(_change),
            checked_by="recorded traces"))
