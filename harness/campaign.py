"""``python -m harness fuzz``: a hypothesis campaign, reference vs the installed vLLM.

Shows progress, shrinks any divergence to a small stream written to
``counterexamples/fuzz.json``, and ends with a summary of what the campaign
reached (preemptions per policy, prefix hits, evictions, chunked prefills,
spec rejections, aborts of each kind).

Ctrl-C (SIGINT) or SIGTERM stops the campaign at the next stream: the summary
so far is printed, the counterexample shrunk so far stays on disk, and the
result says ``interrupted`` (exit 130).  A second signal stops at once.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Iterator

from hypothesis import HealthCheck, given, settings
from hypothesis import seed as fixed_seed
from hypothesis.errors import Flaky

from harness import profiles
from harness.conformance import Divergent, assert_conforms
from harness.engines import get_engine
from harness.properties import by_name
from harness.stream import parse_stream
from harness.stats import Stats

LABEL = "fuzz"

#: The main job's campaign (make conformance): this many streams, from this seed.
MAIN_JOB_EXAMPLES = 300
MAIN_JOB_SEED = 0


class Interrupted(BaseException):
    """Raised inside the property when a stop was asked for; hypothesis lets it through."""


@dataclass
class CampaignResult:
    examples: int  # streams asked for
    profile: str
    seed: int | None
    stats: Stats
    shrink_runs: int = 0
    seconds: float = 0.0
    divergence: str | None = None  # the report of the shrunk counterexample
    interrupted: bool = False
    lines: list[str] = field(default_factory=list)

    @property
    def outcome(self) -> str:
        if self.interrupted:
            return "interrupted"
        return "diverged" if self.divergence else "clean"

    def to_json(self) -> dict:
        return {"outcome": self.outcome, "profile": self.profile, "seed": self.seed,
                "examples_asked": self.examples, "streams_checked": self.stats.counts["streams"],
                "shrink_runs": self.shrink_runs, "seconds": round(self.seconds, 1),
                "rules": dict(self.stats.counts), "unreached": self.stats.unreached(),
                "divergence": self.divergence}


@contextlib.contextmanager
def stop_on_signals() -> Iterator[threading.Event]:
    """An event set by the first SIGINT or SIGTERM; the second one stops at once."""
    stop = threading.Event()

    def handler(signum, frame):
        if stop.is_set():
            raise KeyboardInterrupt
        stop.set()

    caught = (signal.SIGINT, signal.SIGTERM)
    if threading.current_thread() is not threading.main_thread():
        yield stop  # signals reach only the main thread; nothing to install
        return
    previous = {s: signal.signal(s, handler) for s in caught}
    try:
        yield stop
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


class Progress:
    """A bar redrawn in place on a terminal; a line per tenth of the campaign otherwise."""

    def __init__(self, total: int):
        self.total = total
        self.started = time.monotonic()
        self.tty = sys.stderr.isatty()
        self.said_shrinking = False
        self.update(0)

    def update(self, done: int, shrinking: int = 0) -> None:
        tenth = max(self.total // 10, 1)
        if not self.tty and shrinking:
            if not self.said_shrinking:  # once: the lines would otherwise stop while it shrinks
                self.said_shrinking = True
                sys.stderr.write(f"divergence after {done} streams; shrinking it\n")
                sys.stderr.flush()
            return
        if not self.tty and done % tenth and done != self.total:
            return
        width = 30
        filled = min(width, width * done // max(self.total, 1))
        rate = done / max(time.monotonic() - self.started, 1e-9)
        line = f"[{'#' * filled}{'.' * (width - filled)}] {done}/{self.total} streams ({rate:.0f}/s)"
        if shrinking:
            line += f", shrinking a divergence ({shrinking} runs)"
        sys.stderr.write(f"\r{line}" if self.tty else f"{line}\n")
        sys.stderr.flush()

    def close(self) -> None:
        if self.tty:
            sys.stderr.write("\n")


def given_campaign(body, examples: int, seed: int | None, base: settings | None = None):
    """``body`` as the campaign's hypothesis test: ``examples`` streams of the whole
    space, from ``seed`` when given (the main job's are seed 0), else as the profile says.
    The mutant hunt draws the main job's streams through this too."""
    base = base or settings()
    test = settings(base, max_examples=examples, print_blob=False, deadline=None,
                    suppress_health_check=list(HealthCheck),
                    derandomize=base.derandomize and seed is None,
                    database=None if seed is not None else base.database)(
        given(by_name("whole_space").strategy())(body))
    return fixed_seed(seed)(test) if seed is not None else test


def run_campaign(examples: int | None = None, seed: int | None = None,
                 profile: str | None = None, engines: tuple[str, ...] = ("vllm",)
                 ) -> CampaignResult:
    """Check streams of the whole space until ``examples`` have run, one diverges, or a stop.
    Each stream is checked on every engine of ``engines`` that takes it (the first one's
    runs are the summary's)."""
    name = profiles.load(profile)
    # Import vLLM before the clock and the signal handlers start.
    first, *others = [get_engine(e) for e in engines]
    base = settings()
    examples = examples or base.max_examples
    result = CampaignResult(examples, name, seed, Stats())
    progress = Progress(examples)
    started = time.monotonic()
    failed = False

    with stop_on_signals() as stop:
        def campaign(data):
            nonlocal failed
            if stop.is_set():
                raise Interrupted
            # After the first failure hypothesis only shrinks: those runs are not new streams.
            stats = None if failed else result.stats
            if failed:
                result.shrink_runs += 1
            try:
                assert_conforms(data, label=LABEL, vllm=first, stats=stats)
                for engine in others:
                    if engine.refuses(parse_stream(data)) is None:
                        assert_conforms(data, label=f"{LABEL}-{engine.name}", vllm=engine)
            except Divergent:
                failed = True
                raise
            finally:
                progress.update(result.stats.counts["streams"], result.shrink_runs)

        try:
            given_campaign(campaign, examples, seed, base)()
        except (Divergent, Flaky) as exc:
            result.divergence = str(exc)
        except (Interrupted, KeyboardInterrupt):
            result.interrupted = True
    progress.close()
    result.seconds = time.monotonic() - started
    return result


def summary_lines(r: CampaignResult) -> list[str]:
    lines = [f"summary: {r.stats.summary()}"]
    missing = r.stats.unreached()
    if missing:
        lines.append(f"not reached in this campaign: {', '.join(missing)}")
    checked = r.stats.counts["streams"]
    if r.interrupted:
        lines.append(f"interrupted after {checked} of {r.examples} streams ({r.seconds:.0f} s)"
                     + ("; the counterexample shrunk so far is in counterexamples/fuzz.json"
                        if r.shrink_runs else ""))
    elif r.divergence:
        lines.append(r.divergence)
    else:
        lines.append(f"{checked} streams, no divergence ({r.seconds:.0f} s)")
    return lines


def fuzz(examples: int | None = None, seed: int | None = None, profile: str | None = None,
         as_json: bool = False, engines: list[str] | None = None) -> int:
    """The ``fuzz`` command: 0 clean, 1 a divergence, 130 interrupted."""
    import json
    r = run_campaign(examples, seed, profile, tuple(engines or ["vllm"]))
    if as_json:
        print(json.dumps(r.to_json(), indent=1, sort_keys=True))
    else:
        print("\n".join(summary_lines(r)))
    return {"clean": 0, "diverged": 1, "interrupted": 130}[r.outcome]
