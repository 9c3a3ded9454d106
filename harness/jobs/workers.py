"""Where a campaign's chunks run: this process, forked worker processes, or a Ray cluster.

Each runner takes the campaign's chunks in order and feeds their results into a
:class:`~harness.jobs.chunks.Gathered`, which decides when the campaign has its
answer (every chunk up to the first divergent one is in).  Chunks that can no
longer matter are dropped: a forked worker is stopped, a Ray task cancelled.

* :func:`run_here` -- one after the other in this process (``--workers 1``).
* :func:`run_forked` -- ``--workers N``: N processes forked after vLLM was
  imported here, so each starts at once and shares the imported code.  A worker
  that dies (killed, out of memory) costs the chunk it held, which the result
  lists as lost; the others go on.
* :func:`run_on_ray` -- ``--ray [ADDRESS]``: one Ray task per chunk on a running
  cluster, or on a local instance started for the campaign.  Ray retries a task
  whose worker or node died; a chunk still lost after that is listed, and the
  campaign goes on.  Counterexamples come back inside the results, since a task
  may run on another machine.
"""

from __future__ import annotations

import multiprocessing
import os
import shutil
import signal
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable

from harness.jobs.chunks import Chunk, ChunkResult, Gathered, Interrupted, run_chunk

#: How many times Ray runs a chunk again whose worker or node died.
RAY_RETRIES = 2

Progress = Callable[[int, int], None]  # (streams checked, shrink runs) so far


def run_here(chunks: list[Chunk], gathered: Gathered, profile: str, engines: tuple[str, ...],
             folder: Path, progress: Progress, stop: threading.Event) -> None:
    """The chunks in order in this process, until the first divergence or a stop."""
    checked = shrinks = 0

    def on_stream(shrinking: bool) -> None:
        nonlocal checked, shrinks
        if shrinking:
            shrinks += 1
        else:
            checked += 1
        progress(checked, shrinks)

    for chunk in chunks:
        result = run_chunk(chunk, profile, engines, folder, on_stream, stop.is_set)
        gathered.add(result)
        if result.interrupted:
            raise Interrupted
        if gathered.complete:
            return


def run_forked(chunks: list[Chunk], gathered: Gathered, profile: str, engines: tuple[str, ...],
               folder: Path, progress: Progress, stop: threading.Event, workers: int) -> None:
    """The chunks on ``workers`` processes forked from this one (vLLM already imported)."""
    context = multiprocessing.get_context("fork")
    # A result is written through at once (SimpleQueue), so a worker dying on its next
    # chunk cannot take the last one's result down with it.
    tasks, results = context.Queue(), context.SimpleQueue()
    counters = context.Array("q", 2)  # streams checked, shrink runs: for the progress line
    # The chunk each worker runs now, in shared memory: still readable after a worker dies.
    held = context.Array("q", [-1] * workers)
    for chunk in chunks:
        tasks.put(chunk)
    for _ in range(workers):
        tasks.put(None)
    procs = [context.Process(target=_forked_worker, daemon=True,
                             args=(slot, tasks, results, counters, held, profile, engines, folder))
             for slot in range(workers)]
    for p in procs:
        p.start()
    try:
        while not gathered.complete:
            if stop.is_set():
                raise Interrupted
            if not results.empty():
                gathered.add(results.get())
            else:
                _note_dead_workers(procs, held, gathered)
                if not any(p.is_alive() for p in procs) and results.empty():
                    _lose_the_rest(chunks, gathered, "no worker left")
                time.sleep(0.05)
            progress(counters[0], counters[1])
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()
        for p in procs:
            p.join(timeout=5)


def _forked_worker(slot, tasks, results, counters, held, profile, engines, folder) -> None:
    # Ctrl-C reaches the whole process group: the driver alone decides what to stop.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)

    def on_stream(shrinking: bool) -> None:
        with counters.get_lock():
            counters[1 if shrinking else 0] += 1

    while (chunk := tasks.get()) is not None:
        held[slot] = chunk.index
        results.put(run_chunk(chunk, profile, engines, folder, on_stream))
    held[slot] = -1


def _note_dead_workers(procs, held, gathered: Gathered) -> None:
    """A worker that ended with an error loses the chunk it held (once its result is not in)."""
    for slot, p in enumerate(procs):
        index = held[slot]
        if p.exitcode not in (0, None) and index >= 0 and index not in gathered.results:
            gathered.lost[index] = f"worker {p.pid} ended with exit code {p.exitcode}"
            held[slot] = -1


def _lose_the_rest(chunks: list[Chunk], gathered: Gathered, why: str) -> None:
    for chunk in chunks:
        if chunk.index not in gathered.results:
            gathered.lost.setdefault(chunk.index, why)


def run_on_ray(chunks: list[Chunk], gathered: Gathered, profile: str, engines: tuple[str, ...],
               progress: Progress, stop: threading.Event, address: str | None) -> None:
    """One Ray task per chunk on the cluster at ``address`` (None: a local instance)."""
    try:
        import ray
    except ModuleNotFoundError:  # Ray comes with vLLM, whose engines the campaign runs
        from harness.engines import EngineUnavailable
        raise EngineUnavailable("--ray: ray is not installed (it comes with vLLM: "
                                "pip install -e '.[vllm]')") from None
    from ray.exceptions import RayError

    started_here = not ray.is_initialized()
    if started_here:
        ray.init(address=address, include_dashboard=False, log_to_driver=False,
                 runtime_env={"env_vars": harness_environment()})
    task = ray.remote(num_cpus=1, max_retries=RAY_RETRIES)(_ray_chunk)
    pending = {task.remote(chunk, profile, engines): chunk for chunk in chunks}
    checked = 0
    try:
        while pending and not gathered.complete:
            if stop.is_set():
                raise Interrupted
            done, _ = ray.wait(list(pending), num_returns=1, timeout=0.2)
            for ref in done:
                chunk = pending.pop(ref)
                try:
                    result = ray.get(ref)
                except RayError as exc:  # retries spent: the worker or its node is gone
                    gathered.lost[chunk.index] = str(exc).strip().splitlines()[0]
                else:
                    gathered.add(result)
                    checked += result.counts["streams"]
            for ref, chunk in list(pending.items()):
                if not gathered.wanted(chunk.index):
                    ray.cancel(ref, force=True)
                    del pending[ref]
            progress(checked, 0)
    finally:
        for ref in pending:
            ray.cancel(ref, force=True)
        if started_here:
            ray.shutdown()


def _ray_chunk(chunk: Chunk, profile: str, engines: tuple[str, ...]) -> ChunkResult:
    folder = Path(tempfile.mkdtemp(prefix="harness-chunk-"))
    try:
        return run_chunk(chunk, profile, engines, folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def harness_environment() -> dict[str, str]:
    """The variables a Ray task needs from the driver: the harness's own (a mutant, limits)."""
    return {k: v for k, v in os.environ.items() if k.startswith("HARNESS_")}


def default_workers() -> int:
    """Every core this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1
