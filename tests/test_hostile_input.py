"""Hostile input: every mistake a user can make is exit 2 (or 3, 130), one line per error,
no traceback, nothing written half-way and nothing written outside the folder asked for.

Each case runs the real CLI (``harness.cli.main``) in a fresh folder nested
three levels inside a temporary one; afterwards the whole temporary tree must
hold exactly what the case put there (its inputs), so a path escape, a
half-written output or a stray file fails the case.  Bad input never reaches
an engine, so these tests never import vLLM.

``python tests/test_hostile_input.py`` prints the table of cases and what
each one did (the closing-note table).
"""

from __future__ import annotations

import copy
import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from harness.cli import main

OK_STREAM = {"config": {"block_size": 4, "num_gpu_blocks": 16, "max_num_batched_tokens": 16,
                        "max_num_seqs": 4, "max_model_len": 32},
             "requests": [{"id": "a", "prompt": [1, 2, 3], "output": [4, 5]}]}


def with_(path: str, value) -> dict:
    """OK_STREAM with one field set; ``path`` like ``config.block_size`` or ``requests.0.prompt``."""
    data = copy.deepcopy(OK_STREAM)
    *parents, last = path.split(".")
    node = data
    for p in parents:
        node = node[int(p)] if p.isdigit() else node[p]
    node[int(last) if last.isdigit() else last] = value
    return data


def js(data) -> str:
    return json.dumps(data)


@dataclass
class Case:
    name: str
    argv: list[str]
    files: dict[str, str | bytes] = field(default_factory=dict)
    code: int = 2
    first: str = ""  # regex the first stderr line must match (after "error: ")
    lines: int = 1  # stderr lines


BIG = 1 << 20
CASES = [
    Case("invalid JSON", ["trace", "--engine", "reference", "s.json", "-o", "out"],
         {"s.json": "{not json"}, first=r"s\.json: not valid JSON: Expecting property name"),
    Case("not UTF-8", ["trace", "--engine", "reference", "s.json"], {"s.json": b"\xff\xfe{}"},
         first=r"s\.json: not valid JSON: not UTF-8 text"),
    Case("JSON nested too deeply", ["trace", "--engine", "reference", "s.json"],
         {"s.json": "[" * 100_000 + "]" * 100_000}, first=r"s\.json: not valid JSON: nested too deeply"),
    Case("duplicated key", ["trace", "--engine", "reference", "s.json"],
         {"s.json": '{"requests": [], "requests": []}'},
         first=r"s\.json: not valid JSON: key 'requests' appears twice"),
    Case("not an object", ["trace", "--engine", "reference", "s.json"], {"s.json": "[1, 2]"},
         first=r"s\.json: stream: must be a JSON object"),
    Case("unknown top-level field", ["trace", "--engine", "reference", "s.json"],
         {"s.json": js({**OK_STREAM, "confg": {}})}, first=r"s\.json: confg: unknown field"),
    Case("unknown config field", ["trace", "--engine", "reference", "s.json"],
         {"s.json": js(with_("config.blocksize", 4))}, first=r"s\.json: config\.blocksize: unknown field"),
    Case("string for an integer", ["trace", "--engine", "reference", "s.json"],
         {"s.json": js(with_("config.block_size", "4"))},
         first=r"s\.json: config\.block_size: must be an integer$"),
    Case("float for an integer", ["trace", "--engine", "reference", "s.json"],
         {"s.json": js(with_("config.block_size", 4.0))},
         first=r"s\.json: config\.block_size: must be an integer$"),
    Case("1e30 pages", ["trace", "--engine", "reference", "s.json"],
         {"s.json": js(with_("config.num_gpu_blocks", 1e30))},
         first=r"s\.json: config\.num_gpu_blocks: must be an integer$"),
    Case("10**30 pages", ["trace", "--engine", "reference", "s.json"],
         {"s.json": js(with_("config.num_gpu_blocks", 10 ** 30))},
         first=r"s\.json: config\.num_gpu_blocks: must be <= 1,048,576$"),
    Case("max_steps 10**12", ["trace", "--engine", "reference", "s.json"],
         {"s.json": js(with_("config.max_steps", 10 ** 12))},
         first=r"s\.json: config\.max_steps: must be <= 100,000$"),
    Case("4,097 requests", ["trace", "--engine", "reference", "s.json"],
         {"s.json": js(with_("requests", [{"id": str(i), "prompt": [1], "output": [2]}
                                          for i in range(4097)]))},
         first=r"s\.json: requests: must hold at most 4,096 item\(s\)$"),
    Case("a million and one output tokens", ["trace", "--engine", "reference", "s.json"],
         {"s.json": js(with_("requests.0.output", [1] * (BIG + 1)))},
         first=r"s\.json: requests\[0\] \(a\)\.output: must hold at most 1,048,576 item\(s\)$"),
    Case("4.2 million tokens in all", ["trace", "--engine", "reference", "s.json"],
         {"s.json": js({"config": {"max_model_len": 32768, "num_gpu_blocks": 9000},
                        "requests": [{"id": str(i), "prompt": [1] * 30000, "output": [1] * 30000}
                                     for i in range(70)]})},
         first=r"s\.json: requests: 4,200,000 tokens in all"),
    Case("negative token id", ["trace", "--engine", "reference", "s.json"],
         {"s.json": js(with_("requests.0.prompt", [1, -2]))},
         first=r"s\.json: requests\[0\] \(a\)\.prompt: token ids must be >= 0$"),
    Case("token id 2**31", ["trace", "--engine", "reference", "s.json"],
         {"s.json": js(with_("requests.0.prompt", [2 ** 31]))},
         first=r"s\.json: requests\[0\] \(a\)\.prompt: token ids must be < 2\*\*31$"),
    Case("name escapes the folder", ["trace", "--engine", "reference", "s.json", "-o", "out"],
         {"s.json": js({**OK_STREAM, "name": "../../escape"})},
         first=r"s\.json: name: must be 1-128 characters"),
    Case("name with a slash", ["trace", "--engine", "reference", "s.json", "-o", "out"],
         {"s.json": js({**OK_STREAM, "name": "a/b"})}, first=r"s\.json: name: must be 1-128"),
    Case("two streams, one name", ["trace", "--engine", "reference", "a.json", "b.json", "-o", "out"],
         {"a.json": js({**OK_STREAM, "name": "same"}), "b.json": js({**OK_STREAM, "name": "same"})},
         first=r"stream 2 and stream 1 are both named 'same'"),
    Case("two records, one name", ["record", "a.json", "b.json", "-o", "out"],
         {"a.json": js({**OK_STREAM, "name": "same"}), "b.json": js({**OK_STREAM, "name": "same"})},
         first=r"stream 2 and stream 1 are both named 'same'"),
    Case("no requests", ["trace", "--engine", "reference", "s.json"],
         {"s.json": js({"requests": []})}, first=r"s\.json: requests: must hold at least one request"),
    Case("prompt fills the model", ["trace", "--engine", "reference", "s.json"],
         {"s.json": js(with_("requests.0.prompt", list(range(32))))},
         first=r"s\.json: requests\[0\] \(a\)\.prompt: length 32 must be < max_model_len"),
    Case("script runs out", ["check", "s.json"],
         {"s.json": js(with_("requests.0.max_tokens", 9))},
         first=r"s\.json: requests\[0\] \(a\)\.output: script has 2 token\(s\)"),
    Case("duplicate request ids", ["check", "s.json"],
         {"s.json": js(with_("requests", OK_STREAM["requests"] * 2))},
         first=r"s\.json: requests\[1\] \(a\)\.id: duplicate request id"),
    Case("abort before arrival", ["check", "s.json"],
         {"s.json": js(with_("requests.0", {**OK_STREAM["requests"][0], "arrival_step": 3,
                                            "abort_step": 2}))},
         first=r"s\.json: requests\[0\] \(a\)\.abort_step: must be > arrival_step"),
    Case("drafts without speculation", ["check", "s.json"],
         {"s.json": js(with_("requests.0.drafts", [[1]]))},
         first=r"s\.json: requests\[0\] \(a\)\.drafts: needs config\.num_speculative_tokens > 0"),
    Case("model path escape", ["check", "s.json"],
         {"s.json": js(with_("config.model", "../models/qwen2.5-0.5b"))},
         first=r"s\.json: config\.model: no model config at fixtures/models/"),
    Case("max_model_len beyond the model", ["check", "s.json"],
         {"s.json": js(with_("config.max_model_len", 40000))},
         first=r"s\.json: config\.max_model_len: must be <= the model's max_position_embeddings",
         lines=2),  # and the pool is then too small for one max_model_len request
    Case("five errors in one file", ["check", "s.json"],
         {"s.json": js({"config": {"block_size": 0, "policy": "lifo", "max_steps": "x"},
                        "requests": [{"id": "a", "prompt": [], "output": [1]}], "extra": 1})},
         first=r"s\.json: extra: unknown field", lines=5),
    Case("missing file", ["check", "nope.json"], first=r"nope\.json: no such file or folder"),
    Case("folder without streams", ["check", "empty"], {"empty/.keep": ""},
         first=r"empty: folder holds no \*\.json stream"),
    Case("file over 64 MiB", ["check", "big.json"], {"big.json": b"SPARSE"},
         first=r"big\.json: file is larger than 64 MiB"),
    Case("-o is a file", ["trace", "--engine", "reference", "s.json", "-o", "taken"],
         {"s.json": js(OK_STREAM), "taken": "x"}, first=r"-o taken: is a file, not a folder"),
    Case("-o under a file", ["trace", "--engine", "reference", "s.json", "-o", "taken/sub"],
         {"s.json": js(OK_STREAM), "taken": "x"}, first=r"-o taken/sub: cannot create the folder"),
    Case("fuzz --examples 0", ["fuzz", "--examples", "0"],
         first=r"fuzz: argument --examples: 0 must be > 0"),
    Case("fuzz --examples -5", ["fuzz", "--examples", "-5"],
         first=r"fuzz: argument --examples: -5 must be > 0"),
    Case("fuzz --workers 0", ["fuzz", "--workers", "0"],
         first=r"fuzz: argument --workers: 0 must be > 0"),
    Case("fuzz --workers with --ray", ["fuzz", "--ray", "--workers", "2"],
         first=r"--workers: not with --ray \(Ray places the chunks on the cluster's cores\)"),
    Case("fuzz --profile bogus", ["fuzz", "--profile", "bogus"],
         first=r"fuzz: argument --profile: invalid choice: 'bogus'"),
    Case("unknown engine", ["trace", "--engine", "sglang", "s.json"], {"s.json": js(OK_STREAM)},
         first=r"trace: argument --engine: invalid choice: 'sglang'"),
    Case("unknown command", ["frobnicate"], first=r"harness: argument command: invalid choice"),
    Case("replay: one file not JSON", ["replay", "traces"],
         {"traces/a.json": "{}", "traces/b.json": "{oops"},
         first=r"traces/b\.json: not valid JSON: Expecting property name"),
    Case("replay: no such folder", ["replay", "gone"], first=r"gone: no such folder"),
    Case("replay: empty folder", ["replay", "traces"], {"traces/.keep": ""},
         first=r"traces: no recorded traces"),
    Case("upgrade-check: not a release number", ["upgrade-check", "0.12"],
         first=r"VLLM: '0\.12' is not a release number like 0\.12\.0"),
    Case("mutants --budget -1", ["mutants", "--budget", "-1"],
         first=r"mutants: argument --budget: -1\.0 must be > 0"),
    Case("reach --only an unknown property", ["reach", "--only", "bogus"],
         first=r"--only: unknown property 'bogus' \(whole_space, "),
    Case("reach --floor 0", ["reach", "--floor", "0"],
         first=r"reach: argument --floor: 0 must be > 0"),
]


def _materialize(work: Path, files: dict[str, str | bytes]) -> None:
    for rel, content in files.items():
        path = work / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if content == b"SPARSE":
            with path.open("wb") as f:
                f.truncate((64 << 20) + 1)
        elif isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)


def _tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


@dataclass
class Outcome:
    code: int
    stderr: list[str]
    stdout: str
    written: set[str]  # files and folders that appeared anywhere under the temporary root


def run_case(case: Case, root: Path) -> Outcome:
    work = root / "a" / "b" / "work"
    work.mkdir(parents=True)
    _materialize(work, case.files)
    before = _tree(root)
    cwd = os.getcwd()
    os.chdir(work)
    out, err = _Capture(), _Capture()
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = out, err
    try:
        try:
            code = main(case.argv)
        except SystemExit as exc:  # argparse's --help / usage errors
            code = exc.code if isinstance(exc.code, int) else 2
    finally:
        sys.stdout, sys.stderr = saved
        os.chdir(cwd)
    return Outcome(code, err.getvalue().splitlines(), out.getvalue(), _tree(root) - before)


class _Capture:
    def __init__(self) -> None:
        self.parts: list[str] = []

    def write(self, text: str) -> int:
        self.parts.append(text)
        return len(text)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False

    def getvalue(self) -> str:
        return "".join(self.parts)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_bad_input(case, tmp_path, monkeypatch):
    monkeypatch.setenv("HARNESS_COUNTEREXAMPLES", str(tmp_path / "counterexamples"))
    got = run_case(case, tmp_path)
    assert got.code == case.code, got.stderr
    assert len(got.stderr) == case.lines, got.stderr
    assert all(line.startswith("error: ") for line in got.stderr), got.stderr
    assert re.match(case.first, got.stderr[0].removeprefix("error: ")), got.stderr[0]
    assert "Traceback" not in "".join(got.stderr) + got.stdout
    assert not got.written, f"wrote {sorted(got.written)}"


def test_there_are_at_least_30_kinds():
    assert len({c.name for c in CASES}) == len(CASES) >= 30


def test_full_stdout_is_one_line_and_exit_2(tmp_path):
    """stdout on a full disk (/dev/full): the trace cannot be written."""
    stream = tmp_path / "s.json"
    stream.write_text(js(OK_STREAM))
    with open("/dev/full", "w") as full:
        proc = subprocess.run([sys.executable, "-m", "harness", "trace", "--engine", "reference",
                               str(stream)], stdout=full, stderr=subprocess.PIPE, text=True,
                              timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.splitlines() == ["error: No space left on device"]


def test_full_disk_under_o_is_one_line_and_exit_2(tmp_path, monkeypatch, capsys):
    import errno

    from harness.formats import paths

    def no_space(path, text):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(paths, "write_atomic", no_space)
    monkeypatch.setattr("harness.loop.runner.write_atomic", no_space)
    stream = tmp_path / "s.json"
    stream.write_text(js(OK_STREAM))
    assert main(["trace", "--engine", "reference", str(stream), "-o", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "No space left on device" in err[0]
    assert not list((tmp_path / "out").iterdir())


@pytest.mark.slow
def test_unknown_mutant_is_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HARNESS_MUTANT", "no_such_mutant")
    assert main(["replay"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "error: HARNESS_MUTANT: unknown mutant 'no_such_mutant'"]


def markdown_table(root: Path) -> str:
    rows = ["| input | command | exit | stderr lines | first line | written |",
            "|---|---|---|---|---|---|"]
    for i, case in enumerate(CASES):
        got = run_case(case, root / str(i))
        first = got.stderr[0] if got.stderr else ""
        rows.append(f"| {case.name} | `{' '.join(case.argv)[:50]}` | {got.code} | {len(got.stderr)} "
                    f"| `{first[:90]}` | {', '.join(sorted(got.written)) or 'nothing'} |")
    return "\n".join(rows)


if __name__ == "__main__":
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        print(markdown_table(Path(tmp)))
