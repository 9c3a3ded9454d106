"""``python -m harness coverage``: what a campaign executes of vLLM's own code.

Runs a fuzz campaign (the main job's stream space, ``harness.campaign``) with
coverage.py watching the installed vLLM's ``v1/core`` package (the scheduler,
the KV cache manager, the coordinators, the per-type managers, the block
pool), and prints the share of each file's statements the campaign ran.  The
lines it never runs are what the strategies never reach: ``--missing`` lists
them.  Coverage starts before vLLM is imported, so module-level lines count.

vLLM is never imported here: its folder is found with ``importlib`` and the
campaign imports it under coverage.
"""

from __future__ import annotations

import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path

from harness.text import markdown_table

#: The files the issue tracker asks about first (hybrid KV cache groups).
KEY_FILES = ("single_type_kv_cache_manager.py", "kv_cache_coordinator.py")


@dataclass(frozen=True)
class FileCoverage:
    path: str  # relative to the vllm package, e.g. v1/core/block_pool.py
    statements: int
    executed: int
    missing: tuple[int, ...]

    @property
    def percent(self) -> float:
        return 100.0 * self.executed / self.statements if self.statements else 100.0


def vllm_core_dir() -> Path:
    """The installed vLLM's ``v1/core`` folder, found without importing vLLM."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("vllm is not installed")
    return Path(list(spec.submodule_search_locations)[0]) / "v1" / "core"


def measure(examples: int, seed: int | None, profile: str | None):
    """Run the campaign under coverage.py; (campaign result, per-file coverage)."""
    import coverage

    from harness.campaign import run_campaign
    core = vllm_core_dir()
    cov = coverage.Coverage(data_file=None, include=[str(core / "*"), str(core / "*" / "*")],
                            branch=False)
    cov.start()
    try:
        result = run_campaign(examples, seed, profile)
    finally:
        cov.stop()
    files = []
    for path in sorted(cov.get_data().measured_files()):
        _, statements, _, missing, _ = cov.analysis2(path)
        files.append(FileCoverage(str(Path(path).relative_to(core.parent.parent)),
                                  len(statements), len(statements) - len(missing),
                                  tuple(missing)))
    return result, files


def table(files: list[FileCoverage]) -> str:
    rows = [["vLLM file", "statements", "run", "share"]]
    rows += [[f.path, str(f.statements), str(f.executed), f"{f.percent:.0f}%"] for f in files]
    total = sum(f.statements for f in files)
    run = sum(f.executed for f in files)
    rows.append(["all of v1/core", str(total), str(run), f"{100.0 * run / max(total, 1):.0f}%"])
    return markdown_table(rows)


def coverage_command(examples: int, seed: int | None, profile: str | None, missing: bool,
                     as_json: bool) -> int:
    """The ``coverage`` command: 0 when the campaign was clean, 1 on a divergence."""
    from harness.campaign import summary_lines
    result, files = measure(examples, seed, profile)
    if as_json:
        print(json.dumps({"campaign": result.to_json(),
                          "files": [{"path": f.path, "statements": f.statements,
                                     "executed": f.executed, "percent": round(f.percent, 1),
                                     "missing": list(f.missing)} for f in files]},
                         sort_keys=True))
    else:
        print("\n".join(summary_lines(result)))
        print(f"\nvLLM {vllm_core_dir().parent.parent.name}/v1/core executed by "
              f"{result.stats.counts['streams']} streams:\n")
        print(table(files))
        if missing:
            for f in files:
                if f.missing:
                    print(f"{f.path}: never run: {_ranges(f.missing)}")
    if result.interrupted:
        return 130
    return 1 if result.divergence else 0


def _ranges(lines: tuple[int, ...]) -> str:
    """1, 2, 3, 7 -> '1-3, 7'."""
    runs: list[list[int]] = []
    for n in lines:
        if runs and n == runs[-1][1] + 1:
            runs[-1][1] = n
        else:
            runs.append([n, n])
    return ", ".join(f"{a}-{b}" if b != a else f"{a}" for a, b in runs)
