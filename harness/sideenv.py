"""Side environments: another vLLM release, run on the base environment's torch.

A side environment is a *wheel overlay*: only the ``vllm`` wheel of the release
(``pip download vllm==X --no-deps``), unpacked with ``pip install --no-deps
--target .venvs/vllm-X``, with its compiled extensions (``*.so``) removed.  A
process started with ``PYTHONPATH=.venvs/vllm-X`` imports that vLLM and
everything else (torch, transformers, numpy) from ``.venv``.

Why that is enough, and exact: the scheduler, the KV cache manager, the block
pool and the worker's block table are pure Python.  The compiled extensions
are GPU kernels built against the torch the release pins (2.9.0 for 0.11.1 to
0.13.0); under the base torch 2.8.0 one of them aborts the process when
loaded, so they are removed, and vLLM logs that it could not import them and
goes on, as it does in the base environment on a machine without CUDA.  An
overlay costs one ~370-475 MB download (kept in ``.venvs/wheels``) and ~40 MB
on disk, against ~10 GB and ~5 minutes for a full environment.

A release whose own requirements refuse the base environment's transformers
(0.24.0 and later need transformers 5) also gets the *second base stack*:
the packages pinned in ``constraints-transformers5.txt`` (transformers,
tokenizers, huggingface-hub; ~75 MB), unpacked once into
``.venvs/transformers5`` with ``--no-deps`` and put on the path after the
release's overlay.  Their other requirements are met by the base environment.
The torch stays the base's 2.8.0 although those releases pin a newer one: the
scheduler and the KV cache manager do not call torch, and the conformance of
each release with the reference is what shows the drive is exact.  A release
whose requirement the pinned transformers does not meet is refused, naming
both.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement

from harness.paths import ROOT

SIDE_ENVS = ROOT / ".venvs"
WHEELS = SIDE_ENVS / "wheels"
STACK_CONSTRAINTS = ROOT / "constraints-transformers5.txt"
STACK_DIR = SIDE_ENVS / "transformers5"
_VERSION = re.compile(r"^\d+\.\d+\.\d+([.-]?(post|rc|dev)\d+)?$")


class SideEnvError(Exception):
    """The side environment could not be made; the message is one line."""


def check_version(version: str) -> str:
    if not _VERSION.match(version):
        raise ValueError(f"VLLM: {version!r} is not a release number like 0.12.0")
    return version


def overlay_dir(version: str) -> Path:
    return SIDE_ENVS / f"vllm-{version}"


def ensure_overlay(version: str, log=print) -> Path:
    """The overlay for ``version``, made on first use (cached afterwards)."""
    target = overlay_dir(check_version(version))
    done = target / ".complete"
    if done.exists():
        return target
    WHEELS.mkdir(parents=True, exist_ok=True)
    wheel = _find_wheel(version)
    if wheel is None:
        log(f"downloading the vllm {version} wheel (no dependencies) into {WHEELS}")
        _pip("download", f"vllm=={version}", "--no-deps", "-d", str(WHEELS), what=f"vllm=={version}")
        wheel = _find_wheel(version)
        if wheel is None:
            raise SideEnvError(f"vllm {version}: pip downloaded no wheel")
    if target.exists():
        shutil.rmtree(target)
    log(f"unpacking {wheel.name} into {target}")
    _pip("install", "--no-deps", "--no-compile", "--target", str(target), str(wheel),
         what=wheel.name)
    for so in target.rglob("*.so"):
        so.unlink()  # GPU kernels for another torch: see the module docstring
    done.write_text(f"vllm {version} overlay on {sys.executable}\n")
    return target


def requirement(version: str, package: str) -> str | None:
    """The release's requirement on ``package`` (from its wheel's METADATA), if any."""
    for meta in overlay_dir(version).glob("vllm-*.dist-info/METADATA"):
        for line in meta.read_text().splitlines():
            m = re.match(rf"Requires-Dist: ({re.escape(package)}\b[^;]*)$", line, re.I)
            if m:
                return m.group(1).strip()
    return None


def needs_stack(version: str) -> bool:
    """Whether the release refuses the base environment's transformers."""
    wanted = requirement(version, "transformers")
    return wanted is not None and not _meets(wanted, metadata.version("transformers"))


def _meets(wanted: str, version: str) -> bool:
    return Requirement(wanted).specifier.contains(version, prereleases=True)


def pinned_stack() -> dict[str, str]:
    """{package: version} of the second base stack."""
    pins = {}
    for line in STACK_CONSTRAINTS.read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, _, version = line.partition("==")
            pins[name.strip().lower()] = version.strip()
    return pins


def ensure_stack(version: str, log=print) -> Path | None:
    """The second base stack when the release needs it (made on first use), else None."""
    if not needs_stack(version):
        return None
    wanted = requirement(version, "transformers")
    pinned = pinned_stack()["transformers"]
    if not _meets(wanted, pinned):
        raise SideEnvError(f"vllm {version} requires {wanted}; {STACK_CONSTRAINTS.name} "
                           f"pins transformers {pinned}")
    done = STACK_DIR / ".complete"
    pins = STACK_CONSTRAINTS.read_text()
    if done.exists() and done.read_text() == pins:
        return STACK_DIR
    if STACK_DIR.exists():
        shutil.rmtree(STACK_DIR)
    log(f"installing the second base stack ({STACK_CONSTRAINTS.name}) into {STACK_DIR}")
    _pip("install", "--no-deps", "--no-compile", "--target", str(STACK_DIR),
         "-r", str(STACK_CONSTRAINTS), what=STACK_CONSTRAINTS.name)
    done.write_text(pins)
    return STACK_DIR


def _find_wheel(version: str) -> Path | None:
    found = sorted(WHEELS.glob(f"vllm-{version}-*.whl"))
    return found[0] if found else None


def _pip(*args: str, what: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "pip", "-q", "--disable-pip-version-check", *args],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        last = [line for line in proc.stderr.splitlines() if line.strip()]
        reason = last[-1].strip() if last else f"pip exit {proc.returncode}"
        raise SideEnvError(f"{what}: {reason}")


def overlay_environment(version: str) -> dict[str, str]:
    """The environment of a process that runs ``version`` from its overlay."""
    env = dict(os.environ)
    paths = [str(overlay_dir(version))] + ([str(STACK_DIR)] if needs_stack(version) else []) \
        + [str(ROOT)]
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    # vLLM caches model inspection results under a name that does not depend on
    # its version: each release gets its own cache folder.
    env["VLLM_CACHE_ROOT"] = str(SIDE_ENVS / "cache" / version)
    return env
