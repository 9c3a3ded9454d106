"""``python -m harness fuzz``: a hypothesis campaign, reference vs the installed vLLM.

Shows a progress bar, shrinks any divergence to a small stream written to
``counterexamples/fuzz.json``, and ends with a summary of what the campaign
reached (preemptions per policy, prefix hits, evictions, chunked prefills,
spec rejections, aborts of each kind).
"""

from __future__ import annotations

import sys
import time

from hypothesis import HealthCheck, given, settings
from hypothesis import seed as fixed_seed
from hypothesis.errors import Flaky

from harness.conformance import Divergent, assert_conforms
from harness.properties import by_name
from harness.stats import Stats


def _progress(done: int, total: int, started: float) -> None:
    """A bar redrawn in place on a terminal; a line per tenth of the campaign otherwise."""
    tenth = max(total // 10, 1)
    if not sys.stderr.isatty() and done % tenth and done != total:
        return
    width = 30
    filled = min(width, width * done // max(total, 1))
    rate = done / max(time.monotonic() - started, 1e-9)
    line = f"[{'#' * filled}{'.' * (width - filled)}] {done}/{total} streams ({rate:.0f}/s)"
    sys.stderr.write(f"\r{line}" if sys.stderr.isatty() else f"{line}\n")
    sys.stderr.flush()


def fuzz(examples: int, seed: int | None = None, profile: str | None = None) -> int:
    """Check ``examples`` streams of the whole space; 0 when none diverged, else 1."""
    if profile:
        settings.load_profile(profile)
    stats = Stats()
    started = time.monotonic()
    failure: list[str] = []

    @settings(max_examples=examples, deadline=None, suppress_health_check=list(HealthCheck),
              derandomize=False, print_blob=False,
              database=None if seed is not None else settings().database)
    @given(by_name("whole_space").strategy())
    def campaign(data):
        try:
            assert_conforms(data, label="fuzz", stats=stats)
        finally:
            _progress(stats.counts["streams"], examples, started)

    if seed is not None:
        campaign = fixed_seed(seed)(campaign)
    try:
        campaign()
    except (Divergent, Flaky) as exc:
        failure.append(str(exc))
    if sys.stderr.isatty():
        sys.stderr.write("\n")
    print(f"summary: {stats.summary()}")
    missing = stats.unreached()
    if missing:
        print(f"not reached in this campaign: {', '.join(missing)}")
    if failure:
        print(failure[0])
        return 1
    print(f"{stats.counts['streams']} streams, no divergence "
          f"({time.monotonic() - started:.0f} s)")
    return 0
