"""The install an engine author makes: ``pip install -c constraints.txt -e .``, no vLLM, no
torch (``make test-engine-author`` runs these with the tests of the plug-in interface, the
line protocol, replay, check, profile, bad input and the docs' examples, docs/ci.md).

The declared dependencies are checked everywhere; the rest only where vLLM is not
installed (skipped with the reason in ``make test``'s environment, which has it).
"""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import json
import os
import re
import subprocess
import sys
import tomllib

import pytest

from harness.formats.paths import ROOT, STREAMS_DIR

REFERENCE = "harness.engines.reference_engine:ReferenceEngine"
STREAM = str(STREAMS_DIR / "seed_eos_4_1_1.json")

no_vllm = pytest.mark.skipif(
    importlib.util.find_spec("vllm") is not None,
    reason="vllm is installed here: this checks the install without it (make test-engine-author)")

#: Imported by the harness but not among its dependencies, by top-level module, and why.
NOT_DECLARED = {
    "vllm": "the [vllm] extra",
    "torch": "comes with vLLM (only harness/engines/ imports it)",
    "numpy": "comes with vLLM (only harness/engines/vllm_*.py import it)",
    "triton": "comes with vLLM (harness/engines/vllm_compat.py)",
    "ray": "comes with vLLM: fuzz --ray, a campaign of the vLLM engines",
    "matplotlib": "the [bench] extra (the plots of bench and workload --plot)",
    "hypofuzz": "its own environment, .venvs/hypofuzz (make fuzz-env)",
}


def _modules() -> list[tuple[str, str]]:
    """(module name, source) of every module of harness/ and reference/."""
    out = []
    for package in ("harness", "reference"):
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            out.append((".".join(parts[:-1] if parts[-1] == "__init__" else parts), path.read_text()))
    return out


def _imported_top_levels(source: str) -> set[str]:
    """Top-level names of the absolute imports of a module, those inside functions too."""
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names - set(sys.stdlib_module_names) - {"harness", "reference", "__future__"}


def _declared() -> set[str]:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return {re.split(r"[\s<>=!~\[;]", r, maxsplit=1)[0].lower().replace("_", "-")
            for r in pyproject["project"]["dependencies"]}


def test_every_package_the_harness_imports_is_a_declared_dependency():
    """A package that only arrives with another (packaging with pytest) is declared too."""
    by_module = importlib.metadata.packages_distributions()
    undeclared = {}
    for name, source in _modules():
        for top in _imported_top_levels(source) - set(NOT_DECLARED):
            dists = {d.lower().replace("_", "-") for d in by_module.get(top, [top])}
            if not dists & _declared():
                undeclared.setdefault(top, name)
    assert undeclared == {}, ("imported but not in pyproject.toml's dependencies (module: "
                              f"the first importer): {undeclared}")


@no_vllm
def test_neither_vllm_nor_torch_is_importable():
    for name in ("vllm", "torch"):
        proc = subprocess.run([sys.executable, "-c", f"import {name}"], capture_output=True,
                              text=True, timeout=60)
        assert proc.returncode == 1 and "ModuleNotFoundError" in proc.stderr, name


@no_vllm
def test_every_module_imports_without_vllm():
    """Every module but the vLLM adapters (harness/engines/vllm_*.py) imports here."""
    names = [n for n, _ in _modules() if not n.startswith("harness.engines.vllm_")]
    code = ("import importlib, json, sys\nfailed = {}\nfor n in sys.argv[1:]:\n"
            "    try:\n        importlib.import_module(n)\n"
            "    except Exception as e:\n        failed[n] = f'{type(e).__name__}: {e}'\n"
            "print(json.dumps([failed, 'vllm' in sys.modules or 'torch' in sys.modules]))\n")
    proc = subprocess.run([sys.executable, "-c", code, *names], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    failed, imported_vllm = json.loads(proc.stdout.splitlines()[-1])
    assert failed == {} and not imported_vllm


@no_vllm
def test_replay_with_the_reference_plugged_in_is_exit_0(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "harness", "replay", "--engine", REFERENCE],
                          cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ,
                               "HARNESS_COUNTEREXAMPLES": str(tmp_path / "counterexamples")})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert proc.stdout.splitlines()[-1].endswith(" match, 0 do not")


@no_vllm
@pytest.mark.parametrize("args", [
    ["check", STREAM],
    ["table", STREAM],
    ["trace", "--engine", "vllm", STREAM],
    ["conformance"],
    ["coverage", "--examples", "1"],
    ["gpu-check"],
    ["profile", "--engine", REFERENCE, "--against", "vllm", "--streams", "1",
     "--families", "preemption"],
], ids=lambda args: " ".join(a for a in args if a != STREAM))
def test_a_command_that_needs_vllm_says_so_in_one_line_and_exit_3(args, tmp_path):
    if args[0] == "profile":
        args = [*args, "-o", str(tmp_path / "profile")]
    proc = subprocess.run([sys.executable, "-m", "harness", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "HARNESS_COUNTEREXAMPLES": str(tmp_path / "kept")})
    assert proc.returncode == 3, proc.stderr[-2000:]
    assert proc.stderr.splitlines() == [
        "error: vLLM cannot be driven: vllm is not installed (pip install -e '.[vllm]')"]
