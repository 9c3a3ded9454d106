"""``make compile``: build the compiled reference (see :mod:`harness.formats.compiled`).

The reference's modules are copied into a folder beside the build and compiled there by
mypyc; the folder then takes the build's place whole, so a failed or interrupted build
leaves the last one as it was.  A build of the reference as it is now is kept.

    python -m harness.jobs.compile_reference [--force]
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import time

from harness.formats.compiled import (BUILD_DIR, DIGEST_FILE, LEFT_INTERPRETED, SOURCE_DIR,
                                      build_is_current, source_digest)

#: mypy reads the annotations as the reference writes them: they document, and are not
#: held to mypy's checks.  mypyc checks what they declare as the code runs, and the tests
#: hold the build to the interpreted reference stream by stream.
MYPY_CONFIG = "[mypy]\nignore_errors = True\nignore_missing_imports = True\n"


def build(force: bool = False) -> bool:
    """Build it unless a build of the reference as it is now exists; whether it built."""
    if build_is_current() and not force:
        return False
    digest = source_digest()
    work = BUILD_DIR.with_name(BUILD_DIR.name + ".building")
    shutil.rmtree(work, ignore_errors=True)
    (work / "reference").mkdir(parents=True)
    for path in SOURCE_DIR.glob("*.py"):
        shutil.copy2(path, work / "reference" / path.name)
    (work / "mypy.ini").write_text(MYPY_CONFIG)
    modules = sorted(f"reference/{p.name}" for p in SOURCE_DIR.glob("*.py")
                     if p.stem not in LEFT_INTERPRETED)
    done = subprocess.run([sys.executable, "-m", "mypyc", "--config-file", "mypy.ini",
                           *modules], cwd=work, capture_output=True, text=True)
    if done.returncode != 0:
        shutil.rmtree(work, ignore_errors=True)
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-20:])
        raise RuntimeError(f"mypyc failed to compile the reference:\n{tail}")
    shutil.rmtree(work / "build")  # mypyc's C sources and objects
    (work / "mypy.ini").unlink()
    (work / DIGEST_FILE.name).write_text(digest + "\n")
    shutil.rmtree(BUILD_DIR, ignore_errors=True)
    work.rename(BUILD_DIR)
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.jobs.compile_reference",
                                     description="Build the compiled reference with mypyc.")
    parser.add_argument("--force", action="store_true", help="build even if one is current")
    ns = parser.parse_args(argv)
    started = time.monotonic()
    try:
        built = build(ns.force)
    except (RuntimeError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"compiled reference {'built' if built else 'current'} in {BUILD_DIR} "
          f"({time.monotonic() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
