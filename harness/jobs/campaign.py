"""``python -m harness fuzz``: a hypothesis campaign, reference vs the installed vLLM.

Shows progress, shrinks any divergence to a small stream written to
``counterexamples/fuzz.json``, and ends with a summary of what the campaign
reached (preemptions per policy, prefix hits, evictions, chunked prefills,
spec rejections, aborts of each kind).

The campaign is cut into chunks (:mod:`harness.jobs.chunks`) that run in this
process, on forked workers (``--workers N``, default every core) or on a Ray
cluster (``--ray``, :mod:`harness.jobs.workers`); a given seed checks the same
streams, reaches the same counters and keeps the same counterexample whatever
runs it.  Without ``--seed`` a seed is drawn and reported, so any campaign can
be run again.

Ctrl-C (SIGINT) or SIGTERM stops the campaign at the next stream: the summary
so far is printed, the counterexample shrunk so far stays on disk, and the
result says ``interrupted`` (exit 130).  A second signal stops at once.
"""

from __future__ import annotations

import contextlib
import hashlib
import random
import shutil
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from hypothesis import settings

from harness.checks import profiles
from harness.jobs import workers as where
from harness.jobs.chunks import (CHUNK_STREAMS, Gathered, Interrupted, chunks_of, counterexample_path,
                            read_json)
from harness.engines import get_engine
from harness.formats.paths import counterexamples_dir, write_json
from harness.formats.rule_counters import Stats

LABEL = "fuzz"

#: The main job's campaign (make conformance): this many streams, from this seed, as one
#: chunk (so the mutant hunt's main-job streams are the same hypothesis run).
MAIN_JOB_EXAMPLES = 300
MAIN_JOB_SEED = 0


@dataclass
class CampaignResult:
    examples: int  # streams asked for
    profile: str
    seed: int
    stats: Stats
    workers: str = "1"  # "N" forked or in this process, or "ray"
    shrink_runs: int = 0
    seconds: float = 0.0
    check_seconds: float = 0.0  # inside the checks, over all workers (the rest: generating)
    streams_sha256: str = ""  # a digest of every stream checked, in the campaign's order
    divergence: str | None = None  # the report of the shrunk counterexample
    counterexample: str | None = None  # where it was kept
    interrupted: bool = False
    lost: dict[int, str] = field(default_factory=dict)  # chunk index -> why it was lost
    worker_peak_rss_mb: list[float] = field(default_factory=list)

    @property
    def outcome(self) -> str:
        if self.interrupted:
            return "interrupted"
        return "diverged" if self.divergence else "clean"

    def to_json(self) -> dict:
        return {"outcome": self.outcome, "profile": self.profile, "seed": self.seed,
                "workers": self.workers, "examples_asked": self.examples,
                "streams_checked": self.stats.counts["streams"],
                "streams_sha256": self.streams_sha256,
                "shrink_runs": self.shrink_runs, "seconds": round(self.seconds, 1),
                "rules": dict(self.stats.counts), "unreached": self.stats.unreached(),
                "lost_chunks": {str(i): why for i, why in sorted(self.lost.items())},
                "divergence": self.divergence, "counterexample": self.counterexample}


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
    """A campaign's progress on stderr: rich's bar on a terminal; in a log (CI), a line per
    tenth of the campaign, and one line when a divergence starts shrinking."""

    def __init__(self, total: int):
        self.total = total
        self.started = time.monotonic()
        self.tty = sys.stderr.isatty()
        self.said_shrinking = False
        self.bar = None
        if self.tty:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
            from rich.progress import Progress as Bar
            self.bar = Bar(BarColumn(), MofNCompleteColumn(), TextColumn("streams ({task.fields[rate]})"),
                           TimeElapsedColumn(), TextColumn("{task.description}"),
                           console=Console(stderr=True))
            self.task = self.bar.add_task("", total=total, rate="0/s")
            self.bar.start()
        self.update(0)

    def update(self, done: int, shrinking: int = 0) -> None:
        rate = done / max(time.monotonic() - self.started, 1e-9)
        if self.bar is not None:
            self.bar.update(self.task, completed=done, rate=f"{rate:.0f}/s", description=(
                f"shrinking a divergence ({shrinking} runs)" if shrinking else ""))
            return
        if shrinking:
            if not self.said_shrinking:  # once: the lines would otherwise stop while it shrinks
                self.said_shrinking = True
                sys.stderr.write(f"divergence after {done} streams; shrinking it\n")
                sys.stderr.flush()
            return
        tenth = max(self.total // 10, 1)
        if done % tenth and done != self.total:
            return
        width = 30
        filled = min(width, width * done // max(self.total, 1))
        sys.stderr.write(f"[{'#' * filled}{'.' * (width - filled)}] {done}/{self.total} streams "
                         f"({rate:.0f}/s)\n")
        sys.stderr.flush()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()


def run_campaign(examples: int | None = None, seed: int | None = None,
                 profile: str | None = None, engines: tuple[str, ...] = ("vllm",),
                 workers: int = 1, ray: str | None = None,
                 chunk_streams: int = CHUNK_STREAMS, prop: str = "whole_space") -> CampaignResult:
    """Check ``examples`` streams of the whole space (or of the property named ``prop``)
    from ``seed`` (drawn when None) until
    all have run, one diverges, or a stop.  Each stream is checked on every engine of
    ``engines`` that takes it (the first one's runs are the summary's).  The chunks run
    in this process (``workers`` 1), on ``workers`` forked processes, or on Ray
    (``ray``: an address, or ``"local"`` for an instance of its own)."""
    name = profiles.load(profile)
    examples = examples or settings().max_examples
    seed = random.SystemRandom().randrange(2**32) if seed is None else seed
    chunks = chunks_of(examples, seed, chunk_streams, prop)
    gathered = Gathered(chunks)
    folder = counterexamples_dir() / ".fuzz-chunks"
    shutil.rmtree(folder, ignore_errors=True)
    if ray is None:
        for e in engines:  # import vLLM before the clock and the signals (and before forking)
            get_engine(e)
    progress = Progress(examples)
    started = time.monotonic()
    interrupted = False
    with stop_on_signals() as stop:
        try:
            if ray is not None:
                where.run_on_ray(chunks, gathered, name, engines, progress.update, stop,
                                 None if ray == "local" else ray)
            elif workers > 1:
                where.run_forked(chunks, gathered, name, engines, folder, progress.update,
                                 stop, workers)
            else:
                where.run_here(chunks, gathered, name, engines, folder, progress.update, stop)
        except (Interrupted, KeyboardInterrupt):
            interrupted = True
    progress.close()
    result = _result(gathered, examples, name, seed, folder, interrupted)
    result.workers = "ray" if ray is not None else str(workers)
    result.seconds = time.monotonic() - started
    shutil.rmtree(folder, ignore_errors=True)
    return result


def _result(gathered: Gathered, examples: int, profile: str, seed: int, folder: Path,
            interrupted: bool) -> CampaignResult:
    """The campaign's answer from its chunks' results, read in the chunks' order."""
    stats = Stats()
    result = CampaignResult(examples, profile, seed, stats, interrupted=interrupted,
                            lost=dict(gathered.lost))
    digest = hashlib.sha256()
    peaks: dict[str, float] = {}
    for r in gathered.in_order():
        for key, n in r.counts.items():
            stats.counts[key] += n
        digest.update(r.streams_sha256.encode())
        result.check_seconds += r.check_seconds
        peaks[r.worker] = max(peaks.get(r.worker, 0.0), r.peak_rss_mb)
        if r.divergence:
            result.shrink_runs = r.shrink_runs
            result.divergence = r.divergence
            result.counterexample = _keep(r.counterexample, counterexample_path(folder, r.index))
            if result.counterexample:
                result.divergence = r.divergence.replace(
                    str(counterexample_path(folder, r.index)), result.counterexample)
        if r.interrupted:
            result.interrupted = True
    result.streams_sha256 = digest.hexdigest()
    result.worker_peak_rss_mb = sorted(peaks.values(), reverse=True)
    if interrupted and not result.divergence:
        # A chunk stopped while shrinking: keep what it had shrunk so far.
        kept = sorted(folder.glob("*.json"), key=lambda p: int(p.stem)) if folder.is_dir() else []
        if kept:
            result.counterexample = _keep(None, kept[0])
            result.shrink_runs = max(result.shrink_runs, 1)
    return result


def _keep(stream: dict | None, chunk_file: Path) -> str | None:
    """The counterexample as ``counterexamples/fuzz.json``: from a result, or from the
    file a chunk kept on this machine."""
    stream = stream if stream is not None else read_json(chunk_file)
    if stream is None:
        return None
    path = counterexamples_dir() / f"{LABEL}.json"
    write_json(path, stream)
    return str(path)


def summary_lines(r: CampaignResult) -> list[str]:
    lines = [f"summary: {r.stats.summary()}"]
    missing = r.stats.unreached()
    if missing:
        lines.append(f"not reached in this campaign: {', '.join(missing)}")
    for index, why in sorted(r.lost.items()):
        lines.append(f"chunk {index} lost ({why}): its streams were not checked")
    checked = r.stats.counts["streams"]
    where = "on Ray" if r.workers == "ray" else f"on {r.workers} worker(s)"
    if r.interrupted:
        lines.append(f"interrupted after {checked} of {r.examples} streams ({r.seconds:.0f} s, "
                     f"seed {r.seed})" + (f"; the counterexample shrunk so far is in "
                                         f"{r.counterexample}" if r.counterexample else ""))
    elif r.divergence:
        lines.append(r.divergence)
    else:
        lines.append(f"{checked} streams, no divergence ({r.seconds:.0f} s, seed {r.seed}, "
                     f"{where})")
    return lines


def fuzz(examples: int | None = None, seed: int | None = None, profile: str | None = None,
         as_json: bool = False, engines: list[str] | None = None, workers: int = 1,
         ray: str | None = None, chunk_streams: int = CHUNK_STREAMS,
         prop: str = "whole_space") -> int:
    """The ``fuzz`` command: 0 clean, 1 a divergence or a lost chunk, 130 interrupted.

    A seed it draws is printed first, so that a campaign killed before its summary (a
    nightly job's time limit) can still be run again."""
    import json
    if seed is None:
        seed = random.SystemRandom().randrange(2**32)
        print(f"fuzz {prop}: drawn seed {seed} (--seed {seed} runs this campaign again)",
              file=sys.stderr, flush=True)
    r = run_campaign(examples, seed, profile, tuple(engines or ["vllm"]), workers, ray,
                     chunk_streams, prop)
    if as_json:
        print(json.dumps(r.to_json(), indent=1, sort_keys=True))
    else:
        print("\n".join(summary_lines(r)))
    if r.outcome == "clean" and r.lost:
        return 1
    return {"clean": 0, "diverged": 1, "interrupted": 130}[r.outcome]
