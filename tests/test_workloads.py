"""Real traffic: ``python -m harness import`` and ``python -m harness workload``.

The importer on each bundled trace sample (fixtures/workloads/): valid streams,
the same bytes for the same arguments, prefix sharing and arrival spacing kept;
bad input (exit 2, one line, nothing written); the workload table; and the
smallest pool it finds, held to vLLM itself.
"""

from __future__ import annotations

import json
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import pytest

from harness import cli
from harness.formats.paths import FIXTURES_DIR
from harness.formats.stream import load_stream, parse_stream
from harness.formats.public_traces import (ImportOptions, WorkloadError, build_streams,
                                           read_trace, round_half_up, window_starts)
from harness.jobs.workload_report import run_usage, smallest_pool, with_pool, workload_report

SAMPLES = FIXTURES_DIR / "workloads"
MOONCAKE = SAMPLES / "mooncake_conversation.jsonl"
BUNDLED = [("mooncake", "mooncake_conversation.jsonl"), ("mooncake", "mooncake_synthetic.jsonl"),
           ("azure", "azure_code.csv"), ("azure", "azure_conv.csv")]

# Rows in BurstGPT's documented schema, written by hand: the real file is not bundled
# (an LFS pointer in the snapshot read; see fixtures/workloads/README.md).
BURSTGPT = ("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
            "5,ChatGPT,472,18,490,Conversation log\n"
            "45,ChatGPT,1087,230,1317,Conversation log\n"
            "45.5,GPT-4,0,0,0,API log\n"
            "118,GPT-4,417,276,693,Conversation log\n")


def run_cli(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=120)


def files_of(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


# ---------------------------------------------------------------------------
# The importer on the bundled samples
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("fmt,name", BUNDLED)
def test_bundled_sample_imports_to_valid_streams_byte_for_byte(tmp_path, fmt, name):
    args = ["import", fmt, str(SAMPLES / name), "--window", "12", "--windows", "2",
            "--configs", "2", "--seed", "3"]
    first = run_cli([*args, "-o", str(tmp_path / "a")], cwd=tmp_path)
    second = run_cli([*args, "-o", str(tmp_path / "b")], cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    assert first.stderr == ""
    a, b = files_of(tmp_path / "a"), files_of(tmp_path / "b")
    assert a == b and len(a) == 4
    stem = Path(name).stem
    for file in a:
        stream = load_stream(tmp_path / "a" / file)  # every rule of the format
        assert file.startswith(f"{stem}_w") and file.endswith((".json"))
        assert stream.name == file[:-5]
        assert name in stream.description and "lines " in stream.description
        assert len(stream.requests) == 12
    assert len(first.stdout.splitlines()) == 4


def test_other_arguments_other_bytes(tmp_path):
    one = build_streams(MOONCAKE, "mooncake", ImportOptions(window=8, seed=1))
    two = build_streams(MOONCAKE, "mooncake", ImportOptions(window=8, seed=2))
    assert one[0].stream.name != two[0].stream.name
    assert window_starts(300, ImportOptions(window=8, windows=5, seed=7)) == \
        window_starts(300, ImportOptions(window=8, windows=5, seed=7))


def _window(options: ImportOptions):
    imported = build_streams(MOONCAKE, "mooncake", options)[0]
    stream = imported.stream
    start = int(stream.name.split("_w")[1].split("_")[0])
    _, records = read_trace(MOONCAKE, "mooncake", set(range(start, start + options.window)))
    return stream, records


def test_hash_ids_become_shared_pages_exactly():
    """Two requests with equal hash-id prefixes have equal token prefixes of that many
    pages, and differ on the page after it (where both prompts reach it)."""
    stream, records = _window(ImportOptions(window=64, seed=0))
    bs = stream.config.block_size
    pairs = shared = 0
    for i, (ri, a) in enumerate(zip(stream.requests, records)):
        for rj, b in list(zip(stream.requests, records))[:i]:
            common = 0
            while (common < min(len(a.hash_ids), len(b.hash_ids))
                   and a.hash_ids[common] == b.hash_ids[common]):
                common += 1
            n = min(common * bs, len(ri.prompt), len(rj.prompt))
            assert ri.prompt[:n] == rj.prompt[:n]
            page = slice(common * bs, (common + 1) * bs)
            if len(ri.prompt) > common * bs and len(rj.prompt) > common * bs:
                assert not set(ri.prompt[page]) & set(rj.prompt[page])
            pairs += 1
            shared += common > 0
    assert pairs and shared  # the conversation trace's first hash id is common to most


def test_sharing_is_the_only_sharing():
    """Tokens outside shared hash ids, and outputs, are each request's own."""
    stream, records = _window(ImportOptions(window=40, seed=5))
    bs = stream.config.block_size
    owner: dict[int, object] = {}
    for r, rec in zip(stream.requests, records):
        for i, token in enumerate(r.prompt):
            key = ("hash", rec.hash_ids[i // bs]) if i // bs < len(rec.hash_ids) else (r.id, i)
            assert owner.setdefault(token, key) == key
        for token in r.output:
            assert owner.setdefault(token, (r.id, "out")) == (r.id, "out")


def test_order_spacing_and_length_ratios_kept():
    options = ImportOptions(window=50, seed=2, ms_per_step=Fraction(250))
    stream, records = _window(options)
    t0 = records[0].arrival_ms
    scale = Fraction(stream.config.block_size, 512)
    assert [r.id for r in stream.requests] == [f"r{rec.index}" for rec in records]
    for r, rec in zip(stream.requests, records):
        assert r.arrival_step == round_half_up((rec.arrival_ms - t0) / 250)
        assert len(r.prompt) == max(1, round_half_up(rec.prompt_tokens * scale))
        assert len(r.output) == max(1, round_half_up(rec.output_tokens * scale))
    steps = [r.arrival_step for r in stream.requests]
    assert steps == sorted(steps) and steps[0] == 0


def test_clipped_to_max_model_len():
    imported = build_streams(MOONCAKE, "mooncake", ImportOptions(
        window=30, seed=0, config={"max_model_len": 64}))[0]
    s = imported.stream
    assert imported.clipped > 0 and f"{imported.clipped} request(s) clipped" in s.description
    assert all(len(r.prompt) < 64 and len(r.prompt) + len(r.output) <= 64 for r in s.requests)
    assert all(len(r.output) >= 1 for r in s.requests)


def test_drawn_configs_vary_and_stay_valid():
    imported = build_streams(MOONCAKE, "mooncake", ImportOptions(window=10, configs=12, seed=9))
    configs = [i.stream.config for i in imported]
    assert len({c.num_gpu_blocks for c in configs}) > 3
    assert {c.policy for c in configs} == {"fcfs", "priority"}
    assert any(c.num_speculative_tokens for c in configs)
    for i in imported:
        parse_stream(i.stream.to_json())
        spec = i.stream.config.num_speculative_tokens
        assert all(bool(r.drafts) == bool(spec and len(r.output) > 1) for r in i.stream.requests)
    # Options given stay fixed over the draws.
    fixed = build_streams(MOONCAKE, "mooncake", ImportOptions(
        window=10, configs=6, seed=9, config={"policy": "fcfs", "max_num_seqs": 4}))
    assert {(i.stream.config.policy, i.stream.config.max_num_seqs) for i in fixed} == {("fcfs", 4)}


def test_generic_jsonl_prefix_groups_and_hash_ids(tmp_path):
    trace = tmp_path / "mine.jsonl"
    lines = [{"arrival_ms": 0, "prompt_tokens": 2048, "output_tokens": 64, "prefix_group": "sys",
              "prefix_tokens": 1024},
             {"arrival_ms": 40.5, "prompt_tokens": 1500, "output_tokens": 32, "prefix_group": "sys",
              "prefix_tokens": 1024},
             {"timestamp": 90, "prompt_tokens": 700, "output_tokens": 10,
              "hash_ids": ["a", "b"]},
             {"timestamp": 90, "prompt_tokens": 1024, "output_tokens": 10,
              "hash_ids": ["a", "c"]},
             {"arrival_ms": 300, "prompt_tokens": 100, "output_tokens": 1}]
    trace.write_text("\n".join(json.dumps(x) for x in lines) + "\n\n")
    s = build_streams(trace, "jsonl", ImportOptions(window=5, ms_per_step=Fraction(20)))[0].stream
    a, b, c, d, e = s.requests
    assert [r.arrival_step for r in s.requests] == [0, 2, 5, 5, 15]  # 40.5 / 20 rounds to 2
    assert a.prompt[:32] == b.prompt[:32] and a.prompt[32] != b.prompt[32]  # 1024 * 16/512
    assert c.prompt[:16] == d.prompt[:16] and not set(c.prompt[16:]) & set(d.prompt[16:])
    assert not set(e.prompt) & set(a.prompt + c.prompt)


def test_burstgpt_rows(tmp_path):
    trace = tmp_path / "burst.csv"
    trace.write_text(BURSTGPT)
    s = build_streams(trace, "burstgpt", ImportOptions(
        window=4, ms_per_step=Fraction(1000), scale=Fraction(1, 8)))[0].stream
    assert [r.arrival_step for r in s.requests] == [0, 40, 41, 113]  # 40.5 s rounds up
    assert [len(r.prompt) for r in s.requests] == [59, 136, 1, 52]  # 0 tokens: at least 1
    assert [len(r.output) for r in s.requests] == [2, 29, 1, 35]
    assert len({t for r in s.requests for t in r.prompt}) == sum(len(r.prompt) for r in s.requests)


# ---------------------------------------------------------------------------
# Bad input: exit 2, one line on stderr, nothing written
# ---------------------------------------------------------------------------

GOOD_LINE = '{"timestamp": 0, "input_length": 600, "output_length": 20, "hash_ids": [1, 2]}\n'
BAD = {
    "no such trace": ("mooncake", None, [], "nope.jsonl: cannot read"),
    "not JSON": ("mooncake", GOOD_LINE + "{oops\n", [], "line 2: not valid JSON"),
    "not an object": ("mooncake", "[1, 2]\n", [], "line 1: must be a JSON object"),
    "field missing": ("mooncake", '{"timestamp": 0, "input_length": 5, "output_length": 1}\n',
                      [], "line 1: hash_ids: missing"),
    "negative length": ("mooncake", GOOD_LINE.replace("600", "-600"), [],
                        "line 1: input_length: must be an integer >= 0"),
    "absurd length": ("mooncake", GOOD_LINE.replace("600", "1" + "0" * 60), [],
                      "line 1: input_length: "),
    "NaN time": ("mooncake", GOOD_LINE.replace('"timestamp": 0', '"timestamp": NaN'), [],
                 "line 1: not valid JSON"),
    "absurd time": ("mooncake", GOOD_LINE.replace('"timestamp": 0', '"timestamp": 1e999999999'),
                    [], "line 1: timestamp: must be a number"),
    "time goes back": ("mooncake", GOOD_LINE.replace("0,", "500,", 1) + GOOD_LINE, [],
                       "line 2: time goes back"),
    "bad hash ids": ("mooncake", GOOD_LINE.replace("[1, 2]", "[1, -2]"), [],
                     "line 1: hash_ids: must be a list"),
    "line over 1 MiB": ("mooncake", '{"x": "' + "a" * (1 << 20) + '"}\n', [],
                        "line 1: longer than 1 MiB"),
    "not UTF-8": ("mooncake", b"\xff\xfe\n", [], "line 1: not UTF-8"),
    "empty trace": ("mooncake", "\n", [], "holds no request"),
    "csv column missing": ("azure", "TIMESTAMP,ContextTokens\n2023-11-16 18:17:03.97,5\n", [],
                           "line 1: GeneratedTokens: missing column"),
    "csv bad time": ("azure", "TIMESTAMP,ContextTokens,GeneratedTokens\nyesterday,5,3\n", [],
                     "line 2: TIMESTAMP: not a time"),
    "csv short row": ("burstgpt", BURSTGPT + "200,ChatGPT\n", [], "line 6: 2 columns"),
    "jsonl unknown field": ("jsonl", '{"arrival_ms": 0, "prompt_tokens": 5, "output_tokens": 1, '
                                     '"promt": 3}\n', [], "line 1: promt: unknown field"),
    "jsonl two times": ("jsonl", '{"arrival_ms": 0, "timestamp": 0, "prompt_tokens": 5, '
                                 '"output_tokens": 1}\n', [], "line 1: arrival_ms: give exactly"),
    "window too big": ("mooncake", GOOD_LINE, ["--window", "5000"], "--window: at most 4096"),
    "window past the trace": ("mooncake", GOOD_LINE * 3, ["--window", "4"],
                              "--window: 4 requests, but the trace holds 3"),
    "too many windows": ("mooncake", GOOD_LINE * 3, ["--window", "2", "--windows", "3"],
                         "--windows: 3 windows"),
    "too many streams": ("mooncake", GOOD_LINE, ["--window", "1", "--windows", "40",
                                                 "--configs", "40"], "more than 1000 streams"),
    "window zero": ("mooncake", GOOD_LINE, ["--window", "0"], "--window: 0 must be > 0"),
    "ms-per-step zero": ("mooncake", GOOD_LINE, ["--ms-per-step", "0"], "--ms-per-step: 0 must"),
    "span past the step bound": ("mooncake", GOOD_LINE + GOOD_LINE.replace("0,", "9000000,", 1),
                                 ["--window", "2", "--ms-per-step", "1"],
                                 "--ms-per-step: the window at line 1 spans"),
    "scale against hash ids": ("mooncake", GOOD_LINE, ["--window", "1", "--scale", "1/8"],
                               "--scale: the trace has hash ids"),
    "config that vLLM refuses": ("mooncake", GOOD_LINE, ["--window", "1", "--max-num-seqs", "64",
                                                         "--max-num-batched-tokens", "32"],
                                 "config.max_num_batched_tokens: must be >= max_num_seqs"),
    "unknown policy": ("mooncake", GOOD_LINE, ["--policy", "lifo"], "argument --policy"),
    "config file unknown field": ("mooncake", GOOD_LINE, ["--config", "CONFIG"],
                                  "--config: blocksize: unknown config field"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input(tmp_path, case):
    fmt, text, extra, expected = BAD[case]
    trace = tmp_path / ("nope.jsonl" if text is None else "t.txt")
    if isinstance(text, str):
        trace.write_text(text)
    elif isinstance(text, bytes):
        trace.write_bytes(text)
    if "CONFIG" in extra:
        (tmp_path / "c.json").write_text('{"blocksize": 4}')
        extra = [str(tmp_path / "c.json") if x == "CONFIG" else x for x in extra]
    before = sorted(p.name for p in tmp_path.iterdir())
    out = tmp_path / "out"
    proc = run_cli(["import", fmt, str(trace), "-o", str(out), *extra], cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: ") and expected in lines[0], lines[0]
    assert "Traceback" not in proc.stderr and proc.stdout == ""
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_output_is_a_file(tmp_path):
    (tmp_path / "taken").write_text("x")
    proc = run_cli(["import", "azure", str(SAMPLES / "azure_code.csv"), "--window", "2",
                    "-o", str(tmp_path / "taken")], cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr == f"error: -o {tmp_path / 'taken'}: is a file, not a folder\n"


def test_library_errors_are_one_line():
    with pytest.raises(WorkloadError, match="--window: 301 requests, but the trace holds 300"):
        build_streams(MOONCAKE, "mooncake", ImportOptions(window=301))


# ---------------------------------------------------------------------------
# The workload command
# ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def small_dir(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("workload")
    proc = run_cli(["import", "mooncake", str(MOONCAKE), "--window", "12", "--windows", "2",
                    "-o", str(folder)], cwd=folder)
    assert proc.returncode == 0, proc.stderr
    return folder


@pytest.mark.slow
def test_workload_table(small_dir, tmp_path):
    proc = run_cli(["workload", str(small_dir)], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    text = proc.stdout
    for column in ("steps", "prefix hits", "preemptions", "peak pages", "pages/request",
                   "smallest pool", "one page fewer"):
        assert column in text
    names = sorted(p.stem for p in small_dir.glob("*.json"))
    assert all(name in text for name in names) and "total (2 streams)" in text
    assert "preemption(s)" in text


@pytest.mark.slow
def test_workload_json_and_the_pool_it_finds(small_dir, capsys):
    assert cli.main(["workload", str(small_dir), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)["streams"]
    from harness.engines import get_engine
    from harness.loop.runner import run
    engine = get_engine("reference")
    for row in report:
        stream = load_stream(small_dir / f"{row['name']}.json")
        assert row["steps"] == len(run(engine, stream).steps)
        pages = row["smallest_pool"]
        assert run_usage(engine, with_pool(stream, pages)).clean
        assert row["one_page_fewer"]["preemptions"] >= 1
        assert not run_usage(engine, with_pool(stream, pages - 1)).clean
        assert row["monotone"] is True
        assert 0 <= row["hit_tokens"] <= row["prompt_tokens"]
        assert row["peak_pages"] <= row["pool"] - 1


def test_search_stops_at_room_for_every_request():
    """A stream no pool can help (max_steps too short) is reported, not searched forever."""
    from harness.engines import get_engine
    stream = parse_stream({
        "config": {"block_size": 4, "num_gpu_blocks": 16, "max_num_batched_tokens": 16,
                   "max_num_seqs": 4, "max_model_len": 32, "max_steps": 5},
        "requests": [{"id": "a", "prompt": list(range(1, 20)), "output": list(range(30, 40))}]})
    found = smallest_pool(stream, get_engine("reference"))
    assert found.pages is None and sorted(found.runs) == [16]
    assert found.text() == "none (16 pages: max_steps, 0 preemption(s))"


def test_workload_plot(small_dir, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    plot = tmp_path / "usage.png"
    assert cli.main(["workload", str(small_dir), "--no-search", "--plot", str(plot)]) == 0
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [p.name for p in tmp_path.iterdir()] == ["usage.png"]


def test_workload_plot_without_matplotlib(small_dir, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises
    assert cli.main(["workload", str(small_dir), "--plot", str(tmp_path / "u.png")]) == 2
    err = capsys.readouterr().err
    assert err == "error: --plot: matplotlib is not installed (pip install -e '.[bench]')\n"
    assert not list(tmp_path.iterdir())


def test_workload_bad_stream(tmp_path):
    (tmp_path / "s.json").write_text("{")
    proc = run_cli(["workload", str(tmp_path / "s.json")], cwd=tmp_path)
    assert proc.returncode == 2 and len(proc.stderr.splitlines()) == 1


# ---------------------------------------------------------------------------
# The smallest pool, held to vLLM
# ---------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.needs_vllm
def test_smallest_pool_holds_on_vllm(vllm_engine):
    """For a bundled Mooncake window, the pool the search finds on the reference runs on
    vLLM without a preemption, and one page fewer preempts."""
    stream = build_streams(MOONCAKE, "mooncake", ImportOptions(window=24, seed=0))[0].stream
    [report] = workload_report([stream])
    found = report.search.pages
    assert found is not None and found < stream.config.num_gpu_blocks
    at = run_usage(vllm_engine, with_pool(stream, found))
    below = run_usage(vllm_engine, with_pool(stream, found - 1))
    assert at.verdict == "completed" and at.preemptions == 0
    assert below.preemptions >= 1
    assert smallest_pool(stream, vllm_engine).pages == found


@pytest.mark.slow
def test_docs_example_is_real(tmp_path):
    """docs/workloads.md's example: the import's lines and the workload table are what the
    commands print (run into a temporary folder instead of /tmp/mooncake)."""
    from harness.formats.paths import DOCS_DIR, ROOT
    page = (DOCS_DIR / "workloads.md").read_text()
    shown = {}
    for block in page.split("```")[1::2]:
        block = block.removeprefix("\n")
        if block.startswith("$ .venv/bin/python -m harness "):
            command, _, output = block.partition("\n")
            shown[command.removeprefix("$ ")] = output
    [imp] = [c for c in shown if " import " in c]
    [work] = [c for c in shown if " workload " in c]
    folder = str(tmp_path / "mooncake")
    for command in (imp, work):
        argv = command.replace("/tmp/mooncake", folder).split()[1:]
        proc = subprocess.run([sys.executable, *argv], cwd=ROOT, capture_output=True,
                              text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.replace(folder, "/tmp/mooncake") == shown[command]


def test_smallest_pool_is_where_every_larger_pool_runs_clean():
    """More pages do not always mean fewer preemptions: on the bundled window 80 pages run
    clean and 91 preempt once, so the answer is 92, from which every pool up to room for
    every request runs clean (the scan ran each; vLLM's recorded traces of
    real_mooncake_smallest_pool and real_mooncake_one_page_fewer hold 92 and 91 on every
    recorded release)."""
    from harness.engines import get_engine
    from harness.formats.paths import STREAMS_DIR
    engine = get_engine("reference", release="0.11.0")
    stream = load_stream(STREAMS_DIR / "real_mooncake_smallest_pool.json")
    search = smallest_pool(stream, engine)
    assert search.pages == 92 and search.monotone and not search.note
    assert all(u.clean for pages, u in search.runs.items() if pages >= 92)
    assert not search.runs[91].clean
    assert run_usage(engine, with_pool(stream, 80)).clean


def test_a_campaign_of_real_workloads_draws_windows_of_the_samples():
    """``fuzz --property real_workloads``: the chunks draw that property's streams (the
    importer's request ids, each request's arrival step), not the whole space's."""
    from harness.jobs.chunks import chunks_of, given_campaign
    assert {c.property for c in chunks_of(120, 0, prop="real_workloads")} == {"real_workloads"}
    seen: list[dict] = []

    def body(data):
        seen.append(data)

    given_campaign(body, 5, 0, prop="real_workloads")()
    assert seen and all(r["id"].startswith("r") and "arrival_step" in r
                        for data in seen for r in data["requests"])
