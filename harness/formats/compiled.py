"""The compiled reference: ``reference/``'s own modules, compiled by mypyc.

``make compile`` (:mod:`harness.jobs.compile_reference`) copies ``reference/`` into
``build/reference-compiled/`` and compiles it there; the source stays as it is.  A
process started with ``HARNESS_REFERENCE=compiled`` imports ``reference`` from that
build instead (:func:`use_requested`, run when ``harness`` is imported).  The build is
the same code, so it gives the same traces, byte for byte
(``tests/test_compiled_reference.py`` replays every bundled stream and generated ones
through both); its scheduler runs two to three times faster.

What the build cannot do: its classes take no attribute from outside and no Python
subclass, and its membership tests do not call a ``frozenset`` subclass's
``__contains__``.  So whatever patches or wraps the reference -- the mutants, the
upgrade check's note of the rules a run asks (``AskedRules``), the tests -- runs the
interpreted reference, and says so when asked for the compiled one
(:func:`require_interpreted`).
"""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

from harness.formats.paths import ROOT

#: The environment variable that picks the reference a process imports.
VARIABLE = "HARNESS_REFERENCE"
#: Its values: the source as it is (the default), or the build.
INTERPRETED, COMPILED = "interpreted", "compiled"

SOURCE_DIR = ROOT / "reference"
BUILD_DIR = ROOT / "build" / "reference-compiled"
#: The digest of the source a build was made from (see :func:`source_digest`).
DIGEST_FILE = BUILD_DIR / "SOURCE_DIGEST"

#: Modules the build leaves interpreted, and why: mypyc compiles no class that
#: subclasses a builtin, and the harness's worker table subclasses the reference's.
LEFT_INTERPRETED = {
    "request_queue": "its queues subclass deque and list",
    "slot_mapping": "harness/engines/reference_engine.py subclasses its WorkerBlockTable",
}


def source_digest(source: Path = SOURCE_DIR) -> str:
    """What a build depends on: every module of the reference, and the Python that runs it."""
    h = hashlib.sha256(f"{sys.version_info[:2]}\n".encode())
    for path in sorted(source.glob("*.py")):
        h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def build_is_current() -> bool:
    """A build exists and was made from the reference as it is now."""
    try:
        return DIGEST_FILE.read_text().strip() == source_digest()
    except OSError:
        return False


def requested() -> str:
    """The reference this process was asked for; a value not known is a usage error."""
    value = os.environ.get(VARIABLE, "") or INTERPRETED
    if value not in (INTERPRETED, COMPILED):
        _usage_error(f"{VARIABLE}={value}: must be {INTERPRETED} or {COMPILED}")
    return value


def use_requested() -> None:
    """Put the build first on the import path when the compiled reference is asked for.
    It must come before anything imports ``reference``; a missing or stale build is a
    usage error (the interpreted reference would be a silent substitute)."""
    if requested() != COMPILED or in_use():
        return
    if "reference" in sys.modules:
        _usage_error(f"{VARIABLE}={COMPILED}: the interpreted reference was imported first")
    if not build_is_current():
        _usage_error(f"{VARIABLE}={COMPILED}: no build of the reference as it is now in "
                     f"{BUILD_DIR} (make compile)")
    sys.path.insert(0, str(BUILD_DIR))


def in_use() -> bool:
    """Whether this process runs the compiled reference."""
    return str(BUILD_DIR) in sys.path


def require_interpreted(what: str) -> None:
    """A usage error when the compiled reference is in use: ``what`` patches the
    reference, which only the interpreted one allows."""
    if in_use() or requested() == COMPILED:
        _usage_error(f"{VARIABLE}={COMPILED}: {what} patches the reference's functions, "
                     f"which only the interpreted reference allows; run it without {VARIABLE}")


def _usage_error(message: str) -> None:
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(2)
