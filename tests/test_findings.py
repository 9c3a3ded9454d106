"""The vLLM defects of docs/findings.md, reproduced with the installed vLLM.

Each ``docs/findings/<finding>.py`` is a standalone script built on vLLM's own classes
(it imports nothing from this project).  It prints one line ``DEFECT: ...`` and exits 1
when the defect shows, or ``OK: ...`` and exits 0 when vLLM behaves as expected.  Its
module-level ``FIXED_IN`` names the first release where it no longer shows (``None``: no
release fixes it yet), and ``SINCE``, where a script has it, the first release where it
shows (0.11.0 otherwise); the doc's per-release table says the same.  Here each script
runs under this interpreter (so with a release overlay too, when one is on
``PYTHONPATH``) and must give the outcome they state for the installed release; the
scripts share one import of vLLM (harness.engines.findings), and one of them also runs on its
own to show that this changes nothing.
"""

from __future__ import annotations

import ast
import importlib.metadata
import json
import re
import subprocess
import sys

import pytest
from packaging.version import Version

from harness.paths import DOCS_DIR, ROOT

FINDINGS_DIR = DOCS_DIR / "findings"
SCRIPTS = sorted(FINDINGS_DIR.glob("*.py"))
LINE = re.compile(r"^(DEFECT|OK): vLLM (\S+): ")


def constant(script, name: str, default=KeyError):
    """A module-level constant of the script, read without running it."""
    for node in ast.parse(script.read_text()).body:
        if isinstance(node, ast.Assign) and [t.id for t in node.targets
                                             if isinstance(t, ast.Name)] == [name]:
            return ast.literal_eval(node.value)
    if default is KeyError:
        raise AssertionError(f"{script.name}: no module-level {name}")
    return default


def fixed_in(script) -> str | None:
    return constant(script, "FIXED_IN")


def since(script) -> str:
    return constant(script, "SINCE", "0.11.0")


def expected_outcome(installed: str, fixed: str | None, first: str = "0.11.0") -> str:
    shows = Version(first) <= Version(installed) and (
        fixed is None or Version(installed) < Version(fixed))
    return "DEFECT" if shows else "OK"


def test_there_are_findings():
    assert len(SCRIPTS) >= 8


def test_expected_outcome():
    assert expected_outcome("0.11.0", "0.11.1") == "DEFECT"
    assert expected_outcome("0.11.1", "0.11.1") == "OK"
    assert expected_outcome("0.33.0", None) == "DEFECT"
    assert expected_outcome("0.13.0", "0.14.0") == "DEFECT"
    assert expected_outcome("0.15.1", None, "0.16.0") == "OK"
    assert expected_outcome("0.16.0", None, "0.16.0") == "DEFECT"


@pytest.mark.parametrize("script", SCRIPTS, ids=[s.stem for s in SCRIPTS])
def test_each_script_is_in_the_doc_with_its_fix(script):
    """docs/findings.md links every script and names the release FIXED_IN gives."""
    doc = (DOCS_DIR / "findings.md").read_text()
    if f"findings/{script.name}" not in doc:
        pending = re.findall(r"^## (.+)\n\n\(being written\)\n", doc, re.M)
        if pending:  # its author links it when the section is written
            pytest.skip(f"{script.name}: not linked yet; sections being written: {pending}")
        raise AssertionError(f"docs/findings.md does not link findings/{script.name}")
    fixed = fixed_in(script)
    section = doc.split(f"findings/{script.name}", 1)[0].rsplit("\n## ", 1)[1]
    assert ("not fixed" in section.lower()) if fixed is None else (fixed in section), (
        f"{script.name}: FIXED_IN {fixed!r} is not what its section of docs/findings.md says")
    assert since(script) in section or since(script) == "0.11.0"


def test_each_script_stands_alone():
    """A report's reproduction imports vLLM and the standard library only."""
    for script in SCRIPTS:
        for node in ast.walk(ast.parse(script.read_text())):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                         else [node.module or ""])
                for name in names:
                    assert not name.split(".")[0] in ("harness", "reference", "tests"), (
                        f"{script.name} imports {name}")


@pytest.fixture(scope="module")
def outcomes():
    """Every script's run under this interpreter (with a release overlay too, when one is
    on ``PYTHONPATH``), vLLM imported once for all (harness.engines.findings)."""
    proc = subprocess.run([sys.executable, "-m", "harness.engines.findings", *map(str, SCRIPTS)],
                          cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.splitlines()[-1])


@pytest.mark.needs_vllm
@pytest.mark.slow
@pytest.mark.xdist_group("findings")  # one worker imports vLLM once for every script
@pytest.mark.parametrize("script", SCRIPTS, ids=[s.stem for s in SCRIPTS])
def test_script_outcome_matches_the_installed_release(script, outcomes):
    installed = importlib.metadata.version("vllm")
    expected = expected_outcome(installed, fixed_in(script), since(script))
    ran = outcomes[script.name]
    lines = [m for m in map(LINE.match, ran["stdout"].splitlines()) if m]
    assert len(lines) == 1, f"{script.name}: {ran['stdout'][-2000:]}{ran['stderr'][-2000:]}"
    outcome, version = lines[0].group(1), lines[0].group(2)
    assert version == installed
    assert outcome == expected, f"{script.name} on vLLM {installed}: {ran['stdout'][-1500:]}"
    assert ran["returncode"] == (1 if outcome == "DEFECT" else 0), ran["stderr"][-2000:]


@pytest.mark.needs_vllm
@pytest.mark.slow
@pytest.mark.xdist_group("findings")
def test_a_script_runs_the_same_on_its_own(outcomes):
    """The forked runner gives what ``python <script>`` gives (one script, run both ways)."""
    script = FINDINGS_DIR / "null_page_cached.py"
    alone = subprocess.run([sys.executable, str(script)], cwd=ROOT, capture_output=True,
                           text=True, timeout=300)
    ran = outcomes[script.name]
    assert (ran["returncode"], ran["stdout"]) == (alone.returncode, alone.stdout)
