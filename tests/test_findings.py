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

The findings open in the newest release each have a short reproduction of their own,
``docs/findings/newest/<finding>.py``, written against that release's API only (no
shims, no private state): run here under its overlay (``make newest-env``), each must
still show its defect, print the line docs/findings.md shows, and stop showing it once
the page's suggested patch is applied to the overlay.  The open part of the page follows
vLLM's bug-report template, heading by heading.
"""

from __future__ import annotations

import ast
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys

import pytest
from packaging.version import Version

from harness.formats.paths import DOCS_DIR, ROOT

FINDINGS_DIR = DOCS_DIR / "findings"
SCRIPTS = sorted(FINDINGS_DIR.glob("*.py"))
LINE = re.compile(r"^(DEFECT|OK): vLLM (\S+): ")

#: The newest release the project describes; its open findings' short reproductions.
NEWEST_RELEASE = "0.34.0"
NEWEST = sorted((FINDINGS_DIR / "newest").glob("*.py"))
OPEN_PART = f"\n## Open in vLLM {NEWEST_RELEASE}"
#: The headings of vLLM's bug-report template every open finding has (as ``#### ...``).
TEMPLATE = ("Environment", "Describe the bug", "Command and full output", "Expected vs actual",
            "Deployment that triggers it", "Related upstream issues and PRs", "Suggested patch")


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
    section = re.split(r"\n#{2,3} ", doc.split(f"findings/{script.name}", 1)[0])[-1]
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


# -- the open findings: the template, and the short reproductions on the newest release --

def open_findings() -> dict[str, str]:
    """{title: text} of each finding (``### ``) in the page's open part."""
    doc = (DOCS_DIR / "findings.md").read_text()
    assert OPEN_PART in doc, f"docs/findings.md has no part {OPEN_PART.strip()!r}"
    part = doc.split(OPEN_PART, 1)[1].split("\n## ", 1)[0]
    return {chunk.split("\n", 1)[0]: chunk for chunk in part.split("\n### ")[1:]}


def finding_of(script) -> str:
    """The text of the open finding that links the short reproduction ``script``."""
    found = [text for text in open_findings().values() if f"findings/newest/{script.name}" in text]
    assert len(found) == 1, f"{script.name}: linked by {len(found)} open findings, not one"
    return found[0]


def test_open_findings_follow_the_template():
    """Every open finding has each heading of the template, in order, links one short
    reproduction that exists, and its command block runs that script."""
    findings = open_findings()
    assert findings
    for title, text in findings.items():
        at = [text.find(f"\n#### {heading}") for heading in TEMPLATE]
        assert -1 not in at, f"{title}: no heading(s) {[h for h, i in zip(TEMPLATE, at) if i < 0]}"
        assert at == sorted(at), f"{title}: the template's headings are out of order"
        linked = set(re.findall(r"findings/newest/(\w+\.py)", text))
        assert len(linked) == 1, f"{title}: links {sorted(linked)}, not one short reproduction"
        assert (FINDINGS_DIR / "newest" / linked.pop()).exists()
        command = text[at[2]:at[3]]
        assert "docs/findings/newest/" in command and "DEFECT: vLLM" in command, title
        assert "```diff" in text[at[6]:], f"{title}: the suggested patch is not a diff"
    assert {s.name for s in NEWEST} == {
        n for t in findings.values() for n in re.findall(r"findings/newest/(\w+\.py)", t)}


@pytest.mark.parametrize("script", NEWEST, ids=[s.stem for s in NEWEST])
def test_newest_script_is_short_and_plain(script):
    """About 60 lines against one release's API: no shims that drop arguments, no
    project imports, no writes to the scheduler's private state."""
    text = script.read_text()
    assert len(text.splitlines()) <= 65, f"{script.name}: {len(text.splitlines())} lines"
    assert constant(script, "RELEASE") == NEWEST_RELEASE
    assert "inspect" not in text and "signature(" not in text, f"{script.name}: a shim"
    assert not re.search(r"\bscheduler\.\w+\s*=|\bscheduler\._\w+", text), script.name
    assert not re.search(r"^\s*(from|import) (harness|reference|tests)\b", text, re.M)


@pytest.fixture(scope="module")
def newest_env():
    """The environment of a process that runs the newest release from its overlay."""
    from harness.jobs.side_env import overlay_dir, overlay_environment
    if not (overlay_dir(NEWEST_RELEASE) / ".complete").exists():
        pytest.skip(f"no vLLM {NEWEST_RELEASE} overlay in .venvs/: run `make newest-env`")
    return overlay_environment(NEWEST_RELEASE)


def run_newest(script, env) -> tuple[subprocess.CompletedProcess, re.Match]:
    proc = subprocess.run([sys.executable, str(script)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    lines = [m for m in map(LINE.match, proc.stdout.splitlines()) if m]
    assert len(lines) == 1, f"{script.name}: {proc.stdout[-2000:]}{proc.stderr[-2000:]}"
    assert lines[0].group(2) == NEWEST_RELEASE
    return proc, lines[0]


@pytest.mark.needs_vllm
@pytest.mark.slow
@pytest.mark.parametrize("script", NEWEST, ids=[s.stem for s in NEWEST])
def test_newest_script_shows_its_defect(script, newest_env):
    """Each open finding's short reproduction shows its defect on the newest release, and
    prints the very line the page shows."""
    proc, line = run_newest(script, newest_env)
    assert line.group(1) == "DEFECT", proc.stdout[-1500:]
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert line.string in finding_of(script), (
        f"{script.name}: docs/findings.md does not show its output line {line.string!r}")


@pytest.mark.needs_vllm
@pytest.mark.slow
@pytest.mark.parametrize("script", NEWEST, ids=[s.stem for s in NEWEST])
def test_suggested_patch_makes_the_newest_script_pass(script, newest_env, tmp_path):
    """The finding's suggested patch applies to the newest release's files, and with it
    the short reproduction prints OK: the overlay is mirrored (links) into a temporary
    folder, the patched files copied, the diff applied with ``patch -p1``."""
    if shutil.which("patch") is None:
        pytest.skip("no `patch` program on this machine")
    text = finding_of(script)
    diff = text.split("\n#### Suggested patch", 1)[1].split("```diff\n", 1)[1].split("\n```", 1)[0]
    from harness.jobs.side_env import overlay_dir
    overlay = overlay_dir(NEWEST_RELEASE)
    patched = tmp_path / overlay.name
    shutil.copytree(overlay, patched, symlinks=True, copy_function=os.symlink,
                    ignore=shutil.ignore_patterns("__pycache__"))
    for name in re.findall(r"^\+\+\+ b/(\S+)", diff, re.M):
        (patched / name).unlink()
        shutil.copyfile(overlay / name, patched / name)
    applied = subprocess.run(["patch", "-p1", "-d", str(patched)], input=diff + "\n",
                             capture_output=True, text=True)
    assert applied.returncode == 0, applied.stdout + applied.stderr
    env = dict(newest_env)
    env["PYTHONPATH"] = env["PYTHONPATH"].replace(str(overlay), str(patched), 1)
    proc, line = run_newest(script, env)
    assert (line.group(1), proc.returncode) == ("OK", 0), proc.stdout[-1500:]
