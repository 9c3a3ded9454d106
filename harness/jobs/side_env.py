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

A release whose Python code needs a newer transformers than the base's (its
wheel's METADATA refuses transformers 4: 0.24.0 and later) also gets a *second
base stack*.  ``constraints-stack.txt`` names the packages the drive imports
whose versions those releases constrain (transformers, tokenizers,
huggingface-hub, xgrammar, apache-tvm-ffi, llguidance, fastapi) and pins one
or more versions of each.  For such a release, ``resolve_stack`` keeps a
package's base version when it meets every requirement the release's METADATA,
and the packages stacked with it, state on it; otherwise it takes the first
pinned version that does, backtracking over the pins.  One stack does not
serve every release: 0.31.0 requires xgrammar==0.2.7 and 0.32.0 ==0.2.8; 0.25.1's
apache-tvm-ffi==0.1.9 admits only xgrammar 0.2.1 among those pinned; 0.34.0's
huggingface-hub>=2 needs a later transformers than 0.31.0's <5.18.  So each
distinct choice is unpacked with ``--no-deps`` from wheels kept in
``.venvs/wheels`` into ``.venvs/stack-<hash of its pins>`` (~90-200 MB; made
once, shared by the releases that resolve alike, and a changed pin is another
folder) and put on the path after the release's overlay.  The stacked
packages' other requirements are met by the base environment.  Requirements on
packages the file does not name are not installed: the drive does not import
them (the serving stack, GPU kernels), and torch (with torchvision and
torchaudio) stays the base's 2.8.0 although those releases pin a newer one, for
the reason above; the conformance of each release with the reference is what
shows the drive is exact.  A release that requires a version of a named
package that neither the base nor any pin meets is refused with one line
naming both.  Releases the base's transformers meets (0.11.1 to 0.23.0) get no
stack and are not refused: the overlay alone is their drive, as their checks
show exact, although some state an xgrammar or llguidance the base lacks.

``newest_release()`` asks pip which vLLM release is the newest on the package index
(``upgrade-check latest``).

``python -m harness.jobs.side_env 0.30.0`` makes the release's side environment and
prints its ``PYTHONPATH``.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from harness.formats.paths import ROOT

SIDE_ENVS = ROOT / ".venvs"
WHEELS = SIDE_ENVS / "wheels"
STACK_CONSTRAINTS = ROOT / "constraints-stack.txt"
# A release gets a stack when its requirement on this package refuses the base's version.
TRIGGER = "transformers"
_VERSION = re.compile(r"^\d+\.\d+\.\d+([.-]?(post|rc|dev)\d+)?$")


class SideEnvError(Exception):
    """The side environment could not be made; the message is one line."""


class IndexUnavailable(SideEnvError):
    """The package index did not say which release is the newest; the message is one line."""


# Seconds pip may take to say which release is the newest (pip retries a connection
# 5 times, some 8 s in all when it is refused; a silent network is cut off here).
INDEX_TIMEOUT = 120


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
    """The release's requirement on ``package`` (from its wheel's METADATA, without its
    marker), if any."""
    for req in release_requirements(version):
        if canonicalize_name(req.name) == canonicalize_name(package):
            return f"{req.name}{req.specifier}"
    return None


def release_requirements(version: str) -> list[Requirement]:
    """What the release's wheel requires on this machine (no extras), [] without an overlay."""
    for meta in overlay_dir(version).glob("vllm-*.dist-info/METADATA"):
        return _requirements(meta.read_text())
    return []


def _requirements(metadata_text: str) -> list[Requirement]:
    found = []
    for line in metadata_text.splitlines():
        if line.startswith("Requires-Dist:"):
            req = Requirement(line.partition(":")[2].strip())
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                found.append(req)
    return found


def _meets(wanted: str | Requirement, version: str | None) -> bool:
    req = wanted if isinstance(wanted, Requirement) else Requirement(wanted)
    return version is not None and req.specifier.contains(version, prereleases=True)


# -- the second base stack ------------------------------------------------------------------

def pinned_stack() -> dict[str, list[str]]:
    """{package: [pinned versions, in the order of preference]} of the stack's constraints
    file; a package may be pinned more than once (releases that need different versions)."""
    pins: dict[str, list[str]] = {}
    for line in STACK_CONSTRAINTS.read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, sep, version = line.partition("==")
            if not sep or not version.strip():
                raise SideEnvError(f"{STACK_CONSTRAINTS.name}: {line!r} is not name==version")
            pins.setdefault(canonicalize_name(name.strip()), []).append(version.strip())
    return pins


def _base_path() -> list[str]:
    side = SIDE_ENVS.resolve()
    return [p for p in sys.path if not Path(p or ".").resolve().is_relative_to(side)]


def _base_dist(package: str) -> metadata.Distribution | None:
    for dist in metadata.distributions(name=package, path=_base_path()):
        return dist
    return None


def base_version(package: str) -> str | None:
    """The version of ``package`` in the base environment (side environments on the path
    are not looked at), None when it has none."""
    dist = _base_dist(package)
    return dist.version if dist else None


def base_requires(package: str) -> list[Requirement]:
    """What the base environment's ``package`` requires ([] when it has none)."""
    dist = _base_dist(package)
    return _requirements("".join(f"Requires-Dist: {r}\n" for r in (dist.requires or []))) \
        if dist else []


def pin_requires(package: str, version: str) -> list[Requirement]:
    """What the pinned wheel of ``package`` requires (read from the wheel, downloaded into
    ``.venvs/wheels`` on first use)."""
    with zipfile.ZipFile(_pin_wheel(package, version)) as whl:
        meta = next(n for n in whl.namelist()
                    if n.endswith(".dist-info/METADATA") and n.count("/") == 1)
        return _requirements(whl.read(meta).decode())


def _pin_wheel(package: str, version: str, log=None) -> Path:
    def find() -> Path | None:
        for whl in sorted(WHEELS.glob("*.whl")):
            name, ver, _, _ = parse_wheel_filename(whl.name)
            if name == canonicalize_name(package) and str(ver) == str(Version(version)):
                return whl
        return None
    found = find()
    if found is None:
        WHEELS.mkdir(parents=True, exist_ok=True)
        if log:
            log(f"downloading {package}=={version} (no dependencies) into {WHEELS}")
        _pip("download", f"{package}=={version}", "--no-deps", "--only-binary", ":all:",
             "-d", str(WHEELS), what=f"{package}=={version}")
        found = find()
        if found is None:
            raise SideEnvError(f"{package}=={version}: pip downloaded no wheel")
    return found


def resolve_stack(version: str) -> dict[str, str]:
    """{package: version} the release runs with on top of the base environment.

    Only the packages the constraints file names are considered (those the drive imports).
    Each keeps the base environment's version when that meets every requirement the release,
    and the packages chosen so far, state on it; otherwise the first pinned version that
    does.  Backtracks over the pins; with no combination, SideEnvError naming what the
    release requires and what is pinned."""
    pins = pinned_stack()
    wanted = [r for r in release_requirements(version) if canonicalize_name(r.name) in pins]
    if all(_meets(r, base_version(TRIGGER)) for r in wanted
           if canonicalize_name(r.name) == TRIGGER):
        return {}  # the release runs on the base environment alone, as the overlay says
    names = list(pins)
    BASE = None  # a choice: keep the base environment's version

    def version_of(name: str, choice: str | None) -> str | None:
        return base_version(name) if choice is BASE else choice

    def reqs_of(name: str, choice: str | None) -> list[Requirement]:
        found = base_requires(name) if choice is BASE else pin_requires(name, choice)
        return [r for r in found if canonicalize_name(r.name) in pins]

    def fits(name: str, have: str | None, reqs: list[Requirement]) -> bool:
        return all(_meets(r, have) for r in reqs if canonicalize_name(r.name) == name)

    for req in wanted:  # one requirement nothing meets: say so, naming both
        name = canonicalize_name(req.name)
        if not any(_meets(req, v) for v in [base_version(name), *pins[name]]):
            have = base_version(name) or "none"
            raise SideEnvError(
                f"vllm {version} requires {req.name}{req.specifier}; {STACK_CONSTRAINTS.name} "
                f"pins {req.name} "
                f"{', '.join(pins[name])} and the base environment has {have}")

    def solve(i: int, chosen: dict[str, str | None]) -> dict[str, str | None] | None:
        if i == len(names):
            return chosen
        name = names[i]
        for choice in [BASE, *pins[name]]:
            have = version_of(name, choice)
            if not fits(name, have, wanted):
                continue
            earlier = [r for q, c in chosen.items() for r in reqs_of(q, c)]
            if not fits(name, have, earlier):
                continue
            mine = reqs_of(name, choice)
            if not all(fits(q, version_of(q, c), mine) for q, c in chosen.items()):
                continue
            # a package not reached yet that is absent from the base is met later or fails there
            found = solve(i + 1, {**chosen, name: choice})
            if found is not None:
                return found
        return None

    solution = solve(0, {})
    if solution is None:
        raise SideEnvError(f"vllm {version}: no combination of the pins in "
                           f"{STACK_CONSTRAINTS.name} meets its requirements on "
                           f"{', '.join(sorted({str(r) for r in wanted}))}")
    return {name: choice for name, choice in solution.items() if choice is not BASE}


def stack_dir(stack: dict[str, str]) -> Path:
    """The stack's folder, named by its pins: a changed pin is another folder."""
    return SIDE_ENVS / f"stack-{hashlib.sha256(_pin_lines(stack).encode()).hexdigest()[:12]}"


def _pin_lines(stack: dict[str, str]) -> str:
    return "".join(f"{name}=={v}\n" for name, v in sorted(stack.items()))


def ensure_stack(version: str, log=print) -> Path | None:
    """The release's second base stack (made on first use, cached), or None when the base
    environment meets every requirement the release states on the packages pinned."""
    stack = resolve_stack(version)
    if not stack:
        return None
    target = stack_dir(stack)
    done = target / ".complete"
    if done.exists() and done.read_text() == _pin_lines(stack):
        return target
    wheels = [str(_pin_wheel(name, v, log)) for name, v in sorted(stack.items())]
    if target.exists():
        shutil.rmtree(target)  # an unfinished build of the same pins
    log(f"installing the second base stack of vllm {version} "
        f"({', '.join(f'{n}=={v}' for n, v in sorted(stack.items()))}) into {target}")
    _pip("install", "--no-deps", "--no-compile", "--target", str(target), *wheels,
         what=f"the stack of vllm {version}")
    done.write_text(_pin_lines(stack))
    return target


# -- the newest release on the package index ----------------------------------------------

def newest_release(package: str = "vllm", timeout: float = INDEX_TIMEOUT) -> tuple[str, str]:
    """(version, where) of the newest release of ``package`` on the package index, as pip
    would install it here: no pre-release, no yanked release, a wheel this interpreter and
    platform take (the overlay is made from a wheel); ``where`` is the address that serves
    it, credentials cut.

    pip is asked (``pip install --dry-run --no-deps --report``), so the index, mirrors,
    proxies, certificates and credentials are the ones pip is set up with (``pip config
    list``, ``PIP_INDEX_URL``), as for the overlay's download.  Where the index serves a
    wheel's metadata apart (PEP 658, as PyPI does) nothing else is downloaded: about 2 s.
    Raises IndexUnavailable, one line, when pip cannot say within ``timeout`` seconds."""
    with tempfile.TemporaryDirectory(prefix="newest-release-") as tmp:
        report = Path(tmp) / "report.json"
        # -vv: pip says which index it could not reach, and why, only at its debug level
        cmd = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input",
               "-vv", "install", "--dry-run", "--no-deps", "--ignore-installed",
               "--only-binary", ":all:", "--report", str(report), package]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                                  stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            raise IndexUnavailable(f"no answer from pip within {timeout:g} s "
                                   f"{_WHICH_INDEX}") from None
        except OSError as exc:
            raise IndexUnavailable(f"pip could not be started: {exc.strerror or exc}") from None
        if proc.returncode != 0:
            raise IndexUnavailable(_index_failure(f"{proc.stdout}\n{proc.stderr}", package,
                                                  proc.returncode))
        try:
            found = json.loads(report.read_text())["install"][0]
            version = str(found["metadata"]["version"])
            url = str(found.get("download_info", {}).get("url", ""))
        except (OSError, ValueError, KeyError, IndexError, TypeError, AttributeError):
            raise IndexUnavailable("pip named no release (its --report could not be "
                                   "read)") from None
    try:
        Version(version)
        check_version(version)
    except (InvalidVersion, ValueError):
        raise IndexUnavailable(f"the newest {package} on the index, {version!r}, is not a "
                               f"release number like 0.12.0") from None
    return version, _where(url)


_WHICH_INDEX = "(which index pip asks: pip config list, PIP_INDEX_URL)"


def _where(url: str) -> str:
    """The scheme and host (a local file: its folder) of a download address, without
    credentials."""
    from urllib.parse import unquote, urlsplit
    parts = urlsplit(url)
    if parts.scheme == "file":
        return str(Path(unquote(parts.path)).parent)
    if parts.scheme and parts.hostname:
        port = f":{parts.port}" if parts.port else ""
        return f"{parts.scheme}://{parts.hostname}{port}"
    return "the package index"


def _index_failure(output: str, package: str, code: int) -> str:
    """One line from what pip said (at -vv): the index it could not reach and why, else its
    last error."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    fetched = re.findall(r"Could not fetch URL (\S+?): (.*) - skipping", output)
    broken = [line for line in lines if "connection broken by" in line]
    if fetched or broken:
        url, why = fetched[-1] if fetched else ("", broken[-1])
        short = [re.search(p, why) for p in (
            r"Failed to establish a new connection: ([^'\"]+)", r"(\[SSL[^'\"]*)",
            r"Caused by (\w+)\('([^'\"]*)", r"connection broken by '?(\w+)\(")]
        found = next((m for m in short if m), None)
        reason = ": ".join(g.strip() for g in found.groups() if g) if found else why[:160]
        index = url.rstrip("/").removesuffix(f"/{package}")
        return f"cannot reach the package index{' ' + index if index else ''}: {reason}"
    errors = [line.removeprefix("ERROR: ") for line in lines if line.startswith("ERROR: ")]
    if any("No matching distribution found" in e for e in errors):
        return f"the package index has no release of {package} with a wheel for this machine " \
               f"{_WHICH_INDEX}"
    last = errors[-1] if errors else (lines[-1] if lines else f"pip exit {code}")
    return f"pip: {last[:200]}"


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
    stack = ensure_stack(version, log=lambda m: print(m, file=sys.stderr))
    paths = [str(overlay_dir(version))] + ([str(stack)] if stack else []) + [str(ROOT)]
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    # vLLM caches model inspection results under a name that does not depend on
    # its version: each release gets its own cache folder.
    env["VLLM_CACHE_ROOT"] = str(SIDE_ENVS / "cache" / version)
    return env


if __name__ == "__main__":  # PYTHONPATH=$(.venv/bin/python -m harness.jobs.side_env 0.30.0) ...
    if len(sys.argv) != 2:
        sys.exit("usage: python -m harness.jobs.side_env VERSION  (prints the release's PYTHONPATH)")
    try:
        ensure_overlay(check_version(sys.argv[1]), log=lambda m: print(m, file=sys.stderr))
        print(overlay_environment(sys.argv[1])["PYTHONPATH"])
    except (SideEnvError, ValueError) as exc:
        sys.exit(f"error: {exc}")
