"""The KV slot runs a step record holds, read a page at a time (``steps.slot_runs`` and
the engines' tables), are the runs of the slots read one by one."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.engines.reference_engine import WorkerTable
from harness.formats.steps import page_span, slot_ranges, slot_runs, table_slot_runs
from reference.slot_mapping import WorkerBlockTable

WIDTH = 12


@st.composite
def tables(draw):
    """A block size, the rows written (some rewritten shorter, as vLLM's rows are), and a
    request's tokens: a row, a first position and a count that fit in the row."""
    block_size = draw(st.sampled_from([1, 2, 3, 16]))
    writes = draw(st.lists(st.tuples(st.integers(0, 3), st.booleans(),
                                     st.lists(st.integers(0, 500), max_size=WIDTH // 2)),
                           max_size=6))
    row = draw(st.integers(0, 3))
    first = draw(st.integers(0, WIDTH * block_size - 1))
    count = draw(st.integers(0, WIDTH * block_size - first))
    return block_size, writes, row, first, count


def written(table, writes):
    """``table`` with the writes made, but for appends past a row's width."""
    lengths: dict[int, int] = {}
    for row, whole, pages in writes:
        start = 0 if whole else lengths.get(row, 0)
        if start + len(pages) <= WIDTH:
            (table.add_row if whole else table.append_row)(pages, row)
            lengths[row] = start + len(pages)
    return table


@given(tables())
@settings(max_examples=300, deadline=None)
def test_the_reference_tables_runs_are_the_runs_of_its_slots(case):
    block_size, writes, row, first, count = case
    by_slot = written(WorkerBlockTable(block_size, WIDTH), writes)
    by_page = written(WorkerTable(block_size, WIDTH), writes)
    assert by_page.slot_runs(row, first, count) == slot_ranges(by_slot.slots(row, first, count))
    assert table_slot_runs(by_slot, row, first, count) == slot_ranges(
        by_slot.slots(row, first, count))


@given(pages=st.lists(st.integers(0, 50), min_size=1, max_size=8),
       block_size=st.sampled_from([1, 2, 4]), data=st.data())
@settings(max_examples=200, deadline=None)
def test_slot_runs_merge_consecutive_pages(pages, block_size, data):
    first = data.draw(st.integers(0, len(pages) * block_size - 1))
    count = data.draw(st.integers(1, len(pages) * block_size - first))
    slots = [pages[p // block_size] * block_size + p % block_size
             for p in range(first, first + count)]
    touched = pages[page_span(first, count, block_size)]
    assert slot_runs(touched, block_size, first, count) == slot_ranges(slots)


def test_a_position_past_the_row_raises_index_error():
    table = WorkerTable(4, 2)
    table.add_row([3, 5], 0)
    assert table.slot_runs(0, 6, 2) == [[22, 24]]
    with pytest.raises(IndexError):
        table.slot_runs(0, 6, 3)
    with pytest.raises(IndexError):
        table.slot_runs(0, 8, 1)
    with pytest.raises(IndexError):
        slot_runs([3], 4, 2, 4)


@pytest.mark.needs_vllm
@given(tables())
@settings(max_examples=150, deadline=None)
def test_the_vllm_tables_runs_are_the_runs_of_its_slots(case):
    from harness.engines import vllm_compat as compat
    block_size, writes, row, first, count = case
    table = written(compat.cpu_block_table(block_size, 4, WIDTH, WIDTH * 16), writes)
    assert compat.worker_slot_runs(table, row, first, count) == slot_ranges(
        compat.worker_slots(table, row, first, count))
    assert compat.worker_slot_runs(table, row, first, count, verify=True) == slot_ranges(
        compat.worker_slots(table, row, first, count))
