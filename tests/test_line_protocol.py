"""The engine line protocol (harness.engines.line_protocol): an engine in another process.

The Python engine side (``python -m harness serve``) stands in for a Go or Rust
simulator: whatever it serves must give, through the pipe, exactly the traces it
gives in process; an engine process that misbehaves is reported in one line.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys

import pytest

from harness.engines import UnknownEngine, get_engine
from harness.engines.line_protocol import serve
from harness.formats.paths import DOCS_DIR, ROOT, STREAMS_DIR

PYTHON = sys.executable
EXAMPLE = "examples.simplified_pool:SimplifiedPoolEngine"

@pytest.fixture(autouse=True)
def _counterexamples_elsewhere(tmp_path, monkeypatch):
    """Divergences here are on purpose: what the commands keep goes to a temporary folder."""
    monkeypatch.setenv("HARNESS_COUNTEREXAMPLES", str(tmp_path / "counterexamples"))



def harness(*args: str, **env) -> subprocess.CompletedProcess:
    return subprocess.run([PYTHON, "-m", "harness", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=600, env={**os.environ, **env})


def test_the_reference_served_over_the_protocol_replays_every_recorded_trace():
    proc = harness("replay", "--engine", f"cmd:{PYTHON} -m harness serve reference")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    bundled = len(list(STREAMS_DIR.glob("*.json")))
    assert proc.stdout.splitlines()[-1] == f"{bundled} match, 0 do not"


@pytest.mark.slow
def test_an_engine_gives_the_same_report_through_the_pipe_as_in_process():
    """The same divergences, word for word.  The lines with an engine's own error differ:
    in process they name the engine's module and line, through ``cmd:`` the error comes
    back by name and message, raised at the pipe's end (so a failure vLLM also had, by
    the same message, is one more such line there)."""
    here = harness("replay", "--engine", EXAMPLE)
    spec = f"cmd:{PYTHON} -m harness serve {EXAMPLE}"
    there = harness("replay", "--engine", spec)
    assert here.returncode == there.returncode == 1

    def without_failure_lines(text: str) -> list[str]:
        return [line for line in text.splitlines() if " failed at step " not in line]

    assert (without_failure_lines(there.stdout.replace(spec, EXAMPLE))
            == without_failure_lines(here.stdout))
    assert "EngineProcessError" in there.stdout and "EngineProcessError" not in here.stdout


@pytest.mark.parametrize("command, says", [
    (f"{PYTHON} -c \"print('hello there')\"", "hello: the answer is not JSON: 'hello there'"),
    (f"{PYTHON} -c \"print('{{}}')\"", "hello: the answer must be an object with result or error"),
    (f"{PYTHON} -c pass", "hello: the engine process ended without answering"),
    ("/nonexistent/engine --serve", "cannot start /nonexistent/engine"),
    ("sleep 30", "hello: no answer within 1 s (HARNESS_ENGINE_TIMEOUT)"),
])
@pytest.mark.slow
def test_an_engine_process_that_does_not_answer_is_one_line_and_exit_2(command, says, tmp_path):
    out = tmp_path / "out"
    proc = harness("trace", "--engine", f"cmd:{command}", str(STREAMS_DIR / "seed_eos_4_1_1.json"),
                   "-o", str(out), HARNESS_ENGINE_TIMEOUT="1")
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and says in proc.stderr, proc.stderr
    assert not out.exists()


def test_a_bad_answer_timeout_is_one_line_and_exit_2():
    proc = harness("trace", "--engine", "cmd:cat", str(STREAMS_DIR / "seed_eos_4_1_1.json"),
                   HARNESS_ENGINE_TIMEOUT="soon")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    assert "HARNESS_ENGINE_TIMEOUT: 'soon' is not a positive number" in proc.stderr


def test_an_error_answer_mid_stream_fails_that_stream_not_the_run(tmp_path):
    """An engine that answers schedule with an error: the trace records the failure."""
    script = tmp_path / "half_engine.py"
    script.write_text(
        "import json, sys\n"
        "for line in sys.stdin:\n"
        "    call = json.loads(line)['call']\n"
        "    if call == 'hello':\n"
        "        out = {'result': {'name': 'half', 'implements': []}}\n"
        "    elif call in ('schedule',):\n"
        "        out = {'error': 'not written yet'}\n"
        "    elif call in ('num_unfinished', 'num_free_blocks'):\n"
        "        out = {'result': 1}\n"
        "    else:\n"
        "        out = {'result': None}\n"
        "    print(json.dumps(out), flush=True)\n")
    proc = harness("trace", "--engine", f"cmd:{PYTHON} {script}",
                   str(STREAMS_DIR / "seed_eos_4_1_1.json"))
    assert proc.returncode == 1, proc.stderr
    trace = json.loads(proc.stdout.splitlines()[0])
    assert trace["verdict"] == "engine_failure"
    assert "schedule: not written yet" in trace["failure"]["message"]


def test_serve_answers_a_session_line_by_line():
    stream = json.loads((STREAMS_DIR / "seed_eos_4_1_1.json").read_text())
    calls = [{"call": "hello", "protocol": 1}, {"call": "start", "stream": stream},
             {"call": "add", "req_id": "A", "arrival_index": 0}, {"call": "schedule"},
             {"call": "update", "id": 1, "sampled": {"A": [2]}, "finished_recving": [],
              "finished_sending": []},
             {"call": "state", "req_id": "A"}, {"call": "num_free_blocks"},
             {"call": "frobnicate"}]
    out = io.StringIO()
    serve(get_engine("reference"), io.StringIO("".join(json.dumps(c) + "\n" for c in calls)), out)
    answers = [json.loads(line) for line in out.getvalue().splitlines()]
    assert len(answers) == len(calls)
    hello, started, added, scheduled, updated, state, free, unknown = answers
    assert hello["result"]["protocol"] == 1 and "abort" in hello["result"]["implements"]
    assert started == added == updated == {"result": None}
    assert scheduled["result"]["id"] == 1
    assert scheduled["result"]["scheduled"] == [["A", 4]]
    assert scheduled["result"]["new_block_ids"] == {"A": [[1]]}
    assert state["result"]["status"] == "RUNNING" and state["result"]["num_computed_tokens"] == 4
    assert free == {"result": stream["config"]["num_gpu_blocks"] - 2}
    assert unknown == {"error": "ValueError: unknown call 'frobnicate'"}


def test_serve_refuses_an_engine_in_another_process():
    proc = harness("serve", "cmd:cat")
    assert proc.returncode == 2 and "not cmd:" in proc.stderr


def test_unknown_engine_names_both_ways_of_plugging_in():
    with pytest.raises(UnknownEngine, match=r"module:Class or cmd:<command>"):
        get_engine("sglang")


def test_the_documented_session_is_what_the_reference_answers():
    """docs/engine-interface.md's full session, replayed into `serve`: the same answers."""
    text = (DOCS_DIR / "engine-interface.md").read_text()
    block = text.split("<!-- session:begin -->")[1].split("<!-- session:end -->")[0]
    lines = [json.loads(x) for x in block.splitlines() if x.startswith("{")]
    calls, documented = lines[0::2], lines[1::2]
    assert [c["call"] for c in calls[:3]] == ["hello", "start", "kv_cache_header"]
    stream = json.loads((STREAMS_DIR / "seed_eos_4_1_1.json").read_text())
    calls = [{**c, "stream": stream} if c["call"] == "start" else c for c in calls]
    out = io.StringIO()
    serve(get_engine("reference"), io.StringIO("".join(json.dumps(c) + "\n" for c in calls)), out)
    assert [json.loads(x) for x in out.getvalue().splitlines()] == documented
