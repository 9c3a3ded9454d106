"""The seed table's KB figures: a vLLM run's come from vLLM, a reference run's from the reference.

vLLM's page size is patched (``FullAttentionSpec.page_size_bytes``, reached through
``harness.engines.vllm_kv_sizing``): the vLLM run's table follows it, the
reference run's does not.  A reference mutant with a wrong head count changes the
reference run's table only.
"""

from __future__ import annotations

import re

import pytest

from harness.engines import get_engine
from harness.checks.mutants import find
from harness.formats.paths import STREAMS_DIR
from harness.loop.runner import run
from harness.formats.stream import load_stream
from harness.checks.seed_table import render

pytestmark = pytest.mark.needs_vllm

SEED = STREAMS_DIR / "seed_eos_4_1_1.json"
SEED_HEADER = "model qwen2.5-0.5b: 12 KB per token, 192 KB per 16-token page"


@pytest.fixture(scope="module")
def traces(vllm_engine):
    stream = load_stream(SEED)
    return {"vllm": run(vllm_engine, stream).to_json(),
            "reference": run(get_engine("reference"), stream).to_json()}


def kv_columns(table: str) -> list[tuple[str, str]]:
    """(KV before, KV after) of every row of a table."""
    rows = [re.split(r"\s{2,}", line) for line in table.splitlines()[2:-1]]
    return [(r[3], r[5]) for r in rows]


def test_both_tables_show_the_seed_numbers(traces):
    for engine, trace in traces.items():
        table = render(trace)
        assert table.splitlines()[0].endswith(SEED_HEADER), engine
        assert kv_columns(table) == [("0 KB", "48 KB"), ("48 KB", "60 KB"), ("60 KB", "72 KB")]


def test_vllm_table_follows_vllms_page_size(traces, monkeypatch):
    from harness.engines import vllm_kv_sizing
    spec = vllm_kv_sizing.kvi.FullAttentionSpec
    real = spec.page_size_bytes
    reference_before = render(traces["reference"])

    monkeypatch.setattr(spec, "page_size_bytes", property(lambda self: 3 * real.fget(self)))
    vllm_table = render(traces["vllm"])
    assert vllm_table.splitlines()[0].endswith(
        "model qwen2.5-0.5b: 36 KB per token, 576 KB per 16-token page")
    assert kv_columns(vllm_table) == [("0 KB", "144 KB"), ("144 KB", "180 KB"),
                                      ("180 KB", "216 KB")]
    assert render(traces["reference"]) == reference_before

    monkeypatch.undo()  # nothing of the patched size is kept
    assert render(traces["vllm"]).splitlines()[0].endswith(SEED_HEADER)


def test_reference_mutant_changes_only_the_reference_table(traces):
    """The issue's case: 14 KV heads instead of 2 in the reference (84 KB per token)."""
    with find("kv_heads_from_attention_heads").patch():
        reference_table = render(traces["reference"])
        vllm_table = render(traces["vllm"])
    assert reference_table.splitlines()[0].endswith(
        "model qwen2.5-0.5b: 84 KB per token, 1344 KB per 16-token page")
    assert vllm_table.splitlines()[0].endswith(SEED_HEADER)
