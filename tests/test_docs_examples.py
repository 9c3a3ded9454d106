"""The examples in the docs are valid streams and traces."""

from __future__ import annotations

import json
from pathlib import Path

from harness.paths import DOCS_DIR
from harness.stream import parse_stream
from harness.trace import OPTIONAL_STEP_FIELDS, STEP_FIELDS, optional_fields


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
    from harness.stream import schema
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
    from harness.paths import TRACES_DIR
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
