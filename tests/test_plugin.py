"""Engines of one's own, plugged in as ``module:Class`` (harness.engines.plugin).

A simulator or port author runs the harness against their engine: against vLLM's
recorded traces (``replay --engine``, no vLLM needed) or against the reference
(``check --engines``).  The worked example, examples/simplified_pool.py, must fail
where its two simplifications matter; the reference plugged in the same way must not.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from harness.engines import UnknownEngine, get_engine
from harness.engines.plugin import CORE, FEATURES, OBSERVING, PluginError, load_plugin
from harness.formats.paths import ROOT, STREAMS_DIR, golden_dir
from harness.formats.stream import load_stream

EXAMPLE = "examples.simplified_pool:SimplifiedPoolEngine"
REFERENCE = "harness.engines.reference_engine:ReferenceEngine"

@pytest.fixture(autouse=True)
def _counterexamples_elsewhere(tmp_path, monkeypatch):
    """Divergences here are on purpose: what the commands keep goes to a temporary folder."""
    monkeypatch.setenv("HARNESS_COUNTEREXAMPLES", str(tmp_path / "counterexamples"))



def harness(*args: str, cwd=ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=600)


@pytest.fixture
def plugin_module(tmp_path, monkeypatch):
    """A module of engines in a folder on the import path."""
    (tmp_path / "my_engines.py").write_text(textwrap.dedent('''
        from harness.engines.reference_engine import ReferenceEngine

        class NoSchedule:
            def start(self, stream): pass

        class Broken:
            def __init__(self):
                raise RuntimeError("no config file")

        class Minimal:
            """The reference behind only the seven core methods."""
            def __init__(self):
                self.inner = ReferenceEngine()
            def start(self, stream): self.inner.start(stream)
            def add(self, req, index): self.inner.add(req, index)
            def schedule(self): return self.inner.schedule()
            def update(self, *args, **kwargs): self.inner.update(*args, **kwargs)
            def state(self, req_id): return self.inner.state(req_id)
            def num_unfinished(self): return self.inner.num_unfinished()
            def num_free_blocks(self): return self.inner.num_free_blocks()

        class CrashesAtStepTwo(Minimal):
            """Minimal, but its scheduler fails at its third step."""
            def __init__(self):
                super().__init__()
                self.steps = 0
            def start(self, stream):
                self.steps = 0
                super().start(stream)
            def schedule(self):
                self.steps += 1
                if self.steps == 3:
                    raise IndexError("block table ran out")
                return super().schedule()
    '''))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "my_engines"
    sys.modules.pop("my_engines", None)


@pytest.mark.parametrize("spec, says", [
    ("no_such_module_xyz:Engine", "cannot import no_such_module_xyz"),
    ("examples.simplified_pool:Nope", "examples.simplified_pool has no class Nope"),
    ("examples.simplified_pool:", "must be module:Class"),
    (":Engine", "must be module:Class"),
])
def test_a_plugin_that_does_not_load_says_why_in_one_line(spec, says):
    with pytest.raises(PluginError, match=says) as caught:
        load_plugin(spec)
    assert str(caught.value).startswith(f"--engine {spec}: ") and "\n" not in str(caught.value)


def test_an_engine_without_the_core_methods_is_refused(plugin_module):
    with pytest.raises(PluginError, match="NoSchedule lacks add, schedule, update, state"):
        load_plugin(f"{plugin_module}:NoSchedule")
    with pytest.raises(PluginError, match=r"Broken\(\) raised RuntimeError: no config file"):
        load_plugin(f"{plugin_module}:Broken")


def test_get_engine_turns_a_plugin_error_into_an_unknown_engine():
    with pytest.raises(UnknownEngine, match="cannot import"):
        get_engine("no_such_module_xyz:Engine")


def test_a_missing_feature_method_refuses_exactly_the_streams_that_need_it(plugin_module):
    engine = load_plugin(f"{plugin_module}:Minimal")
    assert engine.lacks == tuple(FEATURES)
    taken = refused = 0
    for path in sorted(STREAMS_DIR.glob("*.json")):
        stream = load_stream(path)
        needs = [m for m, (_, needed) in FEATURES.items()
                 if needed(stream) and m not in OBSERVING]
        why = engine.refuses(stream)
        if needs:
            refused += 1
            assert why is not None and f"no {needs[0]}()" in why, (path.name, why)
        else:
            taken += 1
            assert why is None, (path.name, why)
    assert taken and refused


def test_the_core_methods_alone_replay_vllms_traces_of_the_streams_they_take(plugin_module):
    """Seven methods and the defaults (has_requests from num_unfinished) match vLLM on
    every recorded trace whose stream needs nothing more, except where vLLM still has
    finished requests to report (has_requests counts them)."""
    from harness.checks.golden import NotTaken, replay_one  # in-process: the module is in tmp_path
    matched = 0
    for path in sorted(golden_dir("0.11.0").glob("*.json")):
        try:
            d, _, _ = replay_one(path, engine=f"{plugin_module}:Minimal")
        except NotTaken:
            continue
        matched += d is None
    assert matched >= 10


def test_replay_says_why_an_engine_failed_and_where(plugin_module, tmp_path, capsys):
    """A simulator that crashes is told its own message and site, not only that its trace
    ended early."""
    from harness.checks.golden import replay
    folder = tmp_path / "traces"
    folder.mkdir()
    source = golden_dir("0.11.0") / "seed_eos_4_1_1.json"
    (folder / source.name).write_text(source.read_text())
    assert replay(folder, engine=f"{plugin_module}:CrashesAtStepTwo") == 1
    out = capsys.readouterr().out
    assert ("  my_engines:CrashesAtStepTwo failed at step 2: IndexError: block table ran out "
            "(my_engines.py:") in out


def test_the_reference_plugged_in_replays_every_recorded_trace():
    proc = harness("replay", "--engine", REFERENCE)
    assert proc.returncode == 0, proc.stdout[-2000:]
    total = len(list(golden_dir("0.11.0").glob("*.json")))
    assert proc.stdout.splitlines()[-1] == f"{total} match, 0 do not"


def test_the_example_engine_diverges_on_every_stream_it_takes():
    proc = harness("replay", "--engine", EXAMPLE)
    assert proc.returncode == 1
    paths = sorted(golden_dir("0.11.0").glob("*.json"))
    hybrid = [p for p in paths
              if json.loads(p.read_text())["stream"]["config"].get("kv_cache_groups")
              not in (None, [{"type": "full"}])]
    assert hybrid
    assert proc.stdout.splitlines()[-1] == (
        f"0 match, {len(paths) - len(hybrid)} do not, {len(hybrid)} not taken by {EXAMPLE}")
    # The worked example of the README (4 prompt tokens, two outputs, EOS) differs at
    # once: its first page is 0, not 1.
    first = next(line for line in proc.stdout.splitlines() if line.startswith("seed_eos_4_1_1.json"))
    assert "DIVERGENCE at step 0, field 'new_block_ids'" in first


def test_check_compares_a_plugin_with_the_reference_without_vllm(tmp_path):
    stream = str(STREAMS_DIR / "seed_eos_4_1_1.json")
    same = harness("check", "--engines", REFERENCE, stream)
    assert same.returncode == 0, same.stdout + same.stderr
    differs = harness("check", "--engines", EXAMPLE, stream)
    assert differs.returncode == 1 and "1 different" in differs.stdout.splitlines()[-1]


def test_trace_with_a_plugin_that_does_not_load_writes_nothing(tmp_path):
    out = tmp_path / "out"
    proc = harness("trace", "--engine", "examples.nope:Engine", str(STREAMS_DIR / "seed_eos_4_1_1.json"),
                   "-o", str(out))
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "cannot import examples.nope" in proc.stderr
    assert not out.exists()


def test_core_methods_are_the_ones_the_step_loop_always_calls():
    assert CORE == ("start", "add", "schedule", "update", "state", "num_unfinished",
                    "num_free_blocks")


@pytest.mark.slow
@pytest.mark.needs_vllm
@pytest.mark.parametrize("engine, code", [(EXAMPLE, 1), (REFERENCE, 0)])
def test_pytest_engine_option_holds_a_plugin_to_the_reference(engine, code, tmp_path):
    """`pytest -k conformance --engine E`: the conformance suite with E in vLLM's place
    (profile fast: what is checked is the option's wiring, not the number of streams)."""
    import os
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "tests/test_conformance.py", "-k", "seed_eos_4_1_1 or stops_and_aborts",
                           "--engine", engine, "--hypothesis-profile", "fast"], cwd=ROOT,
                          capture_output=True, text=True, timeout=600, env={**os.environ, "CI": "true",
                                            "HARNESS_COUNTEREXAMPLES": str(tmp_path)})
    assert proc.returncode == code, proc.stdout[-2000:]
