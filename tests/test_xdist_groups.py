"""make test's pytest-xdist keeps each xdist_group on one worker.

The rule report and the export are built once per worker that runs one of their
tests (a module fixture); grouping is what keeps that to one.  With pytest 9.2,
pytest-xdist 3.8 stopped grouping without a word (pytest-dev/pytest-xdist#1386) and
the report was built twice; constraints.txt pins a pytest that groups.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

GROUPED = '''
import pytest

@pytest.mark.xdist_group("g")
def test_a():
    pass

@pytest.mark.xdist_group("g")
def test_b():
    pass

@pytest.mark.xdist_group("g")
def test_c():
    pass

def test_d():
    pass

def test_e():
    pass
'''


@pytest.mark.slow
def test_an_xdist_group_runs_on_one_worker(tmp_path):
    (tmp_path / "test_grouped.py").write_text(GROUPED)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", "-n", "2",
         "--dist", "loadgroup", "-c", os.devnull, "--rootdir", str(tmp_path), "test_grouped.py"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
        env={k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")})
    assert done.returncode == 0, done.stdout[-2000:]
    workers = {name: gw for gw, name in re.findall(r"\[(gw\d+)\].*::(test_\w)", done.stdout)}
    assert sorted(workers) == ["test_a", "test_b", "test_c", "test_d", "test_e"], done.stdout
    assert len({workers["test_a"], workers["test_b"], workers["test_c"]}) == 1, done.stdout
