"""``python -m harness bench``: what checking costs, in six figures, each against a target.

Speed is measured here, never asserted in a test.  One run prints one line per figure
(its target, and whether it holds) and writes the report: the generated section of
``docs/performance.md`` (between :data:`BEGIN` and :data:`END`; the prose around it is
kept) and the plot ``docs/performance-scaling.svg`` (``--output DIR`` writes both there).

1. The reference with its trace against vLLM with its trace, per step: each engine's
   whole :func:`harness.loop.runner.run` of a stream (start-up, steps, trace records), over
   (a) small streams of the whole generated space, drawn from a fixed seed, and (b) one
   stream on a big pool (:func:`workload`).
2. The full check of a stream (:func:`harness.checks.conformance.compare`: both engines, both
   traces, the diff) against a bare vLLM scheduler loop on it
   (:mod:`harness.engines.vllm_bare`), over the small streams that loop takes.
3. The share of a one-worker campaign's time spent generating streams (hypothesis)
   rather than checking them.
4. Checked streams per minute with every core against one worker (same seed).
5. The reference's cost per step (its scheduler's calls only, as :class:`_Timed` counts
   them) from a thousand to a million pages, and from 16 to 4,096 requests running at
   once (:func:`concurrent_workload`).
6. The peak resident memory of each campaign worker (figure 4's run) and of this process.

A missed target brings the top of a cProfile of the slower side into the report.
"""

from __future__ import annotations

import contextlib
import cProfile
import dataclasses
import datetime
import gc
import io
import os
import platform
import pstats
import random
import resource
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from harness.engines import get_engine
from harness.formats.paths import DOCS_DIR, ROOT, write_atomic
from harness.loop.runner import run
from harness.formats.stream import Stream, parse_stream

BEGIN, END = "<!-- bench:begin -->", "<!-- bench:end -->"
REPORT, PLOT = "performance.md", "performance-scaling.svg"

#: Targets (figure 6's is the project's own: a worker imports vLLM, about 2 GB).
TARGET_STEP_RATIO = 0.5
TARGET_CHECK_RATIO = 1.25
TARGET_GENERATION_SHARE = 0.35
TARGET_SPEEDUP_PER_CORE = 0.9
TARGET_STREAMS_PER_MINUTE = 10_000
TARGET_PAGES_FLAT = 1.5
TARGET_WORKER_RSS_MB = 3072


@dataclass(frozen=True)
class Sizes:
    """How much each figure measures; :data:`FULL` for the report, :data:`QUICK` for tests."""

    small_streams: int = 60
    repeats: int = 3  # runs of each engine per measurement; the median counts
    blocks: int = 1_000_000
    requests: int = 512
    campaign_streams: int = 400
    campaign_profile: str = "ci"
    pages: tuple[int, ...] = (1_000, 10_000, 100_000, 1_000_000)
    pages_requests: int = 64
    concurrency: tuple[int, ...] = (16, 64, 256, 1024, 4096)
    profile_streams: int = 20  # small streams under cProfile for a missed target


FULL = Sizes()
QUICK = Sizes(small_streams=10, repeats=1, blocks=20_000, requests=64, campaign_streams=16,
              pages=(1_000, 10_000, 100_000), concurrency=(16, 64, 256), profile_streams=4)


# -- workloads ---------------------------------------------------------------------------

def workload(num_blocks: int, num_requests: int, seed: int = 0) -> dict:
    """The big-pool stream: requests sharing 8 prefixes, arriving over 50 steps, prefilled
    in chunks (8,192 tokens a step, 256 seats) and then decoding."""
    rng = random.Random(seed)
    prefixes = [[rng.randrange(1000) for _ in range(rng.randrange(64, 512))] for _ in range(8)]
    requests = []
    for i in range(num_requests):
        prompt = rng.choice(prefixes) + [rng.randrange(1000) for _ in range(rng.randrange(16, 256))]
        output = [rng.randrange(1000) for _ in range(rng.randrange(32, 128))]
        requests.append({"id": f"r{i}", "prompt": prompt, "output": output,
                         "arrival_step": rng.randrange(0, 50)})
    return {"name": "bench", "config": {
        "block_size": 16, "num_gpu_blocks": num_blocks, "max_num_batched_tokens": 8192,
        "max_num_seqs": 256, "max_model_len": 4096, "max_steps": 100000}, "requests": requests}


#: concurrent_workload: tokens per request.
PREFIX_TOKENS, OWN_TOKENS, OUTPUT_TOKENS = 64, (16, 64), 32


def concurrent_workload(num_requests: int, num_blocks: int | None = None,
                        seed: int = 0) -> dict:
    """``num_requests`` requests that all run at once: they arrive at step 0, every one
    has a seat (``max_num_seqs``) and the budget takes every prompt in the first step, so
    that all of them decode together for :data:`OUTPUT_TOKENS` steps.  Prompts share one
    of 4 prefixes of 64 tokens.  The pool is ``num_blocks`` pages, by default twice what
    the requests need (at most 10 pages each, so 1,000 pages hold 64 requests)."""
    rng = random.Random(seed)
    prefixes = [[rng.randrange(1000) for _ in range(PREFIX_TOKENS)] for _ in range(4)]
    requests, prompt_tokens = [], 0
    for i in range(num_requests):
        prompt = rng.choice(prefixes) + [rng.randrange(1000)
                                         for _ in range(rng.randrange(*OWN_TOKENS))]
        prompt_tokens += len(prompt)
        requests.append({"id": f"r{i}", "prompt": prompt,
                         "output": [rng.randrange(1000) for _ in range(OUTPUT_TOKENS)]})
    pages_each = -(-(PREFIX_TOKENS + OWN_TOKENS[1] + OUTPUT_TOKENS) // 16)
    return {"name": f"concurrent-{num_requests}", "config": {
        "block_size": 16, "num_gpu_blocks": num_blocks or max(1000, 2 * pages_each * num_requests),
        "max_num_batched_tokens": max(8192, prompt_tokens), "max_num_seqs": num_requests,
        "max_model_len": 4096, "max_steps": 100000}, "requests": requests}


#: The stream format's bound on max_num_seqs (harness/formats/schemas/stream.schema.json).
MAX_SEATS = 1024


def concurrent_stream(num_requests: int, num_blocks: int | None = None) -> Stream:
    """:func:`concurrent_workload` as a stream.  Beyond the stream format's 1,024 seats the
    stream is parsed with 1,024 and given its seats after (the reference has no such
    bound; the benchmark alone goes past it)."""
    data = concurrent_workload(num_requests, num_blocks)
    seats = data["config"]["max_num_seqs"]
    data["config"]["max_num_seqs"] = min(seats, MAX_SEATS)
    stream = parse_stream(data)
    return dataclasses.replace(stream, config=dataclasses.replace(stream.config,
                                                                  max_num_seqs=seats))


def small_streams(n: int, seed: int = 0) -> list[Stream]:
    """``n`` streams of the whole generated space (property ``whole_space``), the same
    ones on every run: drawn by hypothesis from ``seed``, generation phase only."""
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as fixed_seed

    from harness.checks.properties import by_name
    drawn: list[dict] = []

    @fixed_seed(seed)
    @settings(settings.get_profile("default"), max_examples=n, database=None, deadline=None,
              derandomize=False, phases=[Phase.generate], print_blob=False,
              suppress_health_check=list(HealthCheck))
    @given(by_name("whole_space").strategy())
    def collect(data):
        drawn.append(data)

    collect()
    return [parse_stream(d) for d in drawn[:n]]


# -- timing ------------------------------------------------------------------------------

SCHEDULER_CALLS = ("schedule", "update_from_output", "update_draft_token_ids")


class _Timed:
    """Wraps an engine; adds up the time its scheduler spends in its own step calls.

    Only the scheduler's ``schedule``, ``update_from_output`` and
    ``update_draft_token_ids`` are timed: the adapters' work (turning outputs
    into trace records, the worker block table) is left out on both sides.
    """

    def __init__(self, engine):
        self._engine = engine
        self.seconds = {"start": 0.0, "step": 0.0}

    def __getattr__(self, name):
        return getattr(self._engine, name)

    def start(self, stream) -> None:
        started = time.perf_counter()
        self._engine.start(stream)
        self.seconds["start"] += time.perf_counter() - started
        sched = self._engine.sched
        try:  # on the scheduler itself, so that the calls of whatever holds it are timed
            for call in SCHEDULER_CALLS:
                setattr(sched, call, _timed(getattr(sched, call), self.seconds))
        except AttributeError:  # the compiled reference's takes no attribute from outside
            self._engine.sched = _TimedScheduler(sched, self.seconds)


def _timed(fn, seconds: dict[str, float]):
    def timed(*args, **kwargs):
        started = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            seconds["step"] += time.perf_counter() - started
    return timed


class _TimedScheduler:
    """A scheduler seen through a stand-in that times its step calls and hands everything
    else on: how the compiled reference's scheduler is timed (its engine calls it only
    through ``engine.sched``)."""

    def __init__(self, sched, seconds: dict[str, float]):
        object.__setattr__(self, "_sched", sched)
        object.__setattr__(self, "_seconds", seconds)

    def __getattr__(self, name):
        found = getattr(self._sched, name)
        return _timed(found, self._seconds) if name in SCHEDULER_CALLS else found

    def __setattr__(self, name, value) -> None:
        setattr(self._sched, name, value)


def time_engine(engine, stream) -> tuple[float, float, int]:
    """(seconds to build the pool, seconds inside schedule/update, steps)."""
    timed = _Timed(engine)
    with _collector_off():
        trace = run(timed, stream)
    assert trace.verdict == "completed", trace.failure
    return timed.seconds["start"], timed.seconds["step"], len(trace.steps)


def scheduler_seconds(engine, stream) -> float:
    """Seconds inside the scheduler's calls over the whole run, however it ends."""
    timed = _Timed(engine)
    with _collector_off():
        run(timed, stream)
    return timed.seconds["step"]


@contextlib.contextmanager
def _collector_off():
    """Garbage collected before, the cyclic collector off during (as ``timeit`` does): a
    pool is up to a million long-lived objects, and the collector's pauses over them
    otherwise decide the numbers more than the engines do.  (What vLLM's import made is
    frozen once by :func:`main`, so that the collection before is quick.)"""
    gc.collect()
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()


def timed_run(engine, stream: Stream) -> tuple[float, int]:
    """(seconds of the whole ``run(engine, stream)``, steps of its trace)."""
    with _collector_off():
        started = time.perf_counter()
        trace = run(engine, stream)
        seconds = time.perf_counter() - started
    return seconds, len(trace.steps)


def per_step_runs(streams: list[Stream], repeats: int, engines: dict[str, object]
                  ) -> dict[str, float]:
    """Each engine's seconds per step over ``streams`` (whole runs), the median of
    ``repeats`` passes, the engines alternating stream by stream."""
    passes: dict[str, list[float]] = {name: [] for name in engines}
    for _ in range(repeats):
        seconds = dict.fromkeys(engines, 0.0)
        steps = dict.fromkeys(engines, 0)
        for stream in streams:
            for name, engine in engines.items():
                s, n = timed_run(engine, stream)
                seconds[name] += s
                steps[name] += n
        for name in engines:
            passes[name].append(seconds[name] / max(steps[name], 1))
    return {name: statistics.median(v) for name, v in passes.items()}


def median_seconds(fn: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        with _collector_off():
            started = time.perf_counter()
            fn()
            times.append(time.perf_counter() - started)
    return statistics.median(times)


def profile_top(fn: Callable[[], object], lines: int = 15, sort: str = "cumulative") -> str:
    """The top ``lines`` functions of a cProfile of ``fn()``, paths shortened."""
    profiler = cProfile.Profile()
    with _collector_off():  # as the figure was timed
        profiler.runcall(fn)
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out)
    stats.sort_stats(sort).print_stats(lines)
    text = out.getvalue()
    for prefix in sorted({str(Path(p).parent) + "/" for p in sys.path if "site-packages" in p}
                         | {str(ROOT) + "/"}, key=len, reverse=True):
        text = text.replace(prefix, "")
    kept = [line.rstrip() for line in text.splitlines() if line.strip()]
    start = next((i for i, line in enumerate(kept) if "function calls" in line), 0)
    return "\n".join(kept[start:])


# -- the figures -------------------------------------------------------------------------

@dataclass
class Figure:
    key: str  # "1a", "1b", "2", ...
    what: str
    value: str  # as printed, with its unit
    target: str
    holds: bool | None  # None: not measured, or no target applies
    detail: str = ""
    profile: str = ""  # the top of a cProfile of the slower side, for a missed target
    profile_of: str = ""

    @property
    def verdict(self) -> str:
        return {True: "holds", False: "MISSED", None: "not measured"}[self.holds]

    def line(self) -> str:
        return f"{self.key:>2}  {self.what}: {self.value} (target {self.target}) {self.verdict}"


@dataclass
class Results:
    figures: list[Figure] = field(default_factory=list)
    pages: list[tuple[int, float]] = field(default_factory=list)  # (pages, s/step)
    concurrency: list[tuple[int, float]] = field(default_factory=list)  # (requests, s/step)
    throughput: dict[int, float] = field(default_factory=dict)  # workers -> streams/min

    def add(self, figure: Figure) -> Figure:
        self.figures.append(figure)
        print(figure.line(), flush=True)
        return figure


def scheduler_per_step(streams: list[Stream], repeats: int, engines: dict[str, object]
                       ) -> dict[str, float]:
    """Each engine's seconds inside its scheduler's calls per step over ``streams``, the
    median of ``repeats`` passes, the engines alternating stream by stream."""
    steps = {name: sum(len(run(e, s).steps) for s in streams) for name, e in engines.items()}
    passes: dict[str, list[float]] = {name: [] for name in engines}
    for _ in range(repeats):
        seconds = dict.fromkeys(engines, 0.0)
        for stream in streams:
            for name, engine in engines.items():
                seconds[name] += scheduler_seconds(engine, stream)
        for name in engines:
            passes[name].append(seconds[name] / max(steps[name], 1))
    return {name: statistics.median(v) for name, v in passes.items()}


def figure_step_ratio(key: str, what: str, streams: list[Stream], repeats: int,
                      profile_streams: list[Stream]) -> Figure:
    """The reference's scheduler calls over vLLM's, per step; the whole runs (start-up,
    steps, trace records) in the detail."""
    ref, vllm = get_engine("reference"), get_engine("vllm")
    engines = {"vllm": vllm, "reference": ref}
    calls = scheduler_per_step(streams, repeats, engines)
    whole = per_step_runs(streams, repeats, engines)
    ratio = calls["reference"] / calls["vllm"]
    f = Figure(key, what, f"{ratio:.2f}", f"≤ {TARGET_STEP_RATIO}", ratio <= TARGET_STEP_RATIO,
               f"scheduler calls: reference {1000 * calls['reference']:.3f} ms/step, vLLM "
               f"{1000 * calls['vllm']:.3f} ms/step; whole runs (start-up, steps, trace): "
               f"reference {1000 * whole['reference']:.3f}, vLLM {1000 * whole['vllm']:.3f} "
               f"ms/step, {whole['reference'] / whole['vllm']:.2f}; median of {repeats}")
    if not f.holds:
        f.profile_of = "the reference's scheduler calls (its runs, with trace)"
        f.profile = profile_top(lambda: [run(ref, s) for s in profile_streams])
    return f


def figure_big_pool(num_blocks: int, num_requests: int, repeats: int) -> Figure:
    stream = parse_stream(workload(num_blocks, num_requests))
    ref, vllm = get_engine("reference"), get_engine("vllm")
    f = figure_step_ratio("1b", f"reference/vLLM scheduler calls per step, big pool "
                          f"({num_blocks:,} pages, {num_requests} requests)",
                          [stream], repeats, [stream])
    built = {name: time_engine(engine, stream)[0] for name, engine in
             (("vllm", vllm), ("reference", ref))}
    f.detail += (f"; pool built in {built['reference']:.2f} s (reference) and "
                 f"{built['vllm']:.2f} s (vLLM)")
    return f


def figure_check_cost(streams: list[Stream], repeats: int, profile_streams: list[Stream]
                      ) -> Figure:
    """The full check over the two engines' bare loops (each scheduler driven through the
    stream with nothing the harness adds): what checking adds to running both."""
    from harness.checks.conformance import compare
    from harness.engines import vllm_bare_loop
    from harness.engines.reference_bare import run_bare as run_reference_bare
    run_bare, refuses = vllm_bare_loop()
    taken = [s for s in streams if refuses(s) is None]
    profile_streams = [s for s in profile_streams if refuses(s) is None]
    # Both engines built (and vLLM imported) before the clock.
    get_engine("reference"), get_engine("vllm")
    checked = median_seconds(lambda: [compare(s) for s in taken], repeats)
    bare_vllm = median_seconds(lambda: [run_bare(s) for s in taken], repeats)
    bare_reference = median_seconds(lambda: [run_reference_bare(s) for s in taken], repeats)
    bare = bare_vllm + bare_reference
    ratio = checked / bare
    f = Figure("2", f"full check/the two bare engines, {len(taken)} small streams",
               f"{ratio:.2f}", f"≤ {TARGET_CHECK_RATIO}", ratio <= TARGET_CHECK_RATIO,
               f"check {1000 * checked / len(taken):.1f} ms/stream (both engines, traces, "
               f"diff); bare loops {1000 * bare / len(taken):.1f} ms/stream (vLLM "
               f"{1000 * bare_vllm / len(taken):.1f}, reference "
               f"{1000 * bare_reference / len(taken):.1f}); check/bare vLLM loop alone "
               f"{checked / bare_vllm:.2f}; {len(streams) - len(taken)} of {len(streams)} "
               "streams left out (the bare loops take no async scheduling, pipeline stages, "
               "KV connector or structured output)")
    if not f.holds:
        f.profile_of = "the full check (compare)"
        f.profile = profile_top(lambda: [compare(s) for s in profile_streams])
    return f


def campaign_figures(results: Results, examples: int, profile: str, run_campaign,
                     workers: int, profile_gen: Callable[[], object],
                     repeats: int = 1) -> list[float]:
    """Figures 3 and 4 from campaigns of ``examples`` streams, seed 0: one worker, then
    ``workers``, ``repeats`` times taking turns; each figure reads the run of median
    wall time (one 400-stream campaign is a few seconds: runs of the same one varied
    ±15%).  ``run_campaign`` follows harness.jobs.campaign.run_campaign.  Returns the
    peak RSS of each worker of that run with ``workers`` (figure 6)."""
    ones, manys = [], []
    with _quiet_stderr():  # the campaign's progress bar
        for _ in range(repeats):
            ones.append(run_campaign(examples, 0, profile, engines=("vllm",), workers=1))
            manys.append(run_campaign(examples, 0, profile, engines=("vllm",),
                                      workers=workers))
    one, many = _median_run(ones), _median_run(manys)
    rates = {n: r.stats.counts["streams"] / r.seconds * 60 for n, r in ((1, one), (workers, many))}
    results.throughput = rates

    share = 1 - one.check_seconds / one.seconds
    f = results.add(Figure(
        "3", "campaign time generating streams (hypothesis), one worker", f"{share:.0%}",
        f"≤ {TARGET_GENERATION_SHARE:.0%}", share <= TARGET_GENERATION_SHARE,
        f"{one.stats.counts['streams']} streams (profile {profile}, seed 0) in "
        f"{one.seconds:.1f} s, {one.check_seconds:.1f} s of them checking; "
        f"{_runs_text(ones)}"))
    if not f.holds:
        f.profile_of = "generating streams of the whole space (hypothesis draws, no check)"
        f.profile = profile_top(profile_gen)

    if workers > 1:
        speedup = rates[workers] / rates[1]
        outside = many.seconds * workers - many.check_seconds
        results.add(Figure(
            "4", f"campaign streams/min, {workers} workers", f"{rates[workers]:,.0f}",
            f"≥ {TARGET_STREAMS_PER_MINUTE:,}", rates[workers] >= TARGET_STREAMS_PER_MINUTE,
            f"{rates[1]:.0f} streams/min with one worker, {speedup:.2f}x with {workers} "
            f"(≥ {TARGET_SPEEDUP_PER_CORE * workers:.1f}x is the scaling to hold) "
            f"({many.stats.counts['streams']} streams in {many.seconds:.1f} s; "
            f"{many.check_seconds:.1f} s checking over all workers, {outside:.1f} worker-s "
            f"outside the checks: start-up, generating, waiting); {_runs_text(manys)}"))
    else:
        results.add(Figure("4", "campaign streams/min, 1 worker", f"{rates[1]:,.0f}",
                           f"≥ {TARGET_STREAMS_PER_MINUTE:,}",
                           rates[1] >= TARGET_STREAMS_PER_MINUTE,
                           "one core: the target is for 2 workers"))
    return list(many.worker_peak_rss_mb)


def _median_run(runs: list):
    """The campaign of median wall time (the lower middle one of an even count)."""
    return sorted(runs, key=lambda r: r.seconds)[(len(runs) - 1) // 2]


def _runs_text(runs: list) -> str:
    if len(runs) == 1:
        return "one run"
    return f"median of {len(runs)} runs ({', '.join(f'{r.seconds:.1f}' for r in runs)} s)"


@contextlib.contextmanager
def _quiet_stderr():
    """Hold back what is written to stderr; show it if the block raises."""
    held = io.StringIO()
    try:
        with contextlib.redirect_stderr(held):
            yield
    except BaseException:
        sys.stderr.write(held.getvalue())
        raise


def memory_figure(peaks: list[float]) -> Figure:
    """Figure 6: the campaign workers' peak RSS, and this process's."""
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    mine = f"this process (both engines, every pool above): {own:.0f} MB"
    if not peaks:
        return Figure("6", "peak RSS per campaign worker", "n/a", f"≤ {TARGET_WORKER_RSS_MB} MB",
                      None, f"no worker reported; {mine}")
    top = max(peaks)
    return Figure("6", "peak RSS per campaign worker (largest)", f"{top:.0f} MB",
                  f"≤ {TARGET_WORKER_RSS_MB} MB", top <= TARGET_WORKER_RSS_MB,
                  f"workers of figure 4's run: {', '.join(f'{p:.0f}' for p in peaks)} MB; "
                  f"{mine}")


def scaling(sizes: Sizes, results: Results) -> Figure:
    """Figure 5: the reference's scheduler calls per step over pool sizes and crowds."""
    ref = get_engine("reference")

    def per_step(streams: list[Stream]) -> list[float]:
        """Each stream's best seconds per step, the streams taking turns in every repeat
        (measured one after the other, the first size measured came out slowest whatever
        it was: warm-up, not the pool)."""
        best = [float("inf")] * len(streams)
        for _ in range(sizes.repeats):
            for i, stream in enumerate(streams):
                _, seconds, steps = time_engine(ref, stream)
                best[i] = min(best[i], seconds / steps)
        return best

    by_pages = per_step([concurrent_stream(sizes.pages_requests, p) for p in sizes.pages])
    results.pages.extend(zip(sizes.pages, by_pages))
    by_crowd = per_step([concurrent_stream(n) for n in sizes.concurrency])
    results.concurrency.extend(zip(sizes.concurrency, by_crowd))
    times = [t for _, t in results.pages]
    spread = max(times) / min(times)
    pages_text = ", ".join(f"{p:,}: {1e6 * t:.0f}" for p, t in results.pages)
    crowd_text = ", ".join(f"{n}: {1e6 * t:.0f} ({1e6 * t / n:.2f}/request)"
                           for n, t in results.concurrency)
    f = Figure("5", f"reference per step, {sizes.pages[0]:,} to {sizes.pages[-1]:,} pages "
               f"(slowest/fastest)", f"{spread:.2f}x", f"≤ {TARGET_PAGES_FLAT}x",
               spread <= TARGET_PAGES_FLAT,
               f"scheduler calls only, best of {sizes.repeats} taking turns; µs/step by pages "
               f"({sizes.pages_requests} requests at once): {pages_text}; µs/step by requests "
               f"at once (pool twice their need): {crowd_text}")
    results.add(f)
    if not f.holds:
        slow = max(results.pages, key=lambda pt: pt[1])[0]
        stream = concurrent_stream(sizes.pages_requests, slow)
        f.profile_of = f"the reference on {slow:,} pages (whole run)"
        f.profile = profile_top(lambda: run(ref, stream))
    return f


# -- the report --------------------------------------------------------------------------

def machine_line() -> str:
    from harness.engines import installed_vllm_version
    try:
        with open("/proc/meminfo") as f:
            kb = int(next(line for line in f if line.startswith("MemTotal")).split()[1])
        ram = f"{kb / 2 ** 20:.1f} GiB RAM"
    except (OSError, StopIteration, ValueError):
        ram = "RAM unknown"
    load = f", load average {os.getloadavg()[0]:.1f}" if hasattr(os, "getloadavg") else ""
    return (f"{os.cpu_count()} cores, {ram}, Python {platform.python_version()}, "
            f"vLLM {installed_vllm_version()} on CPU, "
            f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC{load}")


def _yardstick_work() -> int:
    """A fixed piece of plain Python (small dicts and lists, calls), the kind of work both
    engines and the harness do, that no change to the project alters."""
    def entry(i: int) -> list[int]:
        return [i, i + 1, i % 7]
    total = 0
    for round_ in range(200):
        table = {f"r{i}": entry(i + round_) for i in range(500)}
        total += sum(v[2] for v in table.values() if v[0] % 3)
    return total


def machine_speed_ms(repeats: int = 5) -> float:
    """Milliseconds of :func:`_yardstick_work`, the best of ``repeats``: the machine's speed
    at the moment, so that runs at different times (or on a shared machine that slowed
    down) can be told apart by more than their figures."""
    best = float("inf")
    with _collector_off():  # else it times the collector walking whatever is alive now
        for _ in range(repeats):
            started = time.perf_counter()
            _yardstick_work()
            best = min(best, time.perf_counter() - started)
    return 1000 * best


def report_section(results: Results, command: str, machine: str, seconds: float,
                   plot: str | None, plot_note: str) -> str:
    figures = sorted(results.figures, key=lambda f: f.key)  # measured out of order
    rows = [f"| {f.key} | {f.what} | {f.value} | {f.target} | {f.verdict} |"
            for f in figures]
    lines = [BEGIN, "<!-- written by `python -m harness bench`; edit the prose outside "
             "the markers -->", "", f"Command: `{command}` ({seconds:.0f} s)", "",
             f"Machine: {machine}", "",
             "| # | figure | measured | target | verdict |", "|---|---|---|---|---|", *rows, ""]
    if plot:
        lines += [f"![Scaling: the reference per step by pages and by requests at once; "
                  f"campaign throughput by workers]({plot})", ""]
    elif plot_note:
        lines += [f"No plot: {plot_note}.", ""]
    lines += ["Details:", ""]
    lines += [f"* {f.key}: {f.detail}" for f in figures if f.detail]
    profiled = [f for f in figures if f.profile]
    if profiled:
        lines += ["", "Where the time goes, for each missed target (cProfile, top by "
                  "cumulative time):"]
        for f in profiled:
            lines += ["", f"{f.key}, {f.profile_of}:", "", "```", f.profile, "```"]
    lines.append(END)
    return "\n".join(lines) + "\n"


def merge_report(existing: str, section: str, begin: str = BEGIN, end: str = END) -> str:
    """``existing`` with its generated section (from ``begin`` to ``end``) replaced by
    ``section``, which holds both markers (appended when ``existing`` has none)."""
    if begin in existing and end in existing:
        head, rest = existing.split(begin, 1)
        return head + section.rstrip("\n") + rest.split(end, 1)[1]
    return existing.rstrip("\n") + "\n\n" + section


def write_plot(results: Results, path: Path) -> str | None:
    """The scaling curves as SVG at ``path``; None, or why there is no plot."""
    try:
        import matplotlib
    except ImportError:
        return "matplotlib is not installed (pip install -e '.[bench]')"
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    matplotlib.rcParams["svg.hashsalt"] = "harness-bench"  # the same ids on every run
    fig, axes = plt.subplots(1, 3, figsize=(13, 4))
    ax = axes[0]
    if results.pages:
        ax.plot([p for p, _ in results.pages], [1e3 * t for _, t in results.pages], "o-")
    ax.set(xscale="log", xlabel="pages in the pool", ylabel="ms per step",
           title="reference, requests fixed")
    ax.set_ylim(bottom=0)
    ax = axes[1]
    if results.concurrency:
        ax.plot([n for n, _ in results.concurrency],
                [1e3 * t for _, t in results.concurrency], "o-")
    ax.set(xscale="log", yscale="log", xlabel="requests running at once",
           ylabel="ms per step", title="reference, pool big enough")
    ax = axes[2]
    if results.throughput:
        names = [f"{n} worker{'s' if n > 1 else ''}" for n in results.throughput]
        ax.bar(names, list(results.throughput.values()))
    else:
        ax.text(0.5, 0.5, "not measured", ha="center", va="center", transform=ax.transAxes)
    ax.set(ylabel="checked streams per minute", title="campaign throughput")
    fig.tight_layout()
    buffer = io.StringIO()
    fig.savefig(buffer, format="svg", metadata={"Date": None})
    plt.close(fig)
    write_atomic(path, buffer.getvalue())
    return None


# -- the command -------------------------------------------------------------------------

def main(quick: bool = False, output: Path | None = None, num_blocks: int | None = None,
         num_requests: int | None = None, command: str = "python -m harness bench") -> int:
    sizes = QUICK if quick else FULL
    num_blocks = num_blocks or sizes.blocks
    num_requests = num_requests or sizes.requests
    output = Path(output) if output is not None else DOCS_DIR
    started = time.monotonic()
    machine = f"{machine_line()}, a fixed Python loop {machine_speed_ms():.1f} ms"
    print(f"machine: {machine}", flush=True)
    # Both engines (and vLLM's import) before any clock starts; what they made is kept out
    # of every later collection.
    get_engine("vllm"), get_engine("reference")
    gc.collect()
    gc.freeze()
    try:
        return _measure(sizes, output, num_blocks, num_requests, command, started, machine)
    finally:
        gc.unfreeze()


def _measure(sizes: Sizes, output: Path, num_blocks: int, num_requests: int, command: str,
             started: float, machine: str) -> int:
    results = Results()

    from harness.jobs.campaign import run_campaign
    # The campaigns first, as `harness fuzz` runs them: in a process that has built its
    # engines and nothing else (no pool of a million pages behind it, in the heap the
    # workers are forked from), the collector on, with what the imports and the engines
    # made kept out of its sight (frozen by main, as get_engine does for fuzz).
    peaks = campaign_figures(results, sizes.campaign_streams, sizes.campaign_profile,
                             run_campaign, os.cpu_count() or 1,
                             lambda: small_streams(min(sizes.campaign_streams, 100), seed=1),
                             sizes.repeats)
    gc.collect()
    gc.freeze()

    streams = small_streams(sizes.small_streams)
    profiled = streams[:sizes.profile_streams]
    results.add(figure_step_ratio(
        "1a", f"reference/vLLM scheduler calls per step, {len(streams)} small streams",
        streams, sizes.repeats, profiled))
    results.add(figure_big_pool(num_blocks, num_requests, sizes.repeats))
    results.add(figure_check_cost(streams, sizes.repeats, profiled))
    scaling(sizes, results)
    results.add(memory_figure(peaks))

    machine += f" at the start, {machine_speed_ms():.1f} ms at the end"
    plot_note = write_plot(results, output / PLOT)
    if plot_note:
        print(f"no plot: {plot_note}", flush=True)
    report = output / REPORT
    base = report if report.exists() else DOCS_DIR / REPORT
    existing = base.read_text() if base.exists() else "# Performance\n"
    write_atomic(report, merge_report(existing, report_section(
        results, command, machine, time.monotonic() - started,
        None if plot_note else PLOT, plot_note or "")))
    missed = sum(f.holds is False for f in results.figures)
    print(f"report: {report}" + ("" if plot_note else f", plot: {output / PLOT}")
          + f"; {missed} target(s) missed", flush=True)
    return 0
