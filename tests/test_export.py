"""``harness export``: a fixture set others consume without our code.

It must validate against the schemas it ships, replay against the reference in a
process where vLLM cannot be imported, come out byte for byte the same twice, and
refuse bad input without writing anything.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
from referencing import Registry, Resource

from harness.formats.paths import ROOT, STREAM_SCHEMA, STREAMS_DIR, TRACES_DIR

pytestmark = [pytest.mark.xdist_group("export"), pytest.mark.slow]

@pytest.fixture(autouse=True)
def _counterexamples_elsewhere(tmp_path, monkeypatch):
    """Divergences here are on purpose: what the commands keep goes to a temporary folder."""
    monkeypatch.setenv("HARNESS_COUNTEREXAMPLES", str(tmp_path / "counterexamples"))



def harness(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=900)


def validators(schemas: Path):
    stream = json.loads((schemas / "stream.schema.json").read_text())
    trace = json.loads((schemas / "trace.schema.json").read_text())
    registry = Registry().with_resource(stream["$id"], Resource.from_contents(stream))
    check = jsonschema.FormatChecker()
    return (jsonschema.Draft202012Validator(stream, format_checker=check),
            jsonschema.Draft202012Validator(trace, registry=registry, format_checker=check))


@pytest.fixture(scope="module")
def exported(tmp_path_factory, vllm_engine):
    out = tmp_path_factory.mktemp("export") / "vllm-0.11.0"
    proc = harness("export", "--vllm", "0.11.0", "-o", str(out), "--generated", "6", "--seed", "3")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


def test_the_set_validates_against_its_own_schemas(exported):
    stream_v, trace_v = validators(exported / "schemas")
    manifest = json.loads((exported / "manifest.json").read_text())
    bundled = len(list(STREAMS_DIR.glob("*.json")))
    assert len(manifest["streams"]) == bundled + 6
    assert [e["source"] for e in manifest["streams"]].count("generated") == 6
    for entry in manifest["streams"]:
        stream = json.loads((exported / "streams" / f"{entry['name']}.json").read_text())
        trace = json.loads((exported / "traces" / f"{entry['name']}.json").read_text())
        stream_v.validate(stream)
        trace_v.validate(trace)
        assert trace["_info"]["stream_sha256"] == entry["stream_sha256"] == trace["stream_sha256"]
        assert (len(trace["steps"]), trace["verdict"]) == (entry["steps"], entry["verdict"])
    assert "vLLM 0.11.0" in (exported / "README.md").read_text()


def test_the_set_replays_against_the_reference_without_vllm(exported):
    code = ("import sys; sys.modules['vllm'] = None; sys.modules['torch'] = None\n"
            "from harness.cli import main\n"
            f"sys.exit(main(['replay', {str(exported / 'traces')!r}]))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)
    total = len(list((exported / "traces").glob("*.json")))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert proc.stdout.splitlines()[-1] == f"{total} match, 0 do not"


def test_the_same_export_twice_is_the_same_bytes(exported, tmp_path):
    again = tmp_path / "again"
    assert harness("export", "--vllm", "0.11.0", "-o", str(again), "--generated", "6",
                   "--seed", "3").returncode == 0
    for sub in ("streams", "traces", "schemas"):
        mine = {p.name: p.read_bytes() for p in (exported / sub).iterdir()}
        theirs = {p.name: p.read_bytes() for p in (again / sub).iterdir()}
        assert mine == theirs, sub


def test_the_trace_schema_holds_every_recorded_trace_and_can_fail():
    _, trace_v = validators(STREAM_SCHEMA.parent)
    paths = sorted(TRACES_DIR.glob("*/*.json"))
    for path in paths:
        trace_v.validate(json.loads(path.read_text()))
    trace = json.loads(paths[0].read_text())
    del trace["steps"][0]["status"]
    assert not trace_v.is_valid(trace)
    trace = json.loads(paths[0].read_text())
    trace["steps"][0]["block_ids"] = {}
    assert not trace_v.is_valid(trace)


@pytest.mark.parametrize("args, says", [
    (["--vllm", "0.99.0"], "--vllm 0.99.0: the installed vLLM is"),
    (["--vllm", "latest"], "--vllm: 'latest' is not a release number"),
    (["--vllm", "0.11.0", "--generated", "-1"], "--generated"),
])
def test_export_bad_input_is_one_line_and_writes_nothing(args, says, tmp_path):
    out = tmp_path / "set"
    proc = harness("export", "-o", str(out), *args)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and says in proc.stderr
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_export_refuses_a_folder_that_holds_something(tmp_path):
    (tmp_path / "keep.txt").write_text("mine")
    proc = harness("export", "--vllm", "0.11.0", "-o", str(tmp_path), "--generated", "0")
    assert proc.returncode == 2 and "is not an empty folder" in proc.stderr
    assert [p.name for p in tmp_path.iterdir()] == ["keep.txt"]
