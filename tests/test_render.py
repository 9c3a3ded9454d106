"""The rendered releases (harness/jobs/render.py, docs/releases/): each is the reference.

A release's rendered modules replace ``reference/`` in a fresh process and replay every
recorded trace of that release exactly; a rendering with one rule answered wrong does
not.  The committed pages are what a fresh render writes, and every hunk of every diff
page comes from a named rule change.  No vLLM needed.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import pytest

from harness.jobs import render
from harness.formats.paths import ROOT, TRACES_DIR
from reference import releases

RECORDED = sorted((p.name.removeprefix("vllm-") for p in TRACES_DIR.glob("vllm-*")),
                  key=releases.order)


def replay_rendered(files: dict[str, str], release: str, tmp_path) -> subprocess.CompletedProcess:
    """Replay ``release``'s recorded traces with ``files`` as the ``reference`` package."""
    package = tmp_path / "reference"
    package.mkdir()
    for name, text in files.items():
        (package / name).write_text(text)
    shutil.copy(render.REFERENCE_DIR / "releases.py", package)  # the registry the engine reads
    code = ("import sys\nfrom pathlib import Path\nimport reference\n"
            f"assert Path(reference.__file__).parent == Path({str(package)!r})\n"
            "from harness.checks.golden import replay\n"
            f"sys.exit(replay(Path({str(TRACES_DIR / f'vllm-{release}')!r})))\n")
    return subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                          text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"})


#: make test-fast replays the base and the newest rendering; make test every one.
ENDS = (releases.RELEASES[0], releases.RELEASES[-1])


@pytest.mark.parametrize("release", [r if r in ENDS else pytest.param(r, marks=pytest.mark.slow)
                                     for r in RECORDED])
def test_a_rendered_release_replays_its_own_traces(release, tmp_path):
    done = replay_rendered(render.render(release), release, tmp_path)
    traces = len(list((TRACES_DIR / f"vllm-{release}").glob("*.json")))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert done.stdout.strip().endswith(f"{traces} match, 0 do not")


@pytest.mark.slow
def test_a_rendering_with_one_rule_answered_wrong_does_not_replay(tmp_path):
    """0.34.0 rendered as if a priority victim still kept its grant (0.11.0's rule)."""
    rules = releases.rules_of("0.34.0") - {"priority_victim_loses_its_grant"}
    done = replay_rendered(render.render_rules(rules), "0.34.0", tmp_path)
    assert done.returncode == 1
    assert "priority_preempt_already_scheduled_quirk.json: DIVERGENCE" in done.stdout


@pytest.mark.parametrize("release", [releases.RELEASES[0], releases.RELEASES[-1]])
def test_a_rendering_asks_nothing(release):
    for name, text in render.render(release).items():
        assert "has(" not in text, name
        assert not re.search(r"\b(HasRule|only_0_11_0)\b", text), name
        compile(text, name, "exec")


@pytest.mark.slow
@pytest.mark.xdist_group("render_pages")  # one worker renders the pages for both tests
def test_every_hunk_comes_from_a_named_change():
    pairs = zip(releases.RELEASES, releases.RELEASES[1:])
    unnamed = [f"{a} to {b}: {h.module}: {h.lines[-1]!r}"
               for a, b in pairs for h in render.attributed_diff(a, b) if not h.changes]
    assert not unnamed


def test_a_hunk_of_no_named_change_is_caught(monkeypatch):
    """With one change of 0.33.0 to 0.34.0 left out of the attribution, its hunk is
    named by none, and the page says so."""
    left_out = "threshold_needs_chunked_prefill"
    changes_between = releases.changes_between
    monkeypatch.setattr(releases, "changes_between", lambda a, b: tuple(
        c for c in changes_between(a, b) if c.name != left_out))
    hunks = render.attributed_diff.__wrapped__("0.33.0", "0.34.0")
    assert [h.module for h in hunks if not h.changes] == ["scheduler.py"]


@pytest.mark.slow
@pytest.mark.xdist_group("render_pages")
def test_the_committed_pages_are_a_fresh_render():
    """docs/releases/ is what ``python -m harness releases pages`` writes now."""
    fresh = render.pages()
    committed = {p.relative_to(render.PAGES_DIR).as_posix(): p.read_text()
                 for p in render.PAGES_DIR.rglob("*") if p.is_file()}
    assert sorted(committed) == sorted(fresh)
    stale = [name for name in fresh if committed[name] != fresh[name]]
    assert not stale, f"run python -m harness releases pages: {stale}"
    pairs = len(releases.RELEASES) - 1
    assert sum(name.endswith(".md") and "-to-" in name for name in fresh) == pairs


@pytest.mark.slow
def test_render_command(tmp_path):
    def cli(*args):
        return subprocess.run([sys.executable, "-m", "harness", "releases", *args],
                              capture_output=True, text=True, cwd=ROOT, timeout=300)
    done = cli("render", "0.19.0", "-o", str(tmp_path / "r"))
    assert done.returncode == 0 and (tmp_path / "r" / "scheduler.py").is_file()
    done = cli("render", "--diff", "0.33.0", "0.34.0")
    assert done.returncode == 0
    assert done.stdout.startswith("# ") and "threshold_needs_chunked_prefill" in done.stdout
    done = cli("render", "0.99.0")
    assert done.returncode == 2 and done.stderr.count("\n") == 1
    assert "0.99.0: the reference describes 0.11.0 to" in done.stderr
