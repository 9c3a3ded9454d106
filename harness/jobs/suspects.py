"""Suspect lines: the hunks of vLLM's own diff behind a divergence the check cannot explain.

When the upgrade check finds a cause that no named rule change explains, a person must
find the lines of the new release that changed the rule.  This module narrows the
release's whole diff down to a ranked handful of hunks:

1. **The diff.**  The ``vllm/`` trees of the two releases' wheels (the release checked and
   the release it is checked against), compared file by file with :mod:`difflib`; only
   the files the runs below executed are diffed.
2. **The runs.**  The cause's shrunk stream and the other streams it shows on (they
   diverge), and the streams one cut away from the shrunk one that behave as before (near
   misses) and the bundled streams the check found unchanged (they pass), run on each
   release under coverage.py, on the harness's step loop and on vLLM's own
   ``EngineCore`` (engine ``vllm-core``), recording the lines of vLLM each run executes: the new
   release in this process, the old one in a process of its own environment.
3. **The ranking.**  A hunk is suspect when the shrunk stream's run executed one of its
   lines (on the new side, or a removed line on the old side).  Each line is scored as
   spectrum-based fault localisation does (Ochiai): a line every diverging run executes
   and few passing runs execute scores high, so the branch a new rule takes only on the
   diverging streams comes before the code every stream runs; the near misses, which run
   what the example runs but for the rule that changed, keep the lines of the example's
   other features down.  A hunk scores its best line; a hunk that only re-lays code
   out (a formatter's) is left out; ties go to the scheduler and KV cache files
   (``vllm/v1/core/``), then to the engine loop (``vllm/v1/engine/``), then to the
   smaller hunk.

The upgrade check does the same where the reference with the release's rules is not
exact (a change the records miss, even on a stream the release leaves as it was): the
failing runs are those streams, the passing runs the streams where it is exact.

What it does not do: say which request and step first depend on a hunk (the lines are
per run, not per step).
"""

from __future__ import annotations

import difflib
import json
import math
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from harness.formats.paths import ROOT
from harness.formats.stream import Stream, canonical_json, parse_stream

#: Hunks shown per cause in the report.
SHOWN = 5
#: Passing streams run per release (the near misses first, then the bundled ones in name
#: order), and diverging ones.
PASSING = 200
FAILING = 20
#: Lines of a hunk's text shown in the report.
HUNK_LINES = 24

Lines = dict[str, frozenset[int]]  # path under vllm/ -> executed line numbers


@dataclass(frozen=True)
class Hunk:
    """One hunk of the diff of a file under ``vllm/``: lines [start, end) on each side."""

    path: str
    old_start: int
    old_end: int
    new_start: int
    new_end: int
    text: str  # the unified diff of the hunk, without file headers

    @property
    def layout_only(self) -> bool:
        """Whether the hunk only re-lays code out (spaces, line breaks, parentheses,
        trailing commas, quote marks): a formatter's change, which no rule is."""
        lines = self.text.splitlines()
        old = "".join(_without_comment(line[1:]) for line in lines if line.startswith("-"))
        new = "".join(_without_comment(line[1:]) for line in lines if line.startswith("+"))
        return _layout_free(old) == _layout_free(new)

    @property
    def size(self) -> int:
        return (self.old_end - self.old_start) + (self.new_end - self.new_start)

    def where(self) -> str:
        if self.new_end > self.new_start:
            return f"{self.path}:{self.new_start}-{self.new_end - 1}"
        return f"{self.path}: old lines {self.old_start}-{self.old_end - 1} removed"


def _without_comment(line: str) -> str:
    """A line of code without a trailing comment (a ``#`` outside quotes)."""
    quote = None
    for i, ch in enumerate(line):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#":
            return line[:i]
    return line


def _layout_free(code: str) -> str:
    code = code.replace("'", '"')
    code = re.sub(r",\s*([)\]}])", r"\1", code)
    return re.sub(r"[\s()\\]", "", code)


@dataclass(frozen=True)
class Suspect:
    hunk: Hunk
    score: float
    lines_run: int  # lines of the hunk the diverging run executed, both sides

    def to_json(self) -> dict:
        return {"where": self.hunk.where(), "path": self.hunk.path, "score": round(self.score, 4),
                "lines_run": self.lines_run, "old": [self.hunk.old_start, self.hunk.old_end],
                "new": [self.hunk.new_start, self.hunk.new_end], "diff": self.hunk.text}


# -- the trees and the runs ---------------------------------------------------------------

def installed_tree() -> Path:
    """The ``vllm/`` folder this process imports."""
    import importlib.util
    spec = importlib.util.find_spec("vllm")
    if spec is None or spec.origin is None:
        raise RuntimeError("vllm is not importable here")
    return Path(spec.origin).parent


def vllm_engines() -> list:
    """The engines whose runs are measured: the harness's step loop over vLLM's scheduler,
    and vLLM's own ``EngineCore`` (engine ``vllm-core``), whose loop the other does not
    run (a rule of ``vllm/v1/engine/core.py`` shows only there)."""
    from harness.engines import EngineUnavailable, get_engine
    engines = [get_engine("vllm")]
    try:
        engines.append(get_engine("vllm-core"))
    except EngineUnavailable:
        pass
    return engines


def _quietly(run, engine, stream) -> None:
    """A run whose engine refuses the stream (a feature it lacks) still ran some lines."""
    try:
        run(engine, stream)
    except Exception:  # noqa: BLE001 -- the lines it ran are what is measured
        pass


def lines_of_runs(engines: list, streams: list[Stream], tree: Path) -> list[Lines]:
    """The lines of ``tree`` each stream's runs on ``engines`` execute (coverage.py)."""
    import coverage

    from harness.loop.runner import run
    # A warm-up run first: what a process does once (imports, caches of model inspection)
    # would otherwise count as run by the first stream measured alone.
    for engine in engines:
        for stream in streams[:1]:
            _quietly(run, engine, stream)
    found = []
    for stream in streams:
        cov = coverage.Coverage(data_file=None, include=[f"{tree}/*"], branch=False)
        cov.start()
        try:
            for engine in engines:
                _quietly(run, engine, stream)
        finally:
            cov.stop()
        data = cov.get_data()
        found.append({str(Path(f).relative_to(tree.parent)): frozenset(data.lines(f) or ())
                      for f in data.measured_files()})
    return found


def _base_environment() -> dict[str, str]:
    """The environment of a process that runs the base release (the project's ``.venv``)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VLLM_CACHE_ROOT")}
    env["PYTHONPATH"] = str(ROOT)
    return env


def release_tree_and_env(release: str) -> tuple[Path, dict[str, str]]:
    """Where ``release``'s ``vllm/`` lies, and the environment of a process running it."""
    from harness.jobs import side_env
    if release == side_env.base_version("vllm"):
        dist = side_env._base_dist("vllm")
        return Path(str(dist.locate_file("vllm"))), _base_environment()
    side_env.ensure_overlay(release, log=lambda m: print(m, file=sys.stderr))
    return side_env.overlay_dir(release) / "vllm", side_env.overlay_environment(release)


def lines_in_release(release: str, streams: list[Stream]) -> tuple[Path, list[Lines]]:
    """Run ``streams`` on vLLM ``release`` in a process of its own environment."""
    tree, env = release_tree_and_env(release)
    with tempfile.TemporaryDirectory(prefix="suspects-") as scratch:
        src, dst = Path(scratch) / "streams.json", Path(scratch) / "lines.json"
        src.write_text(json.dumps([json.loads(canonical_json(s.to_json())) for s in streams]))
        # The lines come back in a file: vLLM may write to standard output.
        proc = subprocess.run([sys.executable, "-m", "harness.jobs.suspects", str(src), str(dst)],
                              env=env, capture_output=True, text=True, cwd=ROOT)
        if proc.returncode != 0 or not dst.exists():
            raise RuntimeError(f"the runs on vLLM {release} failed: "
                               + (proc.stderr.strip().splitlines() or ["?"])[-1])
        runs = json.loads(dst.read_text())
    return tree, [{p: frozenset(ls) for p, ls in r.items()} for r in runs]


# -- the diff -----------------------------------------------------------------------------

def hunks_of(path: str, old_tree: Path, new_tree: Path) -> list[Hunk]:
    """The hunks of one file (``path`` under ``vllm/``) between the two trees."""
    def read(tree: Path) -> list[str]:
        f = tree.parent / path
        return f.read_text(errors="replace").splitlines() if f.is_file() else []

    old, new = read(old_tree), read(new_tree)
    if old == new:
        return []
    found = []
    matcher = difflib.SequenceMatcher(None, old, new, autojunk=False)
    for group in matcher.get_grouped_opcodes(0):
        (_, i1, _, j1, _), (_, _, i2, _, j2) = group[0], group[-1]
        text = []
        for tag, a1, a2, b1, b2 in group:
            text += [f"-{line}" for line in old[a1:a2]] + [f"+{line}" for line in new[b1:b2]]
        found.append(Hunk(path, i1 + 1, i2 + 1, j1 + 1, j2 + 1, "\n".join(text)))
    return found


# -- the ranking --------------------------------------------------------------------------

def _ochiai(failed: int, total_failed: int, passed: int) -> float:
    """Ochiai's suspiciousness of a line run by ``failed`` of the ``total_failed`` diverging
    runs and by ``passed`` passing runs."""
    return failed / math.sqrt(total_failed * (failed + passed)) if failed else 0.0


def _file_rank(path: str) -> int:
    if path.startswith("vllm/v1/core/"):
        return 0
    if path.startswith("vllm/v1/engine/"):
        return 1
    return 2


def rank(hunks: list[Hunk], new_fail: list[Lines], new_pass: list[Lines],
         old_fail: list[Lines], old_pass: list[Lines]) -> list[Suspect]:
    """The hunks the diverging runs executed, best first (the first diverging run is the
    cause's example: a hunk it does not run is no suspect)."""
    suspects = []
    for h in hunks:
        if h.layout_only:
            continue
        best, ran = 0.0, 0
        for lo, hi, fail, passing in ((h.new_start, h.new_end, new_fail, new_pass),
                                      (h.old_start, h.old_end, old_fail, old_pass)):
            for line in range(lo, hi):
                if not fail or line not in fail[0].get(h.path, ()):
                    continue
                ran += 1
                failed = sum(line in f.get(h.path, ()) for f in fail)
                passed = sum(line in p.get(h.path, ()) for p in passing)
                best = max(best, _ochiai(failed, len(fail), passed))
        if ran:
            suspects.append(Suspect(h, best, ran))
    return sorted(suspects, key=lambda s: (-s.score, _file_rank(s.hunk.path), s.hunk.size,
                                           s.hunk.path, s.hunk.new_start))


def suspects(failing: list[Stream], near: list[Stream], passing: list[Stream],
             old_release: str) -> list[Suspect]:
    """The ranked hunks behind a cause: ``failing`` are streams it shows on (its example
    first), ``near`` the example's near misses and ``passing`` other streams that behave
    as before; the installed release against ``old_release``."""
    failing, near = failing[:FAILING], near[:PASSING]
    passing = near + passing[:PASSING - len(near)]
    streams = failing + passing
    new_tree = installed_tree()
    new_runs = lines_of_runs(vllm_engines(), streams, new_tree)
    old_tree, old_runs = lines_in_release(old_release, streams)
    files = set(new_runs[0]) | set(old_runs[0])
    hunks = [h for path in sorted(files) for h in hunks_of(path, old_tree, new_tree)]
    n = len(failing)
    return rank(hunks, new_runs[:n], new_runs[n:], old_runs[:n], old_runs[n:])


def stub(version: str, field: str, found: list[Suspect]) -> str:
    """A rule-change record to start from: the release and the best suspect's file."""
    mirrors = found[0].hunk.path if found else ""
    return (f'RuleChange(\n    "<name>", "{version}", "<PR>",\n'
            f'    "<what the new rule says; first differing field: {field}>",\n'
            f'    mirrors="{mirrors}",\n    applies_in=(),\n    matters_on=""),')


def markdown(found: list[Suspect], shown: int = SHOWN) -> list[str]:
    """The report's lines for one cause's suspects."""
    if not found:
        return ["No line of the diff between the two releases ran on the diverging stream."]
    lines = [f"{len(found)} suspect hunk(s) of vLLM's diff ran on the diverging stream; the "
             f"best {min(shown, len(found))}:", ""]
    for i, s in enumerate(found[:shown], 1):
        text = s.hunk.text.splitlines()
        cut = text[:HUNK_LINES] + ([f"... ({len(text) - HUNK_LINES} more lines)"]
                                   if len(text) > HUNK_LINES else [])
        lines += [f"{i}. `{s.hunk.where()}` (score {s.score:.2f}, {s.lines_run} line(s) run)",
                  "", "```diff", *cut, "```", ""]
    return lines


def _main(argv: list[str]) -> int:
    """In a release's own process: the executed lines of each stream of a JSON list
    (``argv[0]``), written as JSON to ``argv[1]``."""
    streams = [parse_stream(d) for d in json.loads(Path(argv[0]).read_text())]
    runs = lines_of_runs(vllm_engines(), streams, installed_tree())
    Path(argv[1]).write_text(json.dumps([{p: sorted(ls) for p, ls in r.items()} for r in runs]))
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
