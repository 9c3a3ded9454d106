"""``docs/upgrades/changelog.md``: vLLM's scheduling rules, release by release.

Written from ``reference/releases.py`` (``python -m harness changelog``): each rule
change with the release that brought it, the one that undid it, its pull request and
what it says, and the bundled stream that shows it -- the first whose recorded trace of
that release the reference, with that one change taken away, no longer reproduces.  A
test keeps the page equal to what this module writes.
"""

from __future__ import annotations

from harness.checks.diff import first_divergence
from harness.engines.reference_engine import ReferenceEngine
from harness.checks.golden import read_trace
from harness.formats.paths import DOCS_DIR, golden_dir, write_atomic
from harness.loop.runner import run
from harness.formats.stream import parse_stream
from reference import releases

PAGE = DOCS_DIR / "upgrades" / "changelog.md"
PR_URL = "https://github.com/vllm-project/vllm/pull/"

INTRO = [
    "# vLLM's scheduling rules, release by release",
    "",
    "What changed in the v1 scheduler and KV cache manager, as far as anything a stream",
    "decides can show it: tokens per step, pages, preemptions, prefix hits, stops, events,",
    "stats, connector calls.  Each entry is a named rule change of `reference/releases.py`:",
    "the reference states vLLM 0.11.0's rules, and a later release is 0.11.0 plus the",
    "changes in effect at it.  Each entry names a bundled stream whose recorded vLLM trace",
    "of that release shows the change: the reference without it does not reproduce the",
    "trace (`make mutants` kills each change's `<name>_dropped` mutant this way).",
    "",
    "Written by `python -m harness changelog`; do not edit by hand.",
    "",
]


def recorded_releases() -> list[str]:
    return [r for r in releases.RELEASES if golden_dir(r).is_dir()]


def shown_by(change: releases.RuleChange) -> tuple[str, str] | None:
    """(bundled stream, release) of the first recorded trace that shows the change."""
    for release in recorded_releases():
        if not change.in_effect(release):
            continue
        without = ReferenceEngine(release, releases.rules_of(release) - {change.name})
        for path in sorted(golden_dir(release).glob("*.json")):
            trace = read_trace(path)
            if first_divergence(trace, run(without, parse_stream(trace["stream"])).to_json()):
                return path.stem, release
    return None


def entry(change: releases.RuleChange) -> list[str]:
    pr = f"[{change.pr}]({PR_URL}{change.pr[1:]})" if change.pr else "PR not identified"
    undone = f" Undone in {change.until}." if change.until else ""
    shown = shown_by(change)
    where = (f" Shown by the bundled stream `{shown[0]}` "
             f"([vLLM {shown[1]}'s trace](../../fixtures/traces/vllm-{shown[1]}/{shown[0]}.json))."
             if shown else " No recorded trace shows it yet.")
    home = (f" In vLLM: `{change.mirrors}`; in the reference: "
            + ", ".join(f"`{f}`" for f in change.applies_in)
            + (f"; matters on streams with {change.matters_on}." if change.matters_on else "."))
    return [f"* **`{change.name}`** ({pr}). {change.summary}{undone}{home}{where}"]


def text() -> str:
    lines = list(INTRO)
    by_release: dict[str, list[releases.RuleChange]] = {}
    for change in releases.CHANGES:
        by_release.setdefault(change.since, []).append(change)
    for release in releases.RELEASES[1:]:
        lines += [f"## {release}", ""]
        changes = by_release.get(release, [])
        undone = [c for c in releases.CHANGES if c.until == release]
        if not changes and not undone:
            lines += ["No rule change a stream can show.", ""]
            continue
        for change in changes:
            lines += entry(change)
        for change in undone:
            lines += [f"* `{change.name}` (from {change.since}) is undone: back to 0.11.0's rule."]
        lines.append("")
    newest = releases.RELEASES[-1]
    lines += [f"## After {newest}", "",
              f"Not described yet: releases after {newest} are compared with {newest}'s rules "
              "(see [the table of releases](README.md)).", ""]
    return "\n".join(lines).rstrip() + "\n"


def main() -> int:
    write_atomic(PAGE, text())
    print(f"wrote {PAGE}")
    return 0
