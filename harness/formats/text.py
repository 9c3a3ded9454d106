"""Plain-text output shared by the reports: aligned Markdown tables.

Imports nothing of the harness (layer 0).
"""

from __future__ import annotations

from typing import Sequence


def markdown_table(rows: Sequence[Sequence[str]]) -> str:
    """``rows`` (the first is the header) as a Markdown table with aligned columns."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["| " + " | ".join(c.ljust(w) for c, w in zip(row, widths)) + " |" for row in rows]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)
