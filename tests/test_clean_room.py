"""The reference imports only the standard library, and runs where vLLM cannot be imported."""

from __future__ import annotations

import ast
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


def test_reference_engine_runs_with_vllm_unimportable():
    script = (
        "import sys\n"
        "sys.modules['vllm'] = None; sys.modules['torch'] = None\n"
        "from harness.cli import main\n"
        "sys.exit(main(['trace', '--engine', 'reference', 'fixtures/streams']))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.count("\n") == len(list((ROOT / "fixtures" / "streams").glob("*.json")))
