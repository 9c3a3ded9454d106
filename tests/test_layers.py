"""The harness's structure: layers that only point down, and one vLLM boundary.

Every module of ``harness/`` sits in one layer below; a module may import
only modules of lower layers (imports inside functions count too).  A new
module must be placed here, which makes its place in the structure a decision.
Everything that imports ``vllm`` or ``torch`` lives under ``harness/engines/``.
"""

from __future__ import annotations

import ast
from pathlib import Path

from harness.formats.paths import ROOT

#: The folders of ``harness/``, lowest first.  A module imports only from folders below its
#: own, or from lower layers of its own folder: formats know no engine, engines know no
#: step loop, and the checks know no job.
FOLDERS = ("formats", "engines", "loop", "checks", "jobs", "cli")

LAYERS: list[tuple[str, ...]] = [
    # formats: files and atomic writes, aligned tables, rule counters, the mutant record
    ("formats", "formats.paths", "formats.text", "formats.rule_counters", "formats.mutant"),
    # the stream format: its JSON Schema, then its records and the rules across fields;
    # which reference (interpreted or compiled) a process imports
    ("formats.stream_schema", "formats.compiled"),
    ("formats.stream",),
    # the step records, kept streams, public request traces cut into streams
    ("formats.steps", "formats.counterexamples", "formats.public_traces", "formats.features"),
    # the scripted model, traces
    ("formats.scripted_model", "formats.trace"),
    # engines: the finding scripts, engines plugged in by name, the reference engine,
    # vLLM's offline environment
    ("engines.findings", "engines.plugin", "engines.reference_engine", "engines.vllm_env",
     "engines.kit"),
    # the reference's scheduler in a bare loop (the benchmark's yardstick)
    ("engines.reference_bare",),
    # an engine in another process, vLLM's moved API, the scripted KV connector inside
    # vLLM, vLLM's mutants
    ("engines.line_protocol", "engines.vllm_compat", "engines.vllm_connector",
     "engines.vllm_mutants"),
    # the vLLM engine and its KV sizing
    ("engines.vllm_adapter", "engines.vllm_kv_sizing"),
    # vLLM's own engine loop over the vLLM engine's parts; vLLM's scheduler in a bare loop
    ("engines.vllm_bare", "engines.vllm_core"),
    # engines by name
    ("engines",),
    # loop: one stream through engines, step by step
    ("loop", "loop.runner"),
    # checks: the diff, KV sizing, the seed table, hypothesis profiles, where rules are
    # decided, the mutants' registry and the streams they apply to
    ("checks", "checks.diff", "checks.kv_sizing", "checks.seed_table", "checks.profiles",
     "checks.rule_watch", "checks.mutants.registry", "checks.mutants.applies"),
    # fidelity levels: what of two traces is compared; simulators' design differences;
    # the strategies' draws (with the profiles' pin of hypothesis's local constants)
    ("checks.levels", "checks.designs", "checks.strategies.draws"),
    # comparing engines on one stream; recorded traces; the mutants by part of vLLM;
    # configs
    ("checks.conformance", "checks.golden", "checks.mutants.kv_cache",
     "checks.mutants.scheduler", "checks.mutants.kv_sizing", "checks.mutants.equivalent",
     "checks.mutants.inputs", "checks.mutants.engine_loop", "checks.mutants.releases",
     "checks.strategies.configs"),
    ("checks.mutants.reports", "checks.strategies.streams",
     "checks.strategies.real_workloads"),
    # the mutant catalogue; the strategies by family
    ("checks.mutants", "checks.strategies.scheduling", "checks.strategies.kv_groups",
     "checks.strategies.inputs"),
    ("checks.strategies.engine_loop",),
    ("checks.strategies.whole_space",),
    ("checks.strategies",),
    # the registry of conformance properties
    ("checks.properties",),
    # jobs: a campaign cut into chunks; captures; the page of rule changes; an engine's
    # profile; HypoFuzz's command; rendered releases; the rule report; side environments;
    # what streams ask of the KV cache; the compiled reference's build
    ("jobs", "jobs.chunks", "jobs.capture", "jobs.changelog", "jobs.engine_profile",
     "jobs.hypofuzz_run", "jobs.render", "jobs.rule_report", "jobs.side_env",
     "jobs.workload_report", "jobs.compile_reference"),
    # the suspect lines of an unexplained divergence (it runs the old release in its side
    # environment)
    ("jobs.suspects", "jobs.certify"),
    # where chunks run; portable fixture sets; the upgrade check inside a newer release and
    # from the base environment
    ("jobs.workers", "jobs.export", "jobs.upgrade_campaign", "jobs.upgrade_check"),
    # the fuzz campaign
    ("jobs.campaign",),
    # the benchmark, reach of vLLM's code, the main job, the mutant hunt
    ("jobs.bench", "jobs.code_coverage", "jobs.main_job", "jobs.mutant_hunt"),
    # the race of local fuzzers (it writes into the benchmark's report)
    ("jobs.fuzzer_race",),
    # cli: what the command line accepts, the commands, the parser
    ("cli.arguments",),
    ("cli.commands",),
    ("cli.main",),
    ("cli",),
    ("__main__",),
]

HARNESS = ROOT / "harness"
BOUNDARY = HARNESS / "engines"
FORBIDDEN_OUTSIDE_BOUNDARY = {"vllm", "torch"}


def module_name(path: Path) -> str:
    parts = path.relative_to(HARNESS).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(HARNESS.rglob("*.py")) if module_name(p)}


def imports(path: Path) -> list[str]:
    """Every module an import statement of ``path`` loads, anywhere in it.

    ``from a.b import c`` loads ``a.b.c`` when that is a harness module, else ``a.b``.
    """
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                names.append(full if full.removeprefix("harness.") in MODULES else node.module)
    return names


def harness_imports(path: Path) -> set[str]:
    """The harness modules ``path`` imports (``from harness.x import y`` counts y if it is
    one).  Importing a module of a package runs the package's ``__init__`` first, so
    ``harness.engines.plugin`` counts ``harness.engines`` too."""
    own = module_name(path)
    found = set()
    for name in imports(path):
        if name.startswith("harness."):
            parts = name.removeprefix("harness.").split(".")
            for i in range(1, len(parts) + 1):
                short = ".".join(parts[:i])
                if short in MODULES and short != own and not own.startswith(short + "."):
                    found.add(short)
    return found


def layer_of() -> dict[str, int]:
    return {m: i for i, group in enumerate(LAYERS) for m in group}


def folder_of(module: str) -> str:
    """The folder a module lives in (``__main__`` sits above them all)."""
    return module.split(".")[0] if module != "__main__" else "cli"


def test_every_folder_is_a_band_of_layers():
    """Each layer lies in one folder, and the folders come in FOLDERS' order: so an import
    that points down a layer never points up a folder."""
    order = [FOLDERS.index(folder_of(m)) for group in LAYERS for m in group]
    assert order == sorted(order)
    on_disk = {p.name for p in HARNESS.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert on_disk == set(FOLDERS)
    loose = sorted(p.name for p in HARNESS.glob("*.py") if p.name not in ("__init__.py",
                                                                          "__main__.py"))
    assert not loose, f"modules outside the folders: {loose}"


def test_every_module_has_a_layer():
    placed = layer_of()
    assert set(MODULES) == set(placed), (
        f"unplaced: {sorted(set(MODULES) - set(placed))}; "
        f"gone: {sorted(set(placed) - set(MODULES))}")


def test_imports_only_point_down():
    layer = layer_of()
    upward = []
    for name, path in sorted(MODULES.items()):
        up = sorted(t for t in harness_imports(path) if layer[t] >= layer[name])
        if up:
            upward.append(f"harness.{name} (layer {layer[name]}) imports {up} from its layer or above")
    assert not upward, "\n".join(upward)


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A cycle of ``graph`` as a path that ends where it starts, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt, path + [nxt])):
                return cycle
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node, [node])):
            return cycle
    return None


def test_no_import_cycle():
    cycle = find_cycle({m: harness_imports(p) for m, p in MODULES.items()})
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_cycle_check_can_fail():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


def forbidden_imports(path: Path) -> list[str]:
    return [n for n in imports(path) if n.split(".")[0] in FORBIDDEN_OUTSIDE_BOUNDARY]


def test_vllm_and_torch_only_under_engines():
    outside = [p for p in HARNESS.rglob("*.py") if BOUNDARY not in p.parents]
    tests = list((ROOT / "tests").rglob("*.py")) + [ROOT / "conftest.py"]
    leaks = {str(p.relative_to(ROOT)): forbidden_imports(p) for p in outside + tests}
    assert not {p: names for p, names in leaks.items() if names}


def test_the_boundary_check_can_fail(tmp_path):
    leaky = tmp_path / "leaky.py"
    leaky.write_text("import torch\n\ndef f():\n    from vllm.v1.core import block_pool\n")
    assert forbidden_imports(leaky) == ["torch", "vllm.v1.core"]


def test_architecture_doc_lists_the_same_layers():
    doc = (ROOT / "docs" / "architecture.md").read_text()
    for i, group in enumerate(LAYERS):
        row = next((line for line in doc.splitlines() if line.startswith(f"| {i} |")), "")
        cells = row.split("|")
        assert sorted(m.strip("` ") for m in cells[3].split(",")) == sorted(group), i
        assert cells[2].strip(" `/") == (folder_of(group[0]) if group[0] != "__main__"
                                         else "(top)"), i
