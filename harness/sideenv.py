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

A release whose Python code needs other versions of the base packages (0.33.0
needs transformers 5) cannot be driven this way; the report says which
import failed.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from harness.paths import ROOT

SIDE_ENVS = ROOT / ".venvs"
WHEELS = SIDE_ENVS / "wheels"
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
    paths = [str(overlay_dir(version)), str(ROOT)]
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    # vLLM caches model inspection results under a name that does not depend on
    # its version: each release gets its own cache folder.
    env["VLLM_CACHE_ROOT"] = str(SIDE_ENVS / "cache" / version)
    return env
