"""A portable fixture set: vLLM's own traces, for implementations that do not run our code.

``python -m harness export --vllm 0.11.0 -o DIR`` writes, for one vLLM release:

* ``streams/<name>.json``: the bundled streams and ``generated`` streams of the
  whole space from a fixed seed, in the canonical stream format;
* ``traces/<name>.json``: each run through that vLLM, with its ``_info`` block (the
  release, digests of the stream and the steps), as ``make record`` writes them;
* ``schemas/stream.schema.json`` and ``schemas/trace.schema.json`` (JSON Schema
  2020-12; the trace schema refers to the stream schema);
* ``manifest.json``: the release, the seed, and per stream its digest, steps and
  verdict; ``README.md``: what a consumer does with them.

The release must be the installed vLLM, or one whose side environment ``make
upgrade-check VLLM=X`` has made (the export then runs inside it).  The set is
written to a folder beside ``DIR`` and renamed into place at the end, so an
interrupted export leaves nothing behind.
"""

from __future__ import annotations

import datetime
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from harness.checks import profiles
from harness.jobs.chunks import given_campaign
from harness.engines import get_engine, installed_vllm_version
from harness.checks.golden import recorded
from harness.formats.paths import ROOT, STREAM_SCHEMA, STREAMS_DIR, write_atomic, write_json
from harness.loop.runner import run
from harness.jobs.side_env import overlay_dir, overlay_environment
from harness.formats.stream import load_stream, parse_stream

SCHEMAS = STREAM_SCHEMA.parent
FORMAT = 1


class ExportError(ValueError):
    """Bad input for an export: one line."""


def export(version: str, out: Path, generated: int = 200, seed: int = 0) -> int:
    """Write the fixture set of vLLM ``version`` to ``out``; 0 when written."""
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ExportError(f"-o {out}: exists and is not an empty folder")
    installed = installed_vllm_version()
    if installed != version:
        if not (overlay_dir(version) / ".complete").exists():
            raise ExportError(f"--vllm {version}: the installed vLLM is {installed or 'none'}; "
                              f"make upgrade-check VLLM={version} makes its environment")
        cmd = [sys.executable, "-m", "harness", "export", "--vllm", version, "-o", str(out),
               "--generated", str(generated), "--seed", str(seed)]
        return subprocess.run(cmd, env=overlay_environment(version), cwd=ROOT).returncode
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        _write(staging, version, generated, seed)
        if out.exists():
            out.rmdir()
        staging.rename(out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    print(f"wrote {out}: {len(list((out / 'traces').glob('*.json')))} traces of vLLM {version}")
    return 0


def _streams(generated: int, seed: int) -> list[tuple[str, dict]]:
    """(source, stream JSON): the bundled streams by name, then the generated ones."""
    out = [("bundled", load_stream(p).to_json()) for p in sorted(STREAMS_DIR.glob("*.json"))]
    drawn: list[dict] = []

    def keep(data) -> None:
        drawn.append(data)

    if generated:
        profiles.load("ci")  # the same draws from every entry point (profiles.pin_local_constants)
        given_campaign(keep, generated, seed)()
    for i, data in enumerate(drawn[:generated]):
        stream = parse_stream(data).to_json()
        stream["name"] = f"generated-{seed}-{i:04d}"
        out.append(("generated", stream))
    return out


def _write(folder: Path, version: str, generated: int, seed: int) -> None:
    vllm = get_engine("vllm")
    entries = []
    for source, data in _streams(generated, seed):
        stream = parse_stream(data)
        trace = recorded(run(vllm, stream).to_json())
        write_json(folder / "streams" / f"{stream.name}.json", stream.to_json())
        write_json(folder / "traces" / f"{stream.name}.json", trace)
        entries.append({"name": stream.name, "source": source, "stream_sha256": stream.sha256(),
                        "steps": len(trace["steps"]), "verdict": trace["verdict"]})
    for schema in ("stream.schema.json", "trace.schema.json"):
        write_json(folder / "schemas" / schema, json.loads((SCHEMAS / schema).read_text()))
    from harness import __version__
    write_json(folder / "manifest.json", {
        "format": FORMAT, "vllm_version": version, "harness_version": __version__,
        "generated": {"count": generated, "seed": seed, "strategy": "whole_space"},
        "exported_on": datetime.date.today().isoformat(), "streams": entries})
    write_atomic(folder / "README.md", README.format(version=version, total=len(entries),
                                                     generated=generated, seed=seed))


README = """# vLLM {version} scheduling fixtures

{total} streams ({generated} of them generated from seed {seed}), each with the trace
vLLM {version} produced for it, step by step, on CPU with a scripted model.  Made
by `python -m harness export` (vllm-conformance); nothing here needs that code.

* `streams/<name>.json`: a stream: the engine configuration (`config`: block size,
  pages, token budget, policy, ...) and the requests, each with its prompt, the
  tokens the model will sample (`output`), its stops, and the step it arrives at.
  Schema: `schemas/stream.schema.json`.
* `traces/<name>.json`: what vLLM did: per step the tokens scheduled per request,
  the page ids handed out, preemptions, prefix-cache hits, tokens computed, each
  request's status, the free page count, and more.  `_info` names the release and
  holds sha256 digests of the stream and of the steps (canonical JSON: sorted keys,
  no spaces).  Schema: `schemas/trace.schema.json`.
* `manifest.json`: every stream's digest, its number of steps and its verdict.

To check an implementation: for each stream, build its scheduler from `config`,
add each request at its `arrival_step`, and at every step schedule, feed back the
request's next `output` tokens for what was scheduled, and compare your step with
the trace's step field by field.  A trace whose `verdict` is `engine_failure` is a
stream on which vLLM itself failed.  With vllm-conformance installed, `python -m
harness replay traces/ --engine module:Class` does all of this for a Python class,
and `--engine "cmd:<program>"` for a program in any language (its
docs/engine-interface.md).
"""
