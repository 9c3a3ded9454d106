"""Simulators held to vLLM: the adapter kit, the stream features an engine declares,
fidelity levels and certificates (docs/engine-interface.md, docs/simulators.md).

No simulator package is needed here: the kit is exercised through the project's example
simulator (examples/tiny_sim.py) and adapters made wrong on purpose.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hst

from harness.checks.diff import first_divergence
from harness.checks.levels import LEVELS, LevelError, fields_of, level_held
from harness.checks.strategies import any_stream
from harness.engines import get_engine
from harness.engines.plugin import Plugged, PluginError, load_plugin
from harness.formats import features
from harness.formats.paths import ROOT, STREAMS_DIR
from harness.formats.stream import load_stream, parse_stream
from harness.loop.runner import run

TINY = "examples.tiny_sim:TinySim"


def _traces(engine, stream):
    return run(engine, stream).to_json(), run(get_engine("reference", "0.11.0"), stream).to_json()


# -- features: streams drawn inside what an engine declares ----------------------------------

@settings(max_examples=60, deadline=None, database=None,
          suppress_health_check=list(HealthCheck))
@given(any_stream(), hst.sets(hst.sampled_from(features.FEATURES)))
def test_a_fitted_stream_is_valid_and_uses_only_declared_features(data, declared):
    fitted = features.fit(data, declared)
    parse_stream(fitted)  # still a valid stream
    left = set(features.used(fitted)) - set(declared)
    assert not left, left  # observed features are fitted away too when not declared


@settings(max_examples=40, deadline=None, database=None,
          suppress_health_check=list(HealthCheck))
@given(any_stream())
def test_stopping_by_length_instead_schedules_the_same_tokens(data):
    """Taking EOS, stop tokens and the model-length stop away keeps every step's schedule:
    each request stops at the same output, by its own limit.  (Not with drafts: vLLM cuts
    a request's drafts to its max_tokens, so there the limit itself matters.  And from one
    EOS per engine: the stand-ins for it change output tokens, so prefix-cache hits.)"""
    plain = features.fit(data, set(features.FEATURES) - {"spec_decode", "eos_per_request"})
    fitted = features.fit(plain, set(features.FEATURES) - {"spec_decode", "eos", "stop_tokens",
                                                          "model_len_stop"})
    reference = get_engine("reference", "0.11.0")
    a, b = run(reference, parse_stream(plain)).to_json(), run(reference, parse_stream(fitted)).to_json()
    assert [s["scheduled"] for s in a["steps"]] == [s["scheduled"] for s in b["steps"]]


def test_one_eos_per_engine_keeps_where_each_request_stops():
    s = {"config": {}, "requests": [
        {"id": "a", "prompt": [1], "output": [3, 5, 7], "eos_token_id": 7},
        {"id": "b", "prompt": [1], "output": [7, 9], "max_tokens": 2},
        {"id": "c", "prompt": [2], "output": [4, 9], "eos_token_id": 9}]}
    fitted = features.fit(s, {"eos", "prefix_caching", "chunked_prefill"})
    assert {r["eos_token_id"] for r in fitted["requests"]} == {7}
    assert [r["output"] for r in fitted["requests"]] == [[3, 5, 7], [8, 9], [4, 7]]
    assert "eos_per_request" in features.used(s) and "eos_per_request" not in features.used(fitted)


def test_one_eos_never_makes_a_request_say_what_its_grammar_rejects():
    """Shrunk from test_stopping_by_length_instead_schedules_the_same_tokens: b says the
    common EOS 0 without stopping, and its stand-in was 1, which b's grammar rejects
    (StreamError: "requests[1] (b).output: holds token(s) [1] that structured_output
    rejects")."""
    s = {"config": {}, "requests": [
        {"id": "a", "prompt": [0], "output": [1], "eos_token_id": 0},
        {"id": "b", "prompt": [0], "output": [0],
         "structured_output": {"ready_step": 0, "rejected_tokens": [1]}}]}
    plain = features.fit(s, set(features.FEATURES) - {"spec_decode"})
    fitted = features.fit(plain, set(features.FEATURES) - {"spec_decode", "eos", "stop_tokens",
                                                          "model_len_stop"})
    parse_stream(fitted)
    assert [r["output"] for r in fitted["requests"]] == [[1], [2]]


def test_one_eos_keeps_each_request_valid_and_where_it_stops():
    s = {"config": {}, "requests": [
        {"id": "a", "prompt": [0], "output": [1], "eos_token_id": 0},
        # says 0 twice, once spoken: a stand-in its grammar accepts
        {"id": "b", "prompt": [0], "output": [0, 0], "max_tokens": 1,
         "structured_output": {"ready_step": 0, "rejected_tokens": [1]}},
        # every near stand-in is a stop token, but it never says 0 (was StopIteration)
        {"id": "c", "prompt": [0], "output": [3], "eos_token_id": 0, "stop_token_ids": [1, 2]},
        # stops at the stop token 0: it stays (a stand-in there moved the stop to 2)
        {"id": "d", "prompt": [0], "output": [0, 5], "stop_token_ids": [0]},
        # stops by its EOS 4, but its grammar rejects 0: it stops by length there
        {"id": "e", "prompt": [0], "output": [4, 6], "eos_token_id": 4,
         "structured_output": {"ready_step": 0, "rejected_tokens": [0]}}]}
    fitted = features.fit(s, set(features.FEATURES) - {"eos_per_request"})
    stream = parse_stream(fitted)
    assert [r["output"] for r in fitted["requests"]] == [[1], [2, 2], [3], [0, 5], [4]]
    assert [r.stop_index(256) for r in stream.requests] == [0, 0, 0, 0, 0]
    assert "eos_per_request" not in features.used(fitted)


def test_one_eos_on_a_stop_token_does_not_bring_stop_tokens_back():
    """f stops by its EOS 5; under the common EOS 0, one of its stop tokens, it would stop
    there by a stop token, a feature the engine lacks: its stop tokens go."""
    s = {"config": {}, "requests": [
        {"id": "a", "prompt": [0], "output": [1], "eos_token_id": 0},
        {"id": "f", "prompt": [0], "output": [5], "eos_token_id": 5, "stop_token_ids": [0]}]}
    fitted = features.fit(s, {"prefix_caching", "eos"})
    parse_stream(fitted)
    assert fitted["requests"][1] == {"id": "f", "prompt": [0], "output": [0], "eos_token_id": 0}
    assert set(features.used(fitted)) <= {"prefix_caching", "eos"}


def test_an_unknown_declared_feature_is_one_line(tmp_path, monkeypatch):
    (tmp_path / "bad_sim.py").write_text(
        "from examples.tiny_sim import TinySim\n"
        "class Bad(TinySim):\n    features = frozenset({'chunked_prefil'})\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.syspath_prepend(str(ROOT))
    with pytest.raises(PluginError, match="unknown feature 'chunked_prefil'"):
        load_plugin("bad_sim:Bad")


# -- the kit: vLLM's conventions kept once ----------------------------------------------------

#: Bundled streams on which the example simulator, fitted to its features, gives vLLM's
#: trace exactly: the null page, finished-next-step, statuses, the stop rule and the KV
#: slots are the kit's, and any slip there shows on every one of them.
EXACT_ON = ("seed_eos_4_1_1", "seed_budget_split_2_2", "seed_fcfs_preempt_recompute",
            "stop_eos", "stop_max_tokens", "stop_max_model_len", "stop_ignore_eos",
            "stop_token_ids_drop_after", "stop_eos_on_last_allowed_token",
            "waiting_alloc_fail_blocks_queue", "waiting_blocked_after_preemption",
            "resumed_recomputes_outputs")


@pytest.mark.parametrize("name", EXACT_ON)
def test_the_example_simulator_on_the_kit_gives_vllms_trace(name):
    engine = load_plugin(TINY)
    data = json.loads((STREAMS_DIR / f"{name}.json").read_text())
    stream = parse_stream(features.fit(data, engine.features))
    assert engine.refuses(stream) is None
    mine, reference = _traces(engine, stream)
    assert first_divergence(reference, mine) is None


class OneTokenOff:
    """The example simulator with its adapter made wrong: the first prefill of more than
    one token is scheduled one token short."""

    @staticmethod
    def build():
        from examples.tiny_sim import TinySim

        class Off(TinySim):
            name = "one-token-off"
            cut = False

            def decide(self):
                d = super().decide()
                if d.scheduled and d.scheduled[0][1] > 1 and not self.cut:
                    rid, n = d.scheduled[0]
                    d.scheduled[0] = (rid, n - 1)
                    self.computed[rid] -= 1
                    self.cut = True
                return d
        return Plugged(Off(), "one-token-off")


def test_a_one_token_off_adapter_fails_at_every_level():
    engine = OneTokenOff.build()
    stream = load_stream(STREAMS_DIR / "seed_eos_4_1_1.json")
    mine, reference = _traces(engine, parse_stream(features.fit(stream.to_json(),
                                                                engine.features)))
    assert level_held(reference, mine)[0] is None
    for level in LEVELS:
        from harness.checks.levels import divergence
        assert divergence(reference, mine, fields_of(level)) is not None, level


def test_pages_off_by_one_hold_every_level_below_exact():
    from examples.tiny_sim import TinySim

    class PagesOff(TinySim):
        name = "pages-off"

        def pages(self, req_id):
            return [p + 1 for p in super().pages(req_id)]
    stream = parse_stream(features.fit(
        json.loads((STREAMS_DIR / "seed_fcfs_preempt_recompute.json").read_text()),
        TinySim.features))
    mine, reference = _traces(Plugged(PagesOff(), "pages-off"), stream)
    assert level_held(reference, mine)[0] == "prefix_hits"


def test_the_kit_refuses_a_decision_it_cannot_record():
    from examples.tiny_sim import TinySim

    class Twice(TinySim):
        name = "twice"

        def decide(self):
            d = super().decide()
            d.scheduled += d.scheduled[:1]
            return d
    stream = load_stream(STREAMS_DIR / "seed_eos_4_1_1.json")
    trace = run(Plugged(Twice(), "twice"), parse_stream(features.fit(stream.to_json(), TinySim.features)))
    assert trace.verdict == "engine_failure"
    assert "twice scheduled A twice in one step" in trace.failure["message"]


# -- levels on the command line -----------------------------------------------------------------

def test_a_level_and_fields_together_are_refused():
    with pytest.raises(LevelError, match="--fields: not with --level"):
        fields_of("tokens", "scheduled")
    with pytest.raises(LevelError, match="--level: 'pages' is not a level"):
        fields_of("pages")


def _harness(*args, cwd=ROOT):
    return subprocess.run([sys.executable, "-m", "harness", *args], capture_output=True,
                          text=True, cwd=cwd)


def test_check_keeps_counterexamples_where_asked(tmp_path):
    (tmp_path / "off_sim.py").write_text(
        "from examples.tiny_sim import TinySim\n"
        "class Off(TinySim):\n"
        "    def free_pages(self):\n        return super().free_pages() + 1\n")
    work, out = tmp_path / "work", tmp_path / "kept"
    work.mkdir()
    env = {"PYTHONPATH": f"{tmp_path}:{ROOT}", "PATH": "/usr/bin:/bin"}
    stream = str(STREAMS_DIR / "stop_eos.json")
    exact = subprocess.run([sys.executable, "-m", "harness", "check", "--engines", "off_sim:Off",
                            "--fit", "--counterexamples", str(out), stream],
                           capture_output=True, text=True, cwd=work, env=env)
    assert exact.returncode == 1, exact.stderr
    assert len(list(out.glob("*.json"))) == 1 and not (work / "counterexamples").exists()
    # free pages are compared only at the exact level: below it the same stream conforms
    tokens = subprocess.run([sys.executable, "-m", "harness", "check", "--engines", "off_sim:Off",
                             "--fit", "--level", "prefix_hits", stream],
                            capture_output=True, text=True, cwd=work, env=env)
    assert tokens.returncode == 0 and "compared: level prefix_hits" in tokens.stdout, tokens.stdout
    bad = _harness("check", "--level", "pages", stream)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "--level" in bad.stderr


# -- certificates -----------------------------------------------------------------------------

def test_a_certificate_is_the_same_bytes_twice_and_names_its_parts(tmp_path):
    from harness.jobs.certify import certify
    a, b = tmp_path / "a", tmp_path / "b"
    for folder in (a, b):
        certify(TINY, "0.11.0", streams=4, families=["whole_space", "preemption"],
                folder=folder)
    for name in ("report.json", "report.md", "badge.svg"):
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
    report = json.loads((a / "report.json").read_text())
    assert report["engine"] == "tiny-sim" and report["taken"] == report["generated"] == 8
    assert report["level_reached"] == "exact"
    assert "vLLM 0.11.0" in (a / "badge.svg").read_text()


def test_certify_refuses_a_release_the_reference_does_not_describe(tmp_path):
    p = _harness("certify", TINY, "--release", "0.10.0", "-o", str(tmp_path / "c"))
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "--release" in p.stderr
    assert not (tmp_path / "c").exists()


def _pytest(*args):
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "-p", "no:randomly", str(ROOT / "tests/test_conformance.py"), *args],
                          capture_output=True, text=True, cwd=ROOT)


@pytest.mark.slow
def test_the_conformance_suite_holds_an_engine_of_ones_own_to_a_level():
    """``pytest -k conformance --engine E --level L``: E's streams drawn inside its features,
    compared up to L (vLLM is not needed for it); a level that is none is one line, exit 2."""
    seeds = ["-k", "bundled_stream and seed_"]
    good = _pytest("--engine", TINY, "--level", "tokens", *seeds)
    assert good.returncode == 0 and "passed" in good.stdout, good.stdout[-2000:]
    bad = _pytest("--engine", TINY, "--level", "pages", *seeds)
    assert bad.returncode == 2 and "--level: 'pages' is not a level" in bad.stdout + bad.stderr
