"""The harness's structure: layers that only point down, and one vLLM boundary.

Every module of ``harness/`` sits in one layer below; a module may import
only modules of lower layers (imports inside functions count too).  A new
module must be placed here, which makes its place in the structure a decision.
Everything that imports ``vllm`` or ``torch`` lives under ``harness/engines/``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from harness.paths import ROOT

LAYERS: list[tuple[str, ...]] = [
    # foundations: files and atomic writes, the mutant record, named divergences, counters,
    # hypothesis profiles
    ("paths", "patches", "stats", "profiles", "text", "engines.findings"),
    # side environments of other vLLM releases (no vLLM import); the sites of rules a run
    # goes through; the reference rendered for one release
    ("sideenv", "decided", "render"),
    # the input format; the reference's mutants (they patch only the reference)
    ("stream", "mutants.rules"),
    # the engine interface, kept streams, vLLM's environment, engines plugged in by name
    ("steps", "counterexamples", "engines.vllm_env", "engines.plugin"),
    # the scripted model, traces, the reference engine, vLLM's moved API, the scripted
    # KV connector inside vLLM, an engine in another process
    ("model", "trace", "engines.reference_engine", "engines.vllm_compat",
     "engines.vllm_connector", "engines.line_protocol"),
    # the vLLM engine and its KV sizing; the step loop, the diff, the strategies
    ("engines.vllm_adapter", "engines.vllm_kv_sizing", "runner", "diff", "strategies"),
    # vLLM's own engine loop over the vLLM engine's parts; vLLM's scheduler in a bare loop
    ("engines.vllm_core", "engines.vllm_bare"),
    # engines by name (and vLLM's sizing by model), vLLM's mutants
    ("engines", "engines.vllm_mutants"),
    # public request traces as streams, what they ask of the KV cache, and the real-traffic
    # property's strategy
    ("workloads",),
    # comparing engines, the KV sizing check, recorded traces, tables, the property
    # registry, the mutant catalogue
    ("conformance", "kv_sizing_check", "golden", "table", "properties", "mutants"),
    # a campaign cut into chunks; where chunks run (this process, forked workers, Ray)
    ("chunks",),
    ("workers",),
    # campaigns and the mutant hunt; an engine's conformance per family of rules
    ("campaign", "reach", "upgrade", "capture", "conformance_profile"),
    # the upgrade check from the base environment; the benchmark (it times campaigns);
    # portable fixture sets (run inside a side environment when asked for another release);
    # the page of rule changes release by release
    ("upgrade_check", "mutants.hunt", "code_coverage", "bench", "export", "changelog"),
    # the main job; the race of local fuzzers (it writes into the benchmark's report);
    # HypoFuzz's command, mended
    ("conformance_job", "fuzzer_race", "hypofuzz_run"),
    # the command line
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
        assert sorted(m.strip("` ") for m in row.split("|")[2].split(",")) == sorted(group), i
