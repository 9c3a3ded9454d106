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
