"""The examples in the docs are valid streams and traces, and every example block of
README.md and docs/*.md is executed or validated (the last section below)."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from harness.formats.paths import DOCS_DIR, ROOT
from harness.formats.stream import parse_stream
from harness.formats.trace import OPTIONAL_STEP_FIELDS, STEP_FIELDS, optional_fields


# ---------------------------------------------------------------------------
# The examples in the docs are valid
# ---------------------------------------------------------------------------


def _json_blocks_after(doc: Path, heading: str) -> list:
    """The ```json code blocks of ``doc`` that come after ``heading``, parsed."""
    text = doc.read_text().split(heading, 1)[1]
    return [json.loads(block.split("```", 1)[0]) for block in text.split("```json\n")[1:]]


def test_stream_format_examples_are_valid():
    examples = _json_blocks_after(DOCS_DIR / "stream-format.md", "\n## Example\n")
    assert len(examples) == 2
    for data in examples:
        parse_stream(data)


def test_trace_format_example_matches_its_stream():
    stream_data, trace = _json_blocks_after(DOCS_DIR / "trace-format.md", "\n## Example\n")
    s = parse_stream(stream_data)
    assert trace["stream"] == s.to_json()
    assert trace["stream_sha256"] == s.sha256()
    assert [step["step"] for step in trace["steps"]] == list(range(len(trace["steps"])))
    for step in trace["steps"]:
        assert set(step) == {"step", *STEP_FIELDS} - OPTIONAL_STEP_FIELDS | optional_fields(s)


def _bounds(node, path=""):
    """(path, bound) for every maximum / maxItems / maxLength in the schema."""
    if isinstance(node, dict):
        for key in ("maximum", "maxItems", "maxLength"):
            if key in node:
                yield path, node[key]
        for k, v in node.items():
            if k not in ("x-messages",):
                yield from _bounds(v, f"{path}.{k}")
    elif isinstance(node, list):
        for v in node:
            yield from _bounds(v, path)


def test_bounds_table_lists_every_schema_bound():
    from harness.formats.stream_schema import schema
    doc = (DOCS_DIR / "stream-format.md").read_text().split("## Bounds", 1)[1].split("\n## ", 1)[0]
    for path, bound in _bounds(schema()):
        assert f"{bound:,}" in doc, f"{path}: bound {bound:,} is not in docs/stream-format.md"


# ---------------------------------------------------------------------------
# The router example (docs/examples/kv_index.py) on vLLM's recorded traces
# ---------------------------------------------------------------------------


def _kv_index():
    import importlib.util
    spec = importlib.util.spec_from_file_location("kv_index", DOCS_DIR / "examples" / "kv_index.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _recorded_event_traces() -> list[dict]:
    from harness.formats.paths import TRACES_DIR
    traces = [json.loads(p.read_text()) for p in sorted(TRACES_DIR.glob("vllm-*/*.json"))]
    return [t for t in traces if t["stream"]["config"].get("kv_cache_events")]


def test_router_example_explains_every_recorded_hit():
    traces = _recorded_event_traces()
    assert len(traces) >= 15  # three streams, five releases
    hits = 0
    for t in traces:
        assert _kv_index().unexplained_hits(t) == []
        hits += sum(bool(n) for s in t["steps"] for n in s["prefix_hit_tokens"].values())
    assert hits > 0


def test_router_example_flags_a_hit_on_a_page_never_announced():
    trace = next(t for t in _recorded_event_traces()
                 if any(n for s in t["steps"] for n in s["prefix_hit_tokens"].values()))
    for step in trace["steps"]:
        step["kv_events"] = [e for e in step["kv_events"] if e["type"] != "BlockStored"]
    assert _kv_index().unexplained_hits(trace)


# ===========================================================================
# EVERY EXAMPLE BLOCK OF README.md AND docs/*.md IS EXECUTED OR VALIDATED
#
# Each fenced block of README.md and docs/*.md (not docs/upgrades/: generated
# reports, not examples) is one of:
#
# * ```json: a stream (parse_stream), a trace (its stream parses), or a sketch
#   or fragment listed in JSON_NOT_STREAMS with how it is checked instead;
# * ```jsonl: every line is JSON (the engine-interface session, replayed call
#   by call by tests/test_line_protocol.py);
# * ```python: written where its first-line comment says and loaded as an engine;
# * commands: a ```sh or ```console block, or a plain one whose first line is
#   a command or `$ command`.  Every command is in exactly one of
#   RUN (run as written, cheap, no vLLM: its exit code is checked),
#   AS_REFERENCE (needs vLLM: run with `--engine reference`, and the output shown
#   below it in the doc must be the reference's but for the engine's name), or
#   NOT_RUN (a pattern and the reason: minutes of work, an install, a
#   placeholder for the reader's own files).  A command in none of them fails
#   test_every_doc_block_is_known: add it to one, with its reason;
# * output: a plain block that is not commands (shown results; the trace
#   format's step lines are compared with the reference's run below);
# * ```diff: a suggested patch to vLLM (docs/findings.md), applied to vLLM 0.34.0's
#   files by tests/test_findings.py, which runs the finding's reproduction on them.
#
# The commands run here take about ten seconds in all.
# ===========================================================================

DOC_PAGES = [ROOT / "README.md", *sorted(DOCS_DIR.glob("*.md"))]

#: Commands run as written from the repository root (cheap, no vLLM): their exit code.
RUN = {
    ".venv/bin/python -m harness table fixtures/streams/seed_eos_4_1_1.json --engine reference": 0,
    ".venv/bin/python -m harness --help": 0,
    ".venv/bin/python -m harness check --help": 0,
    ".venv/bin/python -m harness --version": 0,
    # the worked example breaks two of vLLM's rules on purpose: every trace differs
    ".venv/bin/python -m harness replay --engine examples.simplified_pool:SimplifiedPoolEngine": 1,
    '.venv/bin/python -m harness replay --engine "cmd:.venv/bin/python -m harness serve reference"': 0,
}

#: Commands that need vLLM (about 7 s each, most of it importing vLLM), run with
#: `--engine reference` instead: the doc's output must be the reference's, the
#: engine's name in the header aside.
AS_REFERENCE = {
    ".venv/bin/python -m harness table fixtures/streams/seed_eos_4_1_1.json",
    ".venv/bin/python -m harness table fixtures/streams/hybrid_full_and_two_windows_hit.json",
}

#: Commands not run, by pattern (first match wins), with the reason.
NOT_RUN = [
    (r"my_sim|my-sim|my_stream|my-streams/|<file>",
     "names the reader's own engine or files (the worked engine and streams are run instead)"),
    (r"cp docs/ci/upgrade-watch\.yml",
     "copies the scheduled workflow into the reader's own repository"),
    (r"^make install$|pip install",
     "installs ~10 GB of packages (vLLM, torch)"),
    (r"upgrade-check",
     "downloads a vLLM release into a side environment and runs for minutes"),
    (r"^make (test|test-fast)$|pytest",
     "the test suite itself (1 to 18 minutes)"),
    (r"^make conformance$",
     "the main job: vLLM on every bundled stream and a campaign (minutes)"),
    (r"^make (fuzz|soak|coverage|dashboard)$|harness fuzz|^ray start",
     "a campaign of minutes to hours, a Ray cluster, or a dashboard that runs until stopped"),
    (r"harness profile",
     "50 streams per family of rules through the engine and the reference (about 3 minutes)"),
    (r"harness (certify|compliance)|^make certify|\.venvs/sim-",
     "certificates: every family through the engine and the reference, each simulator in "
     "its side environment (minutes; make certify makes them); tests/test_simulators.py "
     "certifies the example engine"),
    (r"mutants",
     "the kill tables: every mutant against the ci profile and the main job (about 25 minutes)"),
    (r"harness reach",
     "the rule report: the ci profile's streams under every mutant (8 minutes and more)"),
    (r"bench",
     "the benchmark: 35 s to 3 minutes, matplotlib for the plot"),
    (r"harness check mc/",
     "needs the folder the import before it writes, and vLLM on 30 streams (about 40 s); "
     "such windows are checked by the real_workloads property"),
    (r"docs/findings/",
     "a vLLM finding's reproduction (half a minute; the newest ones in vLLM 0.34.0's overlay, "
     "make newest-env): run by tests/test_findings.py, which checks the output line shown"),
    (r"^echo \$\?$",
     "shows the exit status of the command above it (a finding's reproduction)"),
    (r"harness (import|workload)",
     "the synopsis, or docs/workloads.md's example: rerun into a temporary folder and its "
     "output compared with the page by tests/test_workloads.py::test_docs_example_is_real"),
]

#: JSON blocks that are not whole streams or traces, by their first line, and how
#: each is checked instead.
JSON_NOT_STREAMS = {
    '{': "the sketch of a stream's top level: its keys are the schema's, its values placeholders",
    '"kv_cache_groups": [{"type": "full"}, {"type": "sliding_window", "sliding_window": 8}]':
        "a config field: a stream with it in its config parses",
}

_FENCE = re.compile(r"^( *)```(\S*)\s*$")
_COMMAND = re.compile(r"^(\$ |make |python|\.venv/bin/|pytest |[A-Z_]+=\S* |ray )")


def _blocks(page: Path):
    """(line, lang, text) of every fenced block, indentation removed."""
    lines = page.read_text().splitlines()
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, lang = len(m.group(1)), m.group(2)
        j = i + 1
        while not re.match(r"^ *```\s*$", lines[j]):
            j += 1
        yield i + 1, lang, "\n".join(line[indent:] for line in lines[i + 1:j])
        i = j + 1


def _kind(lang: str, text: str) -> str:
    if lang in ("sh", "console", "bash", "shell"):
        return "commands"
    if lang:
        return lang
    return "commands" if _COMMAND.match(text.lstrip("\n")) else "output"


def _commands(text: str) -> list[tuple[str, str]]:
    """(command, the output shown after it) of a commands block; comments dropped."""
    out: list[tuple[str, str]] = []
    prompted = text.lstrip("\n").startswith("$ ")
    for line in text.splitlines():
        if prompted and not line.startswith("$ "):
            if out:
                out[-1] = (out[-1][0], out[-1][1] + line + "\n")
            continue
        command = re.sub(r"\s+#\s.*$", "", line.removeprefix("$ ")).strip()
        if command and not command.startswith("#"):
            out.append((command, ""))
    return out


def _all_blocks() -> list[tuple[str, str, str]]:
    return [(f"{page.relative_to(ROOT)}:{line}", _kind(lang, text), text)
            for page in DOC_PAGES for line, lang, text in _blocks(page)]


def _doc_commands() -> list[tuple[str, str, str]]:
    return [(where, command, shown) for where, kind, text in _all_blocks() if kind == "commands"
            for command, shown in _commands(text)]


def _not_run_reason(command: str) -> str | None:
    return next((why for pattern, why in NOT_RUN if re.search(pattern, command)), None)


def test_every_doc_block_is_known():
    unknown = []
    for where, kind, text in _all_blocks():
        if kind == "commands":
            for command, _ in _commands(text):
                if command not in RUN and command not in AS_REFERENCE and not _not_run_reason(command):
                    unknown.append(f"{where}: command {command!r}: add it to RUN, AS_REFERENCE "
                                   "or NOT_RUN (with the reason) in tests/test_docs_examples.py")
        elif kind not in ("json", "jsonl", "python", "output", "diff"):
            unknown.append(f"{where}: a ```{kind} block: say how it is checked")
    assert unknown == []


def test_the_commands_run_here_are_still_in_the_docs():
    shown = {command for _, command, _ in _doc_commands()}
    assert set(RUN) | AS_REFERENCE <= shown
    assert not any(_not_run_reason(c) for c in [*RUN, *AS_REFERENCE])


def _run(command: str, tmp_path: Path) -> subprocess.CompletedProcess:
    """``command`` from the repository root, with this interpreter as `.venv/bin/python`."""
    assert command.startswith(".venv/bin/python "), command
    argv = shlex.split(command.replace(".venv/bin/python", shlex.quote(sys.executable)))
    env = {**os.environ, "HARNESS_COUNTEREXAMPLES": str(tmp_path / "counterexamples")}
    return subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("command", sorted(RUN))
def test_doc_command_runs(command, tmp_path):
    proc = _run(command, tmp_path)
    assert proc.returncode == RUN[command], proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("command", sorted(AS_REFERENCE))
def test_doc_output_is_the_references(command, tmp_path):
    shown = [s for _, c, s in _doc_commands() if c == command]
    assert shown and all(shown), f"{command}: no output shown after it"
    proc = _run(f"{command} --engine reference", tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    for text in shown:
        head, _, body = text.partition("\n")
        assert head.startswith("vllm (vLLM ")
        assert proc.stdout == "reference" + head.removeprefix("vllm") + "\n" + body


def _json_blocks() -> list[tuple[str, str]]:
    return [(where, text) for where, kind, text in _all_blocks() if kind == "json"]


@pytest.mark.parametrize("where,text", _json_blocks(), ids=[w for w, _ in _json_blocks()])
def test_doc_json_block_is_valid(where, text):
    from harness.formats.stream_schema import schema
    first = text.splitlines()[0].strip()
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        assert first in JSON_NOT_STREAMS, f"{where}: not JSON and not listed in JSON_NOT_STREAMS"
        data = json.loads("{" + text + "}")
        stream = {"config": data, "requests": [{"id": "a", "prompt": [1, 2, 3], "output": [4]}]}
        parse_stream(stream)
        return
    if "steps" in data:                                   # a trace
        s = parse_stream(data["stream"])
        assert data["stream"] == s.to_json() and data["stream_sha256"] == s.sha256()
    elif isinstance(data.get("config"), dict) and "..." in data["config"]:   # the sketch
        assert first in JSON_NOT_STREAMS
        assert set(data) == set(schema()["properties"])
    else:
        parse_stream(data)


def test_doc_jsonl_blocks_are_json_lines():
    blocks = [(w, t) for w, kind, t in _all_blocks() if kind == "jsonl"]
    assert blocks
    for where, text in blocks:
        for line in text.splitlines():
            json.loads(line)


def test_doc_python_blocks_load_as_engines(tmp_path, monkeypatch):
    from harness.engines.plugin import CORE, load_plugin
    blocks = [(w, t) for w, kind, t in _all_blocks() if kind == "python"]
    assert blocks
    for where, text in blocks:
        m = re.match(r"# (\w+)/(\w+)\.py\n", text)
        assert m, f"{where}: a Python example starts with the path it is written to"
        (tmp_path / m.group(1)).mkdir()
        (tmp_path / m.group(1) / f"{m.group(2)}.py").write_text(text)
        monkeypatch.syspath_prepend(str(tmp_path))
        cls = re.search(r"^class (\w+)", text, re.M).group(1)
        try:
            load_plugin(f"{m.group(1)}.{m.group(2)}:{cls}")
        finally:
            for name in [n for n in sys.modules if n.split(".")[0] == m.group(1)]:
                del sys.modules[name]
        assert all(f"def {call}(" in text for call in CORE)


def test_trace_format_examples_are_the_references_run():
    """The trace of trace-format.md's example and the step lines of stream-format.md's
    are what the reference gives (and vLLM, which the recorded traces hold to it)."""
    from harness.engines import get_engine
    from harness.loop.runner import run
    stream_data, trace = _json_blocks_after(DOCS_DIR / "trace-format.md", "\n## Example\n")
    assert run(get_engine("reference"), parse_stream(stream_data)).to_json()["steps"] == trace["steps"]
    shared_prefix = _json_blocks_after(DOCS_DIR / "stream-format.md", "\n## Example\n")[0]
    lines = (DOCS_DIR / "trace-format.md").read_text().split("one line per step:\n\n```\n", 1)[1]
    steps = [json.loads(line) for line in lines.split("```", 1)[0].splitlines()]
    assert run(get_engine("reference"), parse_stream(shared_prefix)).to_json()["steps"] == steps
