"""Known divergences: named, with a reason, never a silenced test.

When another vLLM version changes a rule on purpose, its divergence from the
0.11.0 reference is recorded here by name: which vLLM versions it applies to,
which streams can show it, and why.  The conformance properties then report
a matching divergence as an expected failure (``xfail``) naming it, so the
rest of the suite keeps guarding everything else.  ``HARNESS_KNOWN=fail``
turns them back into failures.

The list is empty for vLLM 0.11.0, the version the reference describes.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable


@dataclass(frozen=True)
class KnownDivergence:
    name: str
    reason: str
    vllm_versions: tuple[str, ...]  # installed versions where it is expected
    shows_on: Callable[[dict[str, Any]], bool]  # which streams can show it


KNOWN: list[KnownDivergence] = [
    # Example of an entry, for the day the suite runs against a release that
    # includes vLLM PR #26661 (see reference/quirks.py):
    # KnownDivergence(
    #     "priority_victim_keeps_its_grant",
    #     "0.11.0 keeps a preempted, already scheduled victim in num_scheduled_tokens; "
    #     "PR #26661 drops it",
    #     ("0.11.1",), lambda stream: stream["config"]["policy"] == "priority"),
]


def strict() -> bool:
    return os.environ.get("HARNESS_KNOWN") == "fail"


def matching(vllm_version: str, stream: dict[str, Any],
             known: list[KnownDivergence] | None = None) -> KnownDivergence | None:
    """The known divergence that explains a failure on this stream, if any."""
    for k in KNOWN if known is None else known:
        if vllm_version in k.vllm_versions and k.shows_on(stream):
            return k
    return None
