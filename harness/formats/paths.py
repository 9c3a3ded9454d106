"""Where the harness reads and writes, and how it writes.

The bottom layer of ``harness/``: it imports nothing of the harness.  Every
other module takes its folders from here and writes files only through
:func:`write_atomic` (or :func:`write_json`), so that a reader never sees a
half-written file.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

_PACKAGE = Path(__file__).resolve().parent.parent  # harness/
ROOT = _PACKAGE.parent
# A source tree has fixtures/ at its top; an installed wheel has them in the package.
FIXTURES_DIR = ROOT / "fixtures" if (ROOT / "fixtures").is_dir() else _PACKAGE / "fixtures"
MODELS_DIR = FIXTURES_DIR / "models"
STREAMS_DIR = FIXTURES_DIR / "streams"
TRACES_DIR = FIXTURES_DIR / "traces"
WORKLOADS_DIR = FIXTURES_DIR / "workloads"
DOCS_DIR = ROOT / "docs"
STREAM_SCHEMA = _PACKAGE / "formats" / "schemas" / "stream.schema.json"



def counterexamples_dir() -> Path:
    """Where streams that diverged or made an engine fail are kept for replay:
    ``$HARNESS_COUNTEREXAMPLES``, or ``counterexamples/`` in the current directory."""
    return Path(os.environ.get("HARNESS_COUNTEREXAMPLES") or "counterexamples")


def golden_dir(vllm_version: str) -> Path:
    """The recorded traces of the bundled streams for one vLLM version."""
    return TRACES_DIR / f"vllm-{vllm_version}"


def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file and a rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def write_json(path: Path, data: Any) -> None:
    """Indented JSON with sorted keys, the form of every file the harness keeps."""
    write_atomic(path, json.dumps(data, indent=1, sort_keys=True) + "\n")
