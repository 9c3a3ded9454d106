"""What a non-editable install gets: the fixtures and the schema ride in the package,
and the console script points at the CLI.

(Checked by hand once with ``pip wheel --no-deps .``: the wheel holds
``harness/fixtures/{models,streams,traces}/...`` and ``harness/formats/schemas/``.)
"""

from __future__ import annotations

import fnmatch
import tomllib

from harness.formats.paths import FIXTURES_DIR, ROOT, STREAM_SCHEMA

PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
SETUPTOOLS = PYPROJECT["tool"]["setuptools"]


def test_fixtures_are_package_data():
    assert SETUPTOOLS["package-dir"]["harness.fixtures"] == "fixtures"
    assert "harness.fixtures" in SETUPTOOLS["packages"]
    globs = SETUPTOOLS["package-data"]["harness.fixtures"]
    files = [p.relative_to(FIXTURES_DIR).as_posix() for p in FIXTURES_DIR.rglob("*") if p.is_file()]
    assert files
    left_out = [f for f in files if not any(fnmatch.fnmatch(f, g) for g in globs)]
    assert not left_out, f"not shipped in the package: {left_out}"


def test_schema_is_package_data():
    rel = STREAM_SCHEMA.relative_to(ROOT / "harness" / "formats" / "schemas").as_posix()
    assert any(fnmatch.fnmatch(rel, g) for g in SETUPTOOLS["package-data"]["harness.formats.schemas"])


def test_every_harness_package_is_listed():
    found = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "harness").rglob("__init__.py")}
    found |= {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "reference").rglob("__init__.py")}
    assert found <= set(SETUPTOOLS["packages"]), found - set(SETUPTOOLS["packages"])


def test_console_script():
    assert PYPROJECT["project"]["scripts"] == {"vllm-conformance": "harness.cli:run"}
