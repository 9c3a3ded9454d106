"""``python -m harness coverage``: what a campaign executes of vLLM's own code.

Runs a fuzz campaign (the main job's stream space, ``harness.jobs.campaign``) with
coverage.py watching the installed vLLM's ``v1/core`` package (the scheduler,
the async scheduler, the KV cache manager, the coordinators, the per-type
managers, the block pool) and, when the campaign runs the ``vllm-core`` engine,
``v1/engine/core.py`` (EngineCore's loop), and prints the share of each file's
statements the campaign ran, and of EngineCore's step functions.  The
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

from harness.formats.text import markdown_table

#: The files the issue tracker asks about first (hybrid KV cache groups).
KEY_FILES = ("single_type_kv_cache_manager.py", "kv_cache_coordinator.py")

#: EngineCore's step functions, measured on their own (the rest of core.py is start-up,
#: the busy loop's processes and RPCs, which the vllm-core engine does not run).
ENGINE_CORE_FUNCTIONS = ("step", "post_step", "step_with_batch_queue")


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
    from harness.engines import EngineUnavailable
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        raise EngineUnavailable("vLLM cannot be driven: vllm is not installed "
                                "(pip install -e '.[vllm]')")
    return Path(list(spec.submodule_search_locations)[0]) / "v1" / "core"


def measure(examples: int, seed: int | None, profile: str | None,
            engines: tuple[str, ...] = ("vllm",)):
    """Run the campaign under coverage.py; (campaign result, per-file coverage, and the
    coverage of EngineCore's step functions, empty unless vllm-core ran)."""
    import coverage

    from harness.jobs.campaign import run_campaign
    core = vllm_core_dir()
    engine_core = core.parent / "engine" / "core.py"
    include = [str(core / "*"), str(core / "*" / "*")]
    if "vllm-core" in engines:
        include.append(str(engine_core))
    cov = coverage.Coverage(data_file=None, include=include, branch=False)
    cov.start()
    try:
        result = run_campaign(examples, seed, profile, engines)
    finally:
        cov.stop()
    files, functions = [], []
    for path in sorted(cov.get_data().measured_files()):
        _, statements, _, missing, _ = cov.analysis2(path)
        rel = str(Path(path).relative_to(core.parent.parent))
        files.append(FileCoverage(rel, len(statements), len(statements) - len(missing),
                                  tuple(missing)))
        if Path(path) == engine_core:
            functions = _function_coverage(path, rel, statements, missing)
    return result, files, functions


def _function_coverage(path: str, rel: str, statements, missing) -> list[FileCoverage]:
    """EngineCore's step functions' statements, as the file's were counted (the functions
    are found in the file's syntax tree: vLLM is not imported here)."""
    import ast
    tree = ast.parse(Path(path).read_text())
    engine_core = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "EngineCore")
    spans = {f.name: range(f.lineno, f.end_lineno + 1) for f in engine_core.body
             if isinstance(f, ast.FunctionDef)}
    out = []
    for name in ENGINE_CORE_FUNCTIONS:
        own = [n for n in statements if n in spans[name]]
        gone = tuple(n for n in missing if n in spans[name])
        out.append(FileCoverage(f"{rel}: EngineCore.{name}", len(own), len(own) - len(gone),
                                gone))
    return out


def table(files: list[FileCoverage]) -> str:
    rows = [["vLLM file", "statements", "run", "share"]]
    rows += [[f.path, str(f.statements), str(f.executed), f"{f.percent:.0f}%"] for f in files]
    core = [f for f in files if f.path.startswith("v1/core/")]
    total = sum(f.statements for f in core)
    run = sum(f.executed for f in core)
    rows.append(["all of v1/core", str(total), str(run), f"{100.0 * run / max(total, 1):.0f}%"])
    return markdown_table(rows)


def coverage_command(examples: int, seed: int | None, profile: str | None, missing: bool,
                     as_json: bool, engines: list[str] | None = None) -> int:
    """The ``coverage`` command: 0 when the campaign was clean, 1 on a divergence."""
    from harness.jobs.campaign import summary_lines
    result, files, functions = measure(examples, seed, profile, tuple(engines or ["vllm"]))

    def rows(items):
        return [{"path": f.path, "statements": f.statements, "executed": f.executed,
                 "percent": round(f.percent, 1), "missing": list(f.missing)} for f in items]
    if as_json:
        print(json.dumps({"campaign": result.to_json(), "files": rows(files),
                          "functions": rows(functions)}, sort_keys=True))
    else:
        print("\n".join(summary_lines(result)))
        print(f"\nvLLM {vllm_core_dir().parent.parent.name}/v1/core executed by "
              f"{result.stats.counts['streams']} streams:\n")
        print(table(files))
        if functions:
            print("\nEngineCore's step functions (engine vllm-core):\n")
            print(markdown_table([["function", "statements", "run", "share"]] + [
                [f.path.split(": ")[1], str(f.statements), str(f.executed),
                 f"{f.percent:.0f}%"] for f in functions]))
        if missing:
            for f in files + functions:
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
