"""The releases the reference describes: named rule changes over 0.11.0 (no vLLM needed)."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from harness.checks.mutants import REFERENCE_MUTANTS
from harness.jobs.mutant_hunt import hunt
from harness.formats.paths import ROOT
from reference import releases


def test_0_11_0_has_no_changes_and_each_later_release_has_some():
    assert releases.changes_in("0.11.0") == ()
    for r in releases.RELEASES[1:]:
        assert releases.changes_in(r), r


def test_a_change_applies_from_since_until_until():
    first = releases.RELEASES[:6]  # 0.11.0 to 0.14.0
    capped = releases.change("running_tokens_capped_by_max_tokens")
    assert [capped.in_effect(r) for r in first] == [False, True, True, False, False, False]
    stops = releases.change("chunked_off_stops_at_first_misfit")
    assert [stops.in_effect(r) for r in first] == [False, False, False, True, True, True]
    assert stops.in_effect("0.34.0") and not capped.in_effect("0.34.0")


def test_changes_between_releases():
    names = {c.name for c in releases.changes_between("0.11.2", "0.12.0")}
    assert names == {"running_tokens_capped_by_max_tokens", "threshold_dropped_when_nothing_chunks",
                     "chunked_off_stops_at_first_misfit", "eagle_encoder_one_token_ahead",
                     "async_skips_requests_at_max_tokens"}
    assert releases.changes_between("0.11.1", "0.11.2") == ()


def test_an_undescribed_release_is_refused():
    with pytest.raises(ValueError, match="does not describe vLLM 0.13.1"):
        releases.changes_in("0.13.1")


def test_every_change_is_named_documented_and_dated():
    for c in releases.CHANGES:
        assert c.name and c.summary and c.since in releases.RELEASES
        assert c.until is None or c.until in releases.RELEASES
        assert c.pr == "" or c.pr.startswith("#")


RELEASE_MUTANTS = [m for m in REFERENCE_MUTANTS if m.side.startswith("release ")]


def test_every_rule_change_has_a_mutant():
    assert {m.name for m in RELEASE_MUTANTS} == \
        {f"{c.name}_dropped" for c in releases.CHANGES} | \
        {f"{c.name}_kept" for c in releases.CHANGES if c.until is not None}


#: Rule changes no bundled stream shows yet, with the reason (none today): each one's
#: mutant is not killed.
NOT_SHOWN_YET: dict[str, str] = {}


@pytest.mark.selftest
@pytest.mark.parametrize("mutant", RELEASE_MUTANTS, ids=lambda m: m.name)
def test_release_rule_mutant_is_killed_by_the_recorded_traces(mutant):
    change = mutant.name.removesuffix("_dropped").removesuffix("_kept")
    if change in NOT_SHOWN_YET:
        pytest.skip(f"{change}: no bundled stream shows it yet: {NOT_SHOWN_YET[change]}")
    result = hunt(mutant)
    assert result.killed, f"{mutant.name}: no recorded trace of {mutant.side} shows the change"


@pytest.mark.selftest
def test_each_rule_change_is_shown_by_a_recorded_trace_of_its_first_release():
    """A rule change no recorded trace shows would go untested in CI: at the first recorded
    release that has it, some trace must differ under the reference without it.  (A later
    change can hide an earlier one on every bundled stream: 0.23.0 indexes no page of a
    one-token window, the only bundled case where 0.14.0's window_hits_skipped_at_admission
    shows.  The first release's traces keep testing it.)"""
    from harness.checks.diff import first_divergence
    from harness.formats.paths import golden_dir
    from harness.engines.reference_engine import ReferenceEngine
    from harness.loop.runner import run
    from harness.formats.stream import parse_stream
    recorded = [r for r in releases.RELEASES if golden_dir(r).is_dir()]
    for change in releases.CHANGES:
        if change.name in NOT_SHOWN_YET:
            continue
        first = next(r for r in recorded if change.in_effect(r))
        traces = [json.loads(p.read_text()) for p in sorted(golden_dir(first).glob("*.json"))]
        without = ReferenceEngine(first, releases.rules_of(first) - {change.name})
        shown = any(first_divergence(t, run(without, parse_stream(t["stream"])).to_json())
                    is not None for t in traces)
        assert shown, f"{first}: no recorded trace shows {change.name}"


@pytest.mark.slow
def test_the_changelog_page_is_written_from_the_releases():
    """docs/upgrades/changelog.md is what ``python -m harness changelog`` writes now."""
    from harness.jobs import changelog
    assert changelog.PAGE.read_text() == changelog.text(), "run: python -m harness changelog"
    for change in releases.CHANGES:
        assert f"**`{change.name}`**" in changelog.PAGE.read_text()


def test_eagle_lookahead_item_waits_from_0_13_0_until_0_28_0():
    waits = releases.change("eagle_lookahead_item_waits")
    assert [waits.in_effect(r) for r in ("0.12.0", "0.13.0", "0.27.1", "0.28.0", "0.29.0")] \
        == [False, True, True, False, False]


def test_a_batch_the_worker_is_done_with_waits_for_a_full_queue_from_0_23_0():
    """batch_queue_fills_before_applying, on the bundled stream async_worker_done_at_once:
    the worker is done at once in step 0, so up to 0.22.1 the step applies its batch and
    a and b emit in it; from 0.23.0 the queue of two is not full, so they emit a step later."""
    from harness.engines import get_engine
    from harness.formats.paths import STREAMS_DIR
    from harness.loop.runner import run
    from harness.formats.stream import load_stream
    stream = load_stream(STREAMS_DIR / "async_worker_done_at_once.json")
    before = run(get_engine("reference", release="0.22.1"), stream).to_json()["steps"]
    after = run(get_engine("reference", release="0.23.0"), stream).to_json()["steps"]
    assert before[0]["emitted"] == {"a": [2], "b": [7]}
    assert not after[0].get("emitted") and after[1]["emitted"] == {"a": [2], "b": [7]}


def test_window_cap_on_every_allocation_fails_the_engine_in_0_20_0_and_0_20_1():
    """The bundled stream of that name: at step 7 r0 needs a page in each group and none is
    free.  0.20.0 and 0.20.1 count its window page as none (its table is as long as the
    admission cap) and fail taking it; 0.20.2 counts it and preempts r1."""
    from harness.engines import get_engine
    from harness.formats.paths import STREAMS_DIR
    from harness.loop.runner import run
    from harness.formats.stream import load_stream
    cap = releases.change("window_cap_on_every_allocation")
    assert [cap.in_effect(r) for r in ("0.19.1", "0.20.0", "0.20.1", "0.20.2", "0.21.0")] \
        == [False, True, True, False, False]
    stream = load_stream(STREAMS_DIR / "window_cap_on_every_allocation.json")
    for release in ("0.20.0", "0.20.1"):
        failed = run(get_engine("reference", release=release), stream)
        assert (failed.verdict, failed.failure["step"]) == ("engine_failure", 7)
        assert failed.failure["message"].startswith("ValueError")
    fixed = run(get_engine("reference", release="0.20.2"), stream)
    assert fixed.verdict == "completed" and fixed.steps[7]["preempted"] == ["r1"]


# -- every ask names a change, and every change is asked ------------------------------------

#: Where the rules are asked: the reference's modules only (the harness's reference engine
#: asks through Config's methods named for the engine's rules).
ASKING = sorted((ROOT / "reference").glob("*.py"))


def asked(node: ast.AST) -> ast.expr | None:
    """The argument of a ``has(...)`` or ``.has(...)`` call, None for any other node."""
    if not (isinstance(node, ast.Call) and len(node.args) == 1):
        return None
    f = node.func
    return node.args[0] if (getattr(f, "id", None) or getattr(f, "attr", None)) == "has" else None


def rule_asks(paths) -> list[tuple[str, object, bool]]:
    """Every ``has(...)`` or ``.has(...)`` call in ``paths``: where it is, its argument
    (the value of a string literal, else its source) and whether it is a literal."""
    found = []
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            arg = asked(node)
            if arg is None:
                continue
            literal = isinstance(arg, ast.Constant) and isinstance(arg.value, str)
            found.append((f"{path.name}:{node.lineno}",
                          arg.value if literal else ast.unparse(arg), literal))
    return found


def unknown_asks(paths) -> list[str]:
    names = {c.name for c in releases.CHANGES}
    return [f"{where}: has({value!r})" + ("" if literal else ": not a string literal")
            for where, value, literal in rule_asks(paths) if not literal or value not in names]


def test_every_rule_ask_names_a_change():
    """A misspelt ask would silently state 0.11.0's rule (``Config.has`` answers False for
    a name that is no change): every ask is a string literal naming a change."""
    bad = unknown_asks(ASKING)
    assert not bad, "asks that name no rule change:\n" + "\n".join(bad)


def test_only_the_reference_and_its_mutants_ask():
    """The harness's engine translates no rule itself: no ask outside reference/ but in
    the mutants, which copy a rule's function with one thing changed."""
    outside = [path for path in sorted((ROOT / "harness").rglob("*.py"))
               if "mutants" not in path.parts]
    assert rule_asks(outside) == []


def test_every_change_is_asked_somewhere():
    asked = {value for _, value, literal in rule_asks(ASKING) if literal}
    unasked = [c.name for c in releases.CHANGES if c.name not in asked]
    assert not unasked, f"rule changes nothing asks: {unasked}"


def test_a_misspelt_ask_is_caught(tmp_path):
    module = tmp_path / "misspelt.py"
    module.write_text("def rule(config, name):\n"
                      "    return config.has('window_hits_skiped_at_admission') or has(name)\n")
    assert unknown_asks([module]) == [
        "misspelt.py:2: has('window_hits_skiped_at_admission')",
        "misspelt.py:2: has('name'): not a string literal"]


# -- one home per rule change: the record says where it applies ----------------------------

def ask_sites(paths) -> dict[str, set[str]]:
    """For each change asked about in ``paths``: the functions that ask, as
    ``module.Class.function``."""
    sites: dict[str, set[str]] = {}

    def visit(node, path: Path, qual: list[str]) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                visit(child, path, qual + [child.name])
                continue
            for sub in ast.walk(child):
                arg = asked(sub)
                if isinstance(arg, ast.Constant):
                    sites.setdefault(arg.value, set()).add(".".join([path.stem] + qual))

    for path in paths:
        visit(ast.parse(path.read_text()), path, [])
    return sites


def test_each_record_names_the_functions_that_ask_about_it():
    """``applies_in`` is where a reader finds the change in the reference: exactly the
    functions that ask about it."""
    sites = ask_sites(ASKING)
    wrong = {c.name: (sorted(c.applies_in), sorted(sites.get(c.name, ())))
             for c in releases.CHANGES if set(c.applies_in) != sites.get(c.name, set())}
    assert not wrong, "applies_in (record, asked in): " + repr(wrong)


def test_the_site_finder_can_fail(tmp_path):
    module = tmp_path / "rules.py"
    module.write_text("class S:\n    def step(self, config):\n"
                      "        if config.has('a'):\n            return has('b')\n"
                      "def top(config):\n    return [config.has('a') for _ in ()]\n")
    assert ask_sites([module]) == {"a": {"rules.S.step", "rules.top"}, "b": {"rules.S.step"}}


def test_each_record_names_the_vllm_file_it_mirrors():
    bad = [c.name for c in releases.CHANGES
           if not (c.mirrors.startswith("vllm/") and c.mirrors.endswith(".py"))]
    assert not bad, f"no vLLM file named: {bad}"


def test_the_streams_a_change_matters_on_are_named_features():
    from harness.checks.mutants.applies import predicate
    for c in releases.CHANGES:
        predicate(c.matters_on)  # raises on a word that names no feature
    with pytest.raises(ValueError, match="'windows' is not a feature of a stream"):
        predicate("encoder and (windows or batch_queue)")
    assert predicate("") is None


def test_the_mutants_take_their_files_and_streams_from_the_records():
    """No table of the harness's own: a change's mutants mirror its record's file, and
    apply exactly where its record's ``matters_on`` says."""
    by_name = {m.name: m for m in REFERENCE_MUTANTS}
    for c in releases.CHANGES:
        m = by_name[f"{c.name}_dropped"]
        assert m.mirrors == c.mirrors
        assert (m.applies is None) == (c.matters_on == "")
