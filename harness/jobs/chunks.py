"""A campaign cut into chunks, so that any number of workers runs the same streams.

A campaign of N streams from seed S is the chunks ``0 .. ceil(N / CHUNK_STREAMS) - 1``;
chunk i is a hypothesis run of up to ``CHUNK_STREAMS`` streams of the whole space
(or of one named property) from a seed derived from (S, i) (chunk 0's is S itself).  What a chunk checks depends on (S, i) alone, not
on the process that runs it, so one worker running the chunks in order, eight
forked workers, or a Ray cluster check exactly the same streams.

Their results are gathered as if the chunks had run in order (:class:`Gathered`):
the campaign's answer is the chunks before the first divergent one, and that
one's shrunk counterexample.  A chunk that ran past it is dropped, a chunk
before it is waited for.
"""

from __future__ import annotations

import hashlib
import resource
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from hypothesis import HealthCheck, given, settings
from hypothesis import seed as fixed_seed
from hypothesis.errors import Flaky

from harness.checks import profiles
from harness.checks.conformance import Divergent, assert_conforms
from harness.engines import get_engine
from harness.checks.properties import by_name
from harness.formats.stream import parse_drawn_stream
from harness.formats.rule_counters import Stats

#: Streams per chunk: fixed, so that a campaign's chunks are the same whatever runs them.
CHUNK_STREAMS = 50


class Interrupted(BaseException):
    """Raised inside the property when a stop was asked for; hypothesis lets it through."""


@dataclass(frozen=True)
class Chunk:
    index: int
    seed: int  # the hypothesis seed of this chunk
    examples: int
    property: str = "whole_space"  # whose streams (harness.checks.properties)


def chunk_seed(seed: int, index: int) -> int:
    """The seed of chunk ``index`` of the campaign from ``seed``: the campaign's own for
    the first chunk, 64 bits of a digest of both for the others."""
    if index == 0:
        return seed
    return int.from_bytes(hashlib.sha256(f"{seed}:{index}".encode()).digest()[:8], "big")


def chunks_of(examples: int, seed: int, size: int = CHUNK_STREAMS,
              prop: str = "whole_space") -> list[Chunk]:
    """The chunks of a campaign of ``examples`` streams of property ``prop`` from ``seed``,
    ``size`` streams each (the last one fewer)."""
    return [Chunk(i, chunk_seed(seed, i), min(size, examples - start), prop)
            for i, start in enumerate(range(0, examples, size))]


@dataclass
class ChunkResult:
    index: int
    counts: dict[str, int]
    streams_sha256: str  # a digest of the streams checked, in order (not the shrink runs)
    check_seconds: float  # inside the check, not generating streams
    seconds: float
    worker: str  # which process ran it
    peak_rss_mb: float  # that process's peak resident memory so far
    shrink_runs: int = 0
    divergence: str | None = None  # the report of the shrunk counterexample
    counterexample: dict | None = None  # the shrunk stream
    interrupted: bool = False


def given_campaign(body, examples: int, seed: int | None, base: settings | None = None,
                   prop: str = "whole_space"):
    """``body`` as a hypothesis test: ``examples`` streams of the whole space (or of
    property ``prop``), from ``seed`` when given (the main job's are seed 0), else as the
    profile says.  The mutant hunt draws the main job's streams through this too."""
    base = base or settings()
    test = settings(base, max_examples=examples, print_blob=False, deadline=None,
                    suppress_health_check=list(HealthCheck), report_multiple_bugs=False,
                    derandomize=base.derandomize and seed is None,
                    database=None if seed is not None else base.database)(
        given(by_name(prop).strategy())(body))
    return fixed_seed(seed)(test) if seed is not None else test


def counterexample_path(folder: Path, index: int) -> Path:
    """Where chunk ``index`` keeps its counterexample while it shrinks."""
    return folder / f"{index}.json"


def run_chunk(chunk: Chunk, profile: str, engines: tuple[str, ...], folder: Path,
              on_stream: Callable[[bool], None] | None = None,
              stop: Callable[[], bool] | None = None) -> ChunkResult:
    """Check the chunk's streams on each engine of ``engines`` against the reference.

    A divergence is shrunk and kept in ``folder`` (:func:`counterexample_path`).
    ``on_stream(shrinking)`` is told of each run; ``stop()`` asked before each.
    """
    profiles.load(profile)  # a worker process may start with hypothesis's defaults
    first, *others = [get_engine(e) for e in engines]
    stats, digest = Stats(), hashlib.sha256()
    result = ChunkResult(chunk.index, stats.counts, "", 0.0, 0.0, _worker(), 0.0)
    label = counterexample_path(folder, chunk.index).stem
    failed = False

    def body(data):
        nonlocal failed
        if stop is not None and stop():
            raise Interrupted
        # After the first failure hypothesis only shrinks: those runs are not new streams.
        stream = parse_drawn_stream(data)
        if failed:
            result.shrink_runs += 1
        else:
            digest.update(stream.sha256().encode())
        started = time.perf_counter()
        try:
            assert_conforms(stream, label=label, vllm=first, stats=None if failed else stats,
                            folder=folder)
            for engine in others:
                if engine.refuses(stream) is None:
                    assert_conforms(stream, label=label, vllm=engine, folder=folder)
        except Divergent:
            failed = True
            raise
        finally:
            result.check_seconds += time.perf_counter() - started
            if on_stream is not None:
                on_stream(failed)

    started = time.perf_counter()
    try:
        given_campaign(body, chunk.examples, chunk.seed, settings(), chunk.property)()
    except (Divergent, Flaky) as exc:
        result.divergence = str(exc)
        result.counterexample = read_json(counterexample_path(folder, chunk.index))
    except (Interrupted, KeyboardInterrupt):
        result.interrupted = True
    result.seconds = time.perf_counter() - started
    result.streams_sha256 = digest.hexdigest()
    result.peak_rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return result


def _worker() -> str:
    import os
    import socket
    return f"{socket.gethostname()}:{os.getpid()}"


def read_json(path: Path) -> dict | None:
    """A kept stream, or None when the file is missing or not JSON."""
    import json
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


@dataclass
class Gathered:
    """Chunk results as they come, in any order; read as if the chunks ran in order."""

    chunks: list[Chunk]
    results: dict[int, ChunkResult] = field(default_factory=dict)
    lost: dict[int, str] = field(default_factory=dict)  # chunk index -> why

    def add(self, r: ChunkResult) -> None:
        self.results[r.index] = r

    @property
    def cut(self) -> int:
        """The first chunk that diverged (the campaign ends with it), else past the last."""
        return min((i for i, r in self.results.items() if r.divergence), default=len(self.chunks))

    def wanted(self, index: int) -> bool:
        """Whether chunk ``index`` still matters: it comes no later than the first divergence."""
        return index <= self.cut

    @property
    def complete(self) -> bool:
        last = min(self.cut, len(self.chunks) - 1)
        return all(i in self.results or i in self.lost for i in range(last + 1))

    def in_order(self) -> list[ChunkResult]:
        """The results that make up the campaign: chunks up to and with the first divergent."""
        return [self.results[i] for i in sorted(self.results) if i <= self.cut]
