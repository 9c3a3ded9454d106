"""The reference imports only the standard library, and runs where vLLM cannot be imported."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FORBIDDEN = {"vllm", "torch", "numpy", "transformers", "harness"}


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_reference_imports_only_the_standard_library():
    for path in sorted((ROOT / "reference").glob("*.py")):
        for name in imported_modules(path) - {"reference"}:
            assert name not in FORBIDDEN, f"{path.name} imports {name}"
            assert name in sys.stdlib_module_names, f"{path.name} imports non-stdlib {name}"


def test_reference_engine_runs_with_vllm_unimportable(tmp_path):
    script = (
        "import sys\n"
        "sys.modules['vllm'] = None; sys.modules['torch'] = None\n"
        "from harness.cli import main\n"
        "sys.exit(main(['trace', '--engine', 'reference', 'fixtures/streams']))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, env=dict(os.environ, HARNESS_COUNTEREXAMPLES=str(tmp_path)))
    # The reference fails exactly where vLLM 0.11.0 does (reference.quirks: NULL_PAGE_CACHED).
    recorded = ROOT / "fixtures" / "traces" / "vllm-0.11.0"
    vllm_crashes = {p.stem for p in recorded.glob("*.json")
                    if json.loads(p.read_text())["verdict"] == "engine_failure"}
    failed = set(re.findall(r"^(\S+): reference failed at step", done.stderr, re.MULTILINE))
    assert vllm_crashes and failed == vllm_crashes, done.stderr[-2000:]
    assert done.returncode == 1
    assert done.stdout.count("\n") == len(list((ROOT / "fixtures" / "streams").glob("*.json")))
