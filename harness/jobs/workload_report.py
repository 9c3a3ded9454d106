"""What streams ask of the KV cache, on the reference: ``python -m harness workload DIR``.

Every stream runs through the reference; the report gives its steps, prefix hits,
preemptions and peak pages, and (:func:`smallest_pool`) the smallest pool that runs it
without a preemption."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Sequence

from harness.formats.public_traces import MAX_POOL, pages_of, smallest_valid_pool
from harness.formats.stream import Stream


@dataclass
class Usage:
    """One run of a stream, read off its trace."""

    verdict: str
    steps: int
    prompt_tokens: int
    hit_tokens: int  # prefix-cache hits at each request's first admission
    preemptions: int
    pages_in_use: list[int]  # per step, after it: pages held by requests
    running: list[int]  # per step, after it: requests RUNNING
    peak_pages: dict[str, int]  # per request: its largest block table (pages at once)
    failure: str | None = None
    highest_page: int = 0  # the largest page id handed out

    @property
    def hit_share(self) -> float:
        return self.hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def peak_in_use(self) -> int:
        return max(self.pages_in_use, default=0)

    @property
    def mean_pages(self) -> float:
        return sum(self.peak_pages.values()) / len(self.peak_pages) if self.peak_pages else 0.0

    @property
    def clean(self) -> bool:
        """Completed without a preemption."""
        return self.verdict == "completed" and self.preemptions == 0


def usage_of(stream: Stream, steps: list[dict], verdict: str,
             failure: dict | None = None) -> Usage:
    """Read a trace's steps (docs/trace-format.md): ``free_blocks`` gives the pages in
    use (the null page and cached pages no request holds are not in use), ``status`` the
    running requests, ``new_block_ids`` each request's block table (a request admitted
    this step, shown in ``prefix_hit_tokens``, gets its whole table; a running one the
    pages added; a preempted one holds none)."""
    pool = stream.config.num_gpu_blocks
    first_hit: dict[str, int] = {}
    table: dict[str, int] = {}
    peak: dict[str, int] = {}
    preemptions = highest = 0
    in_use, running = [], []
    for step in steps:
        for rid in step["preempted"]:
            table[rid] = 0
        preemptions += len(step["preempted"])
        admitted = step["prefix_hit_tokens"]
        for rid, hit in admitted.items():
            first_hit.setdefault(rid, hit)
            table[rid] = 0
        for rid, groups in step["new_block_ids"].items():
            table[rid] = table.get(rid, 0) + sum(1 for g in groups for b in g if b != 0)
            peak[rid] = max(peak.get(rid, 0), table[rid])
            highest = max([highest, *(b for g in groups for b in g)])
        in_use.append(pool - 1 - step["free_blocks"])
        running.append(sum(1 for s in step["status"].values() if s == "RUNNING"))
    return Usage(verdict, len(steps), sum(len(r.prompt) for r in stream.requests),
                 sum(first_hit.values()), preemptions, in_use, running, peak,
                 None if failure is None else failure.get("message"), highest)


def run_usage(engine, stream: Stream) -> Usage:
    from harness.loop.runner import run
    trace = run(engine, stream)
    return usage_of(stream, trace.steps, trace.verdict, trace.failure)


def with_pool(stream: Stream, pages: int) -> Stream:
    """The stream with a pool of ``pages`` (a pool given as memory becomes pages)."""
    return replace(stream, config=replace(stream.config, num_gpu_blocks=pages,
                                          kv_cache_memory_bytes=None))


@dataclass
class PoolSearch:
    """The smallest pool from which every larger one runs a stream without a preemption."""

    pages: int | None  # None: no pool does (the largest one tried: ``note``)
    below: Usage | None  # the run at pages - 1 (None: pages is the smallest valid pool)
    runs: dict[int, Usage]
    monotone: bool = True
    note: str = ""

    def text(self) -> str:
        if self.pages is None:
            return f"none ({self.note})"
        return f"{self.pages:,}" + ("" if self.monotone else " (not monotone)")


#: Pools the search runs one by one at most; with more to cover it bisects.
SCAN_RUNS = 256


def smallest_pool(stream: Stream, engine, first: Usage | None = None) -> PoolSearch:
    """The smallest ``num_gpu_blocks`` from which every larger pool runs the stream without
    a preemption.

    More pages do not always mean fewer preemptions: the pool's size changes which
    cached pages are evicted and so which prefixes hit.  So the pools are run one by
    one, from room for every request at once (past which pages cannot help; less when the
    run there never reached its last pages) down to the first that preempts; the answer
    is the pool above it.  Where that would take more
    than ``SCAN_RUNS`` runs (and for hybrid models, whose room is not a simple sum) it
    bisects between the smallest valid pool and one that runs clean (the stream's own,
    else doubled until one does), checks one page either side, and reports
    ``monotone`` False when the page above preempts again."""
    runs: dict[int, Usage] = {}

    def at(pages: int) -> Usage:
        if pages not in runs:
            runs[pages] = (first if first is not None and pages == stream.config.num_gpu_blocks
                           else run_usage(engine, with_pool(stream, pages)))
        return runs[pages]

    least = smallest_valid_pool(stream.config)
    hi = max(stream.config.num_gpu_blocks, least)
    top = MAX_POOL if stream.config.kv_cache_groups is not None else min(MAX_POOL, max(
        hi, 1 + sum(pages_of(len(r.prompt) + len(r.output)
                             + stream.config.num_speculative_tokens, stream.config.block_size)
                    for r in stream.requests)))
    if stream.config.kv_cache_groups is None and at(top).clean:
        # The free queue hands out never-used pages in id order before any freed one, so
        # a run that never went past page M never reused a page, and runs the same in
        # any pool that holds M: the scan can start there.
        top = max(least, min(top, at(top).highest_page + 1))
    if top - least < SCAN_RUNS:
        return _scan_down(at, least, top, runs)
    while not at(hi).clean:
        if hi >= top:
            return PoolSearch(None, None, runs, note=f"{hi:,} pages: {at(hi).verdict}, "
                                                     f"{at(hi).preemptions} preemption(s)")
        hi = min(top, hi * 2)
    if at(least).clean:
        found = least
    else:
        lo = least  # preempts; hi runs clean
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if at(mid).clean:
                hi = mid
            else:
                lo = mid
        found = hi
    below = at(found - 1) if found > least else None
    monotone = at(found).clean and (below is None or not below.clean)
    note = "bisected"
    if found + 1 <= MAX_POOL and not at(found + 1).clean:
        monotone = False
        note = f"bisected; {found + 1} pages preempt again"
    return PoolSearch(found, below, runs, monotone, note)


def _scan_down(at: Callable[[int], Usage], least: int, top: int,
               runs: dict[int, Usage]) -> PoolSearch:
    """Every pool from ``top`` down to the first that preempts (or to ``least``)."""
    if not at(top).clean:
        return PoolSearch(None, None, runs, note=f"{top:,} pages: {at(top).verdict}, "
                                                 f"{at(top).preemptions} preemption(s)")
    found = top
    while found > least and at(found - 1).clean:
        found -= 1
    below = at(found - 1) if found > least else None
    return PoolSearch(found, below, runs)


@dataclass
class Report:
    name: str
    stream: Stream
    usage: Usage
    search: PoolSearch | None


def workload_report(streams: Sequence[Stream], search: bool = True,
                    progress: Callable[[str], None] | None = None) -> list[Report]:
    """Each stream run through the reference (the installed vLLM's rules)."""
    from harness.engines import get_engine
    engine = get_engine("reference")
    out = []
    for stream in streams:
        if progress:
            progress(stream.name)
        usage = run_usage(engine, stream)
        found = smallest_pool(stream, engine, usage) if search else None
        out.append(Report(stream.name, stream, usage, found))
    return out


COLUMNS = ("stream", "requests", "steps", "prefix hits", "preemptions", "peak pages",
           "pages/request", "pool", "smallest pool", "one page fewer")


CAPTION = ("prefix hits: share of prompt tokens found in the prefix cache at each request's "
           "first admission; peak pages: most pages held by requests after a step; "
           "pages/request: mean of each request's largest block table; smallest pool: fewest "
           "pages (num_gpu_blocks, the null page included) from which every larger pool "
           "runs the stream without a preemption, and what one page fewer does")


def _row(r: Report) -> list[str]:
    u = r.usage
    steps = f"{u.steps:,}" + ("" if u.verdict == "completed" else f" ({u.verdict})")
    s = r.search
    below = ""
    if s is not None and s.pages is not None:
        if s.below is None:
            below = "not a valid pool"
        else:
            below = f"{s.below.preemptions:,} preemption(s)"
            if s.below.verdict != "completed":
                below += f", {s.below.verdict}"
        if s.note:
            below += f"; {s.note}"
    return [r.name, f"{len(r.stream.requests):,}", steps, f"{u.hit_share:.1%}",
            f"{u.preemptions:,}", f"{u.peak_in_use:,}", f"{u.mean_pages:.1f}",
            f"{r.stream.config.num_gpu_blocks:,}", "" if s is None else s.text(), below]


def total_row(reports: Sequence[Report]) -> list[str]:
    prompt = sum(r.usage.prompt_tokens for r in reports)
    hits = sum(r.usage.hit_tokens for r in reports)
    pages = [p for r in reports for p in r.usage.peak_pages.values()]
    found = [r.search.pages for r in reports if r.search is not None]
    largest = "" if not found else ("none" if None in found else f"{max(found):,} (largest)")
    return [f"total ({len(reports)} streams)",
            f"{sum(len(r.stream.requests) for r in reports):,}",
            f"{sum(r.usage.steps for r in reports):,}",
            f"{hits / prompt:.1%}" if prompt else "0.0%",
            f"{sum(r.usage.preemptions for r in reports):,}",
            f"{max(r.usage.peak_in_use for r in reports):,} (largest)",
            f"{sum(pages) / len(pages):.1f}" if pages else "0.0", "", largest, ""]


def table_text(reports: Sequence[Report], width: int = 200) -> str:
    """The report as a rich table, rendered to text."""
    from rich.console import Console
    from rich.table import Table
    table = Table(title="What each stream asks of the KV cache, on the reference",
                  title_justify="left", caption=CAPTION, caption_justify="left")
    for i, name in enumerate(COLUMNS):
        table.add_column(name, justify="left" if i == 0 or i == len(COLUMNS) - 1 else "right",
                         overflow="fold")
    for r in reports:
        table.add_row(*_row(r))
    if len(reports) > 1:
        table.add_section()
        table.add_row(*total_row(reports))
    console = Console(width=width, record=True, file=_Null(), color_system=None)
    console.print(table)
    return "\n".join(line.rstrip() for line in console.export_text().splitlines()) + "\n"


class _Null:
    def write(self, text: str) -> int:
        return len(text)

    def flush(self) -> None:
        pass


def report_json(reports: Sequence[Report]) -> dict[str, Any]:
    streams = []
    for r in reports:
        u, s = r.usage, r.search
        streams.append({
            "name": r.name, "requests": len(r.stream.requests), "verdict": u.verdict,
            "steps": u.steps, "prompt_tokens": u.prompt_tokens, "hit_tokens": u.hit_tokens,
            "preemptions": u.preemptions, "peak_pages": u.peak_in_use,
            "mean_pages_per_request": round(u.mean_pages, 6),
            "pool": r.stream.config.num_gpu_blocks,
            "smallest_pool": None if s is None else s.pages,
            "one_page_fewer": None if s is None or s.below is None else {
                "preemptions": s.below.preemptions, "verdict": s.below.verdict},
            "monotone": None if s is None else s.monotone,
            "pools_run": None if s is None else sorted(s.runs),
        })
    return {"streams": streams}


def plot(reports: Sequence[Report], path: Path) -> None:
    """Pages in use and running requests per step, one line per stream (matplotlib)."""
    import os

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (pages, running) = plt.subplots(2, 1, sharex=True, figsize=(9, 6))
    for r in reports:
        pages.plot(r.usage.pages_in_use, label=r.name, linewidth=1)
        running.plot(r.usage.running, label=r.name, linewidth=1)
    pages.set_ylabel("pages in use")
    running.set_ylabel("running requests")
    running.set_xlabel("step")
    if len(reports) <= 12:
        pages.legend(fontsize="small")
    fig.tight_layout()
    tmp = path.with_name(path.name + ".tmp" + path.suffix)
    fig.savefig(tmp)
    plt.close(fig)
    os.replace(tmp, path)
