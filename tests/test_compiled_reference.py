"""The compiled reference (harness/formats/compiled.py) computes what the interpreted one
computes: the same trace bytes for every bundled stream and for generated ones, under the
first and the newest release's rules; and asking for it wrongly is a one-line error."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys

import pytest

from harness.engines import get_engine
from harness.formats import compiled
from harness.formats.paths import FIXTURES_DIR, ROOT
from harness.formats.stream import load_stream
from harness.loop.runner import run
from reference.releases import RELEASES

RELEASES_HELD = (RELEASES[0], RELEASES[-1])
GENERATED = 150

#: Run in a process of its own, with the compiled reference: each stream's trace digest.
CHILD = """
import hashlib, json, sys
from harness.engines import get_engine
from harness.formats import compiled
from harness.formats.stream import parse_stream
from harness.loop.runner import run
assert compiled.in_use(), "the compiled reference was not imported"
import reference.scheduler
assert reference.scheduler.__file__.endswith(".so"), reference.scheduler.__file__
from harness.jobs.upgrade_campaign import Checker
streams, releases = json.load(sys.stdin)
digests = {f"{release} {i}": hashlib.sha256(run(get_engine("reference", release),
           parse_stream(s)).dumps().encode()).hexdigest()
           for release in releases for i, s in enumerate(streams)}
newest = get_engine("reference", releases[-1])
asked = [sorted(Checker.asking(newest, parse_stream(s))[1]) for s in streams]
print(json.dumps([digests, asked]))
"""


def _streams() -> list:
    from harness.jobs.bench import small_streams
    bundled = [load_stream(p) for p in sorted((FIXTURES_DIR / "streams").glob("*.json"))]
    return bundled + small_streams(GENERATED, seed=3)


def _digests(streams, releases) -> dict[str, str]:
    return {f"{release} {i}": hashlib.sha256(run(get_engine("reference", release), s)
                                             .dumps().encode()).hexdigest()
            for release in releases for i, s in enumerate(streams)}


@pytest.mark.slow
@pytest.mark.skipif(not compiled.build_is_current(),
                    reason="no build of the reference as it is now (make compile builds it)")
def test_compiled_reference_gives_the_same_traces_and_asks_the_same_rules():
    """... and the upgrade check's note of the rule changes each run asks about
    (``AskedRules``) hears the same asks from it, under the newest release's rules."""
    from harness.jobs.upgrade_campaign import Checker
    streams = _streams()
    assert not compiled.in_use()  # this process runs the interpreted reference
    env = {**os.environ, compiled.VARIABLE: compiled.COMPILED}
    done = subprocess.run([sys.executable, "-c", CHILD], cwd=ROOT, env=env, text=True,
                          capture_output=True, timeout=600,
                          input=json.dumps([[s.to_json() for s in streams],
                                            list(RELEASES_HELD)]))
    assert done.returncode == 0, done.stderr[-3000:]
    theirs, their_asks = json.loads(done.stdout)
    ours = _digests(streams, RELEASES_HELD)
    assert len(ours) == len(streams) * len(RELEASES_HELD)
    differing = sorted(k for k in ours if theirs.get(k) != ours[k])
    assert not differing, f"{len(differing)} trace(s) differ, e.g. {differing[:5]}"
    newest = get_engine("reference", RELEASES_HELD[-1])
    our_asks = [sorted(Checker.asking(newest, s)[1]) for s in streams]
    assert sum(map(len, our_asks)) > len(streams)  # the runs ask about rule changes
    assert their_asks == our_asks


def _python(env_value: str, code: str = "import harness") -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, text=True,
                          capture_output=True, timeout=120,
                          env={**os.environ, compiled.VARIABLE: env_value})


def test_unknown_value_is_a_one_line_usage_error():
    done = _python("fast")
    assert done.returncode == 2
    assert done.stderr == ("error: HARNESS_REFERENCE=fast: must be interpreted or compiled\n")


def test_no_current_build_is_a_usage_error_not_a_silent_substitute(monkeypatch, capsys):
    monkeypatch.setenv(compiled.VARIABLE, compiled.COMPILED)
    monkeypatch.setattr(compiled, "in_use", lambda: False)
    monkeypatch.setattr(compiled, "build_is_current", lambda: False)
    monkeypatch.delitem(sys.modules, "reference", raising=False)
    path = list(sys.path)
    with pytest.raises(SystemExit) as exc:
        compiled.use_requested()
    assert exc.value.code == 2
    assert "no build of the reference as it is now" in capsys.readouterr().err
    assert sys.path == path


def test_reference_imported_first_is_a_usage_error(monkeypatch, capsys):
    monkeypatch.setenv(compiled.VARIABLE, compiled.COMPILED)
    monkeypatch.setattr(compiled, "in_use", lambda: False)
    assert "reference" in sys.modules
    with pytest.raises(SystemExit) as exc:
        compiled.use_requested()
    assert exc.value.code == 2
    assert "the interpreted reference was imported first" in capsys.readouterr().err


def test_what_patches_the_reference_refuses_the_compiled_one(monkeypatch, capsys):
    compiled.require_interpreted("the mutant hunt")  # interpreted here: nothing to say
    monkeypatch.setenv(compiled.VARIABLE, compiled.COMPILED)
    with pytest.raises(SystemExit) as exc:
        compiled.require_interpreted("the mutant hunt")
    assert exc.value.code == 2
    assert capsys.readouterr().err.startswith(
        "error: HARNESS_REFERENCE=compiled: the mutant hunt patches the reference's")


def test_digest_follows_every_module(tmp_path):
    for name in ("a.py", "b.py"):
        (tmp_path / name).write_text("x = 1\n")
    before = compiled.source_digest(tmp_path)
    (tmp_path / "b.py").write_text("x = 2\n")
    assert compiled.source_digest(tmp_path) != before
