"""The worker's view: which KV slot each newly computed token is written to.

Mirrors: vllm/v1/worker/block_table.py (BlockTable.add_row, append_row,
compute_slot_mapping).  vllm/v1/worker/gpu_model_runner.py feeds it from each
SchedulerOutput: a new or resumed request's whole table with ``add_row``, a
running request's new pages with ``append_row``.

Slot of token position ``p`` = ``table[p // block_size] * block_size +
p % block_size``.  Rows are fixed-size and never cleared: a row that is
rewritten keeps older entries past its new length, as vLLM's do.
"""

from __future__ import annotations


class WorkerBlockTable:
    def __init__(self, block_size: int, max_blocks_per_request: int):
        self.block_size = block_size
        self.width = max_blocks_per_request
        self.rows: dict[int, list[int]] = {}
        self.lengths: dict[int, int] = {}

    def _row(self, row: int) -> list[int]:
        return self.rows.setdefault(row, [0] * self.width)

    def add_row(self, block_ids: list[int], row: int) -> None:
        """A new or resumed request: its table is written from the start."""
        self.lengths[row] = 0
        self.append_row(block_ids, row)

    def append_row(self, block_ids: list[int], row: int) -> None:
        start = self.lengths.get(row, 0)
        self._row(row)[start:start + len(block_ids)] = block_ids
        self.lengths[row] = start + len(block_ids)

    def slots(self, row: int, first_position: int, num_tokens: int) -> list[int]:
        table = self._row(row)
        return [self.slot_of(table, p) for p in range(first_position, first_position + num_tokens)]

    def slot_of(self, table: list[int], position: int) -> int:
        """The page's first slot plus the position's offset inside the page."""
        return table[position // self.block_size] * self.block_size + position % self.block_size
