"""Suspect lines (harness/jobs/suspects.py): vLLM's diff between two releases, cut to the
hunks a diverging stream ran and ranked; ``upgrade-check --forget``'s refusals.  The runs
under coverage in two releases are exercised by ``make upgrade-check`` (docs/upgrading.md
has the table of ranks they give on known changes)."""

from __future__ import annotations

import json

import pytest

from harness.cli.main import main
from harness.jobs.suspects import Hunk, hunks_of, markdown, rank, stub


def tree(root, name: str, files: dict[str, str]):
    top = root / name / "vllm"
    for path, text in files.items():
        (top / path).parent.mkdir(parents=True, exist_ok=True)
        (top / path).write_text(text)
    return top


def test_hunks_name_their_lines_on_both_sides(tmp_path):
    old = tree(tmp_path, "old", {"v1/core/sched.py": "a\nb\nc\nd\ne\n"})
    new = tree(tmp_path, "new", {"v1/core/sched.py": "a\nB\nc\nd\ne\nf\n"})
    hunks = hunks_of("vllm/v1/core/sched.py", old, new)
    assert [(h.old_start, h.old_end, h.new_start, h.new_end) for h in hunks] == [
        (2, 3, 2, 3), (6, 6, 6, 7)]
    assert hunks[0].text == "-b\n+B"
    assert hunks[1].where() == "vllm/v1/core/sched.py:6-6"
    assert hunks_of("vllm/v1/core/sched.py", old, old) == []


def test_a_file_only_in_one_release_is_one_hunk(tmp_path):
    old = tree(tmp_path, "old", {"x.py": "a\n"})
    new = tree(tmp_path, "new", {"x.py": "a\n", "v1/new.py": "p\nq\n"})
    [hunk] = hunks_of("vllm/v1/new.py", old, new)
    assert (hunk.old_start, hunk.old_end, hunk.new_start, hunk.new_end) == (1, 1, 1, 3)


def h(path: str, new: tuple[int, int], old: tuple[int, int] = (1, 1)) -> Hunk:
    return Hunk(path, old[0], old[1], new[0], new[1], "+x")


def test_the_branch_only_the_diverging_stream_takes_comes_first():
    common = h("vllm/v1/core/sched/scheduler.py", (10, 12))   # every stream runs line 10
    branch = h("vllm/model_executor/x.py", (30, 31))          # only the diverging one
    idle = h("vllm/v1/core/block_pool.py", (50, 52))          # no stream runs it
    fail = {"vllm/v1/core/sched/scheduler.py": frozenset({10}),
            "vllm/model_executor/x.py": frozenset({30})}
    passing = [{"vllm/v1/core/sched/scheduler.py": frozenset({10})}] * 3
    ranked = rank([common, branch, idle], [fail], passing, [], [])
    assert [s.hunk for s in ranked] == [branch, common]
    assert ranked[0].score == 1.0 and ranked[1].score == pytest.approx(0.5)


def test_a_line_every_diverging_run_takes_beats_one_only_the_example_takes():
    rule = h("vllm/v1/core/sched/utils.py", (40, 41))
    feature = h("vllm/v1/core/encoder_cache_manager.py", (7, 8))
    example = {"vllm/v1/core/sched/utils.py": frozenset({40}),
               "vllm/v1/core/encoder_cache_manager.py": frozenset({7})}
    others = [{"vllm/v1/core/sched/utils.py": frozenset({40})}] * 4
    passing = [{"vllm/v1/core/sched/utils.py": frozenset({40})}] * 10
    ranked = rank([feature, rule], [example, *others], passing, [], [])
    assert [s.hunk for s in ranked] == [rule, feature]
    # a hunk the example does not run is no suspect, however the others run it
    assert rank([rule], [{}, *others], passing, [], []) == []


def test_a_removed_line_counts_on_the_old_side():
    removed = h("vllm/v1/core/kv_cache_utils.py", (5, 5), old=(7, 9))
    ranked = rank([removed], [{}], [], [{"vllm/v1/core/kv_cache_utils.py": frozenset({8})}], [])
    assert [s.lines_run for s in ranked] == [1]
    assert "old lines 7-8 removed" in removed.where()


def test_ties_go_to_the_core_then_the_engine_then_the_smaller_hunk():
    other = h("vllm/config/vllm.py", (1, 2))
    engine = h("vllm/v1/engine/core.py", (1, 2))
    core_big = h("vllm/v1/core/block_pool.py", (1, 9))
    core = h("vllm/v1/core/block_pool.py", (20, 21))
    fail = {p: frozenset(range(1, 30)) for p in
            ("vllm/config/vllm.py", "vllm/v1/engine/core.py", "vllm/v1/core/block_pool.py")}
    ranked = rank([other, engine, core_big, core], [fail], [], [], [])
    assert [s.hunk for s in ranked] == [core, core_big, engine, other]


def test_the_report_shows_the_best_hunks_and_a_stub():
    found = rank([h("vllm/v1/core/block_pool.py", (3, 4))],
                 [{"vllm/v1/core/block_pool.py": frozenset({3})}], [], [], [])
    text = "\n".join(markdown(found))
    assert "1. `vllm/v1/core/block_pool.py:3-3` (score 1.00, 1 line(s) run)" in text
    assert "```diff\n+x\n```" in text
    assert 'mirrors="vllm/v1/core/block_pool.py"' in stub("0.35.0", "block_ids", found)
    assert markdown([]) == ["No line of the diff between the two releases ran on the "
                            "diverging stream."]


@pytest.mark.parametrize("argv, message", [
    (["upgrade-check", "0.24.0", "--forget", "no_such_change"],
     "--forget: 'no_such_change' is not a rule change of reference/releases.py"),
    (["upgrade-check", "0.24.0", "--forget", "admission_reserves_whole_sequence"],
     "--forget: admission_reserves_whole_sequence is in effect at both 0.23.0 and 0.24.0: "
     "leaving it out changes nothing"),
    (["upgrade-check", "0.24.0", "--from", "0.19.0", "--forget", "stop_tokens_before_length"],
     "--forget: stop_tokens_before_length is in effect at both 0.19.0 and 0.24.0"),
    (["upgrade-check", "latest", "--forget", "every_uncached_page_reused_first"],
     "--forget: not with latest"),
])
def test_forget_refuses_what_would_change_nothing(argv, message, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {message}") and err.count("\n") == 1
    assert list(tmp_path.iterdir()) == []


def test_a_formatters_hunk_is_no_suspect():
    reflowed = Hunk("vllm/v1/core/x.py", 1, 3, 1, 4,
                    "-    if (a and\n-            b(c, d,)):\n+    if (\n+        a and b(c, d)\n+    ):")
    quoted = Hunk("vllm/v1/core/x.py", 1, 2, 1, 2, "-    t = os.getenv('X')\n+    t = os.getenv(\"X\")")
    changed = Hunk("vllm/v1/core/x.py", 1, 2, 1, 2, "-    if a and b:\n+    if a or b:")
    commented = Hunk("vllm/v1/core/x.py", 1, 1, 1, 4,
                     "+        # null pages are skipped\n+        if blk.is_null:\n+            continue")
    only_comment = Hunk("vllm/v1/core/x.py", 1, 1, 1, 2, "+    # a note '#' on pages")
    assert reflowed.layout_only and quoted.layout_only and not changed.layout_only
    assert not commented.layout_only and only_comment.layout_only
    fail = {"vllm/v1/core/x.py": frozenset({1})}
    assert [s.hunk for s in rank([reflowed, quoted, changed], [fail], [], [], [])] == [changed]


def test_the_near_misses_are_the_example_cut_once_that_no_longer_diverge():
    """``upgrade_campaign.neighbours``: the streams one cut from a cause's example, split
    into those that still show the cause and those that behave as before."""
    import types

    from harness.jobs.upgrade_campaign import neighbours
    example = {"config": {"block_size": 4, "num_gpu_blocks": 16, "max_num_batched_tokens": 16,
                          "max_num_seqs": 4, "max_model_len": 32},
               "requests": [{"id": "a", "prompt": [1, 2, 3, 4], "output": [5, 6]},
                            {"id": "b", "prompt": [7, 8], "output": [9]}]}

    from harness.engines.reference_engine import ReferenceEngine
    from harness.loop.runner import run

    def traces(stream):  # "diverges" while request b is there
        old = run(ReferenceEngine(), stream).to_json()
        new = json.loads(json.dumps(old))
        new["steps"][0]["free_blocks"] += any(r.id == "b" for r in stream.requests)
        return new, old, new

    checker = types.SimpleNamespace(traces=traces)

    def fails(stream, new, old, target):
        return new != old

    showing, unchanged = neighbours(checker, example, fails)
    assert all(any(r.id == "b" for r in s.requests) for s in showing) and showing
    assert [[r.id for r in s.requests] for s in unchanged] == [["a"]]
