"""Streams kept for replay: the ones that diverged or made an engine fail.

A kept stream is the canonical stream JSON (defaults made explicit), so
``python -m harness check <file>`` replays it exactly.
"""

from __future__ import annotations

from pathlib import Path

from harness.formats.paths import counterexamples_dir, write_json
from harness.formats.stream import Stream


def save(stream: Stream, label: str, folder: Path | None = None) -> Path:
    """Write ``stream`` to ``folder/<label>.json`` (a later save under the same label wins)."""
    path = (folder or counterexamples_dir()) / f"{label}.json"
    write_json(path, stream.to_json())
    return path


def unique_label(stream: Stream, tag: str) -> str:
    """A label that names the stream, why it was kept, and its content."""
    return f"{stream.name or 'stream'}-{tag}-{stream.sha256()[:10]}"
