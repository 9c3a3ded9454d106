"""The upgrade check's parts that need no other vLLM: version shims, side environments,
the could-not-drive path, the index of releases tried."""

from __future__ import annotations

import inspect
import json
import types

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.jobs import side_env, upgrade_check
from harness.cli import main


@pytest.mark.parametrize("version", ["0.12", "newest", "0.12.0; rm -rf /", "../0.12.0", ""])
def test_bad_release_numbers_are_refused(version, capsys):
    assert main(["upgrade-check", version]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("error: VLLM: ")


@pytest.mark.parametrize("args, message", [
    (["0.19.0", "--from", "0.10.0"], "FROM: the reference does not describe vLLM 0.10.0"),
    (["0.12.0", "--from", "0.13.0"], "FROM: 0.13.0 is not older than VLLM=0.12.0"),
    (["0.19.0", "no-such-folder"], "no-such-folder: not a folder of streams"),
])
def test_bad_from_or_streams_folder_is_one_line_exit_2(args, message, capsys):
    assert main(["upgrade-check", *args]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {message}")


def test_a_bad_stream_of_the_users_folder_is_refused_before_any_download(tmp_path, capsys,
                                                                        monkeypatch):
    (tmp_path / "mine.json").write_text('{"config": {"block_size": 0}, "requests": []}')
    monkeypatch.setattr(upgrade_check, "ensure_overlay", lambda *a, **k: pytest.fail("downloaded"))
    assert main(["upgrade-check", "0.19.0", str(tmp_path)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err and all(line.startswith(f"error: {tmp_path / 'mine.json'}: ") for line in err)
    assert any("config.block_size" in line for line in err)


@pytest.mark.needs_vllm
def test_an_upgrade_from_a_later_release_turns_its_changes_over():
    """From 0.11.1, a change 0.11.1 has is tried by taking it away, one it lacks by adding it."""
    from harness.jobs.upgrade_campaign import Checker
    from reference import releases
    checker = Checker("0.13.0", old="0.11.1")
    assert checker.base.rules == releases.rules_of("0.11.1")
    capped = checker.base_with({"running_tokens_capped_by_max_tokens"}).rules
    assert "running_tokens_capped_by_max_tokens" not in capped
    stops = checker.base_with({"chunked_off_stops_at_first_misfit"}).rules
    assert stops == releases.rules_of("0.11.1") | {"chunked_off_stops_at_first_misfit"}


@pytest.mark.parametrize("version", ["0.12.0", "0.11.2", "0.10.1.post1", "1.0.0rc1"])
def test_release_numbers_are_accepted(version):
    assert side_env.check_version(version) == version


def test_a_release_that_cannot_be_had_is_exit_3_with_a_report(tmp_path, monkeypatch, capsys):
    def no_wheel(version, log=print):
        raise side_env.SideEnvError("vllm==9.9.9: No matching distribution found for vllm==9.9.9")

    monkeypatch.setattr(upgrade_check, "ensure_overlay", no_wheel)
    code = upgrade_check.upgrade_check("9.9.9", examples=10, seed=1, out=tmp_path, record=False)
    assert code == 3
    err = capsys.readouterr().err.splitlines()
    assert err == ["error: vLLM 9.9.9 cannot be driven: no side environment: vllm==9.9.9: "
                   "No matching distribution found for vllm==9.9.9"]
    assert "**Could not drive this release**" in (tmp_path / "9.9.9.md").read_text()
    index = (tmp_path / "README.md").read_text()
    assert "| 9.9.9 | no | could not drive: no side environment" in index


def test_the_index_keeps_one_row_per_release_in_order(tmp_path):
    for v, result in [("0.13.0", "different"), ("0.11.1", "different"), ("0.13.0", "same")]:
        upgrade_check._update_index(tmp_path, v, "yes", result, "none")
    rows = [line for line in (tmp_path / "README.md").read_text().splitlines()
            if line.startswith("| 0.")]
    assert [r.split(" | ")[0] for r in rows] == ["| 0.11.1", "| 0.13.0"]
    assert "| same |" in rows[1]


def test_the_committed_index_is_what_a_run_writes_above_its_rows():
    """A run rewrites docs/upgrades/README.md from INDEX_HEADER; words added to the page by
    hand and not to the header would be lost by the next run."""
    page = (upgrade_check.ROOT / "docs" / "upgrades" / "README.md").read_text().splitlines()
    assert page[:len(upgrade_check.INDEX_HEADER)] == upgrade_check.INDEX_HEADER


def test_the_summary_of_a_report(tmp_path):
    report = tmp_path / "x.md"
    report.write_text("# t\n\n## Verdict\n\n* **DIFFERENT**: 2 cause(s)\n"
                      "* The reference with the rules of 0.12.0 conforms on 5/5 generated and "
                      "1/1 bundled streams (exact).\n\n## Causes\n\n### stop_tokens_before_length\n\n"
                      "### unexplained: first difference in 'slots'\n\n## Bundled streams\n\n"
                      "### seed_x: different\n")
    result, causes = upgrade_check._summary(report)
    assert result == "different; the reference with 0.12.0's rules exact"  # no campaign line
    assert causes == "`stop_tokens_before_length`, `unexplained: first difference in 'slots'`"


def test_the_overlay_environment_puts_the_release_first(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", "/somewhere")
    env = side_env.overlay_environment("0.12.0")
    parts = env["PYTHONPATH"].split(":")
    assert parts[0].endswith(".venvs/vllm-0.12.0") and parts[-1] == "/somewhere"
    assert env["VLLM_CACHE_ROOT"].endswith(".venvs/cache/0.12.0")


# -- the version shims, on stand-ins shaped like the later releases' classes ----------------

@pytest.mark.needs_vllm
class TestShims:
    @pytest.fixture(autouse=True)
    def compat(self):
        from harness.engines import vllm_compat
        vllm_compat.DETECTED.clear()
        return vllm_compat

    def test_resumed_flags_from_a_set_of_ids(self, compat):
        later = types.SimpleNamespace(req_ids=["a", "b", "c"], resumed_req_ids={"b"})
        assert compat.resumed_flags(later) == [False, True, False]
        older = types.SimpleNamespace(req_ids=["a"], resumed_from_preemption=[True])
        assert compat.resumed_flags(older) == [True]

    def test_block_table_arguments_follow_the_signature(self, compat, monkeypatch):
        class Later:
            def __init__(self, block_size, kernel_block_size, cp_kv_cache_interleave_size): ...
        monkeypatch.setattr(compat, "BlockTable", Later)
        assert compat.block_table_kwargs(16) == {"kernel_block_size": 16,
                                                 "cp_kv_cache_interleave_size": 1}

    def test_scheduler_gets_block_size_when_it_asks(self, compat, monkeypatch):
        class Later:
            def __init__(self, vllm_config, block_size): ...
        monkeypatch.setattr(compat, "Scheduler", Later)
        vc = types.SimpleNamespace(cache_config=types.SimpleNamespace(block_size=8))
        assert compat.scheduler_kwargs(vc) == {"block_size": 8}
        assert "Scheduler(block_size=)" in compat.DETECTED

    def test_retention_copied_as_start_up_copies_it(self, compat):
        """0.29.0 on: the KVCacheConfig gets the cache config's retention (default 0)."""
        later = types.SimpleNamespace(prefix_cache_retention_interval=None)
        vc = types.SimpleNamespace(cache_config=types.SimpleNamespace(
            prefix_cache_retention_interval=0))
        assert compat.startup_retention(later, vc).prefix_cache_retention_interval == 0
        older = types.SimpleNamespace()  # no such field before 0.29.0
        assert compat.startup_retention(older, vc) is older and not vars(older)
        unset = types.SimpleNamespace(prefix_cache_retention_interval=None)
        assert compat.startup_retention(unset, types.SimpleNamespace(
            cache_config=types.SimpleNamespace())).prefix_cache_retention_interval is None

    def test_the_batch_queue_rule_read_from_the_engine_loop(self, compat):
        """0.23.0 on: step_with_batch_queue no longer asks the oldest batch's Future whether
        the worker is done (0.11.0's, installed here, does)."""
        def later(self):  # the 0.23.0 shape: full queue or no request left
            if len(self.batch_queue) < self.batch_queue_size and self.scheduler.has_requests():
                return None

        assert not compat.asks_whether_the_worker_is_done(later)
        assert compat.applies_batch_the_worker_is_done_with()

    def test_chunked_prefill_flag_where_it_lives(self, compat):
        later = types.SimpleNamespace(enable_chunked_prefill=False)
        assert compat.effective_chunked_prefill(later) is False

    def test_sampled_tokens_as_arrays_where_wanted(self, compat, monkeypatch):
        monkeypatch.setattr(compat, "_SAMPLED_AS_ARRAYS", True)
        out = compat.sampled_token_ids([[1, 2], []])
        assert [a.tolist() for a in out] == [[1, 2], []]

    @given(pages=st.lists(st.integers(0, 500), min_size=1, max_size=12),
           block_size=st.sampled_from([1, 2, 16]), data=st.data())
    @settings(max_examples=60, deadline=None,
              suppress_health_check=[HealthCheck.function_scoped_fixture])  # a module, no state
    def test_the_block_table_rule_is_the_numpy_slot_mapping(self, compat, pages, block_size, data):
        """The rule used for the kernel releases (0.19.0 on) gives the slots of the numpy
        ``compute_slot_mapping`` of the installed release, on vLLM's own BlockTable."""
        table = compat.cpu_block_table(block_size, 4, 12, 12 * 16)
        row = data.draw(st.integers(0, 3))
        table.add_row(pages, row)
        first = data.draw(st.integers(0, len(pages) * block_size - 1))
        count = data.draw(st.integers(1, len(pages) * block_size - first))
        by_numpy = compat.slot_mapping(table, row, first, count)
        assert by_numpy == compat.slots_from_block_table(table.block_table.np[row], block_size,
                                                         first, count)
        assert not compat.SLOTS_BY_KERNEL and len(by_numpy) == count

    def test_a_kernel_release_reads_the_row_vllm_wrote(self, compat, monkeypatch):
        import numpy as np
        monkeypatch.setattr(compat, "SLOTS_BY_KERNEL", True)
        table = types.SimpleNamespace(block_size=4,
                                      block_table=types.SimpleNamespace(np=np.array([[0, 0], [7, 2]])))
        assert compat.slot_mapping(table, 1, 3, 3) == [31, 8, 9]
        assert any("Triton kernel" in d for d in compat.DETECTED)

    def test_a_resumed_request_among_the_new_ones_is_traced_as_resumed(self, compat,
                                                                        monkeypatch):
        """0.34.0: no flag; a new request that has been preempted comes back from it."""
        later = types.SimpleNamespace(req_ids=["a", "b"])  # neither flag field
        assert compat.resumed_flags(later) == [False, False]
        new = [types.SimpleNamespace(req_id="x"), types.SimpleNamespace(req_id="y")]
        requests = {"x": types.SimpleNamespace(num_preemptions=0),
                    "y": types.SimpleNamespace(num_preemptions=2)}
        monkeypatch.setattr(compat, "RESUMED_AMONG_NEW", True)
        assert compat.resumed_among_new(new, requests) == [False, True]
        assert "resumed requests handed among the new ones" in compat.DETECTED
        monkeypatch.setattr(compat, "RESUMED_AMONG_NEW", False)  # flagged among the cached
        assert compat.resumed_among_new(new, requests) == [False, False]
        v2 = types.SimpleNamespace(use_v2_model_runner=True)  # the flag there, but unused
        assert compat.resumed_among_new(new, requests, v2) == [False, True]

    def test_runner_output_index_only_where_the_output_has_it(self, compat, monkeypatch):
        import dataclasses

        @dataclasses.dataclass
        class Later:
            req_ids: list
        monkeypatch.setattr(compat, "ModelRunnerOutput", Later)
        assert compat.runner_output_kwargs(["a", "b"]) == {}
        assert "ModelRunnerOutput without req_id_to_index" in compat.DETECTED

        @dataclasses.dataclass
        class Older:
            req_ids: list
            req_id_to_index: dict
        monkeypatch.setattr(compat, "ModelRunnerOutput", Older)
        assert compat.runner_output_kwargs(["a", "b"]) == {"req_id_to_index": {"a": 0, "b": 1}}

    def test_synchronous_scheduling_is_said_where_async_is_the_default(self, compat,
                                                                       monkeypatch):
        import dataclasses

        @dataclasses.dataclass
        class Later:
            async_scheduling: bool | None = None
        monkeypatch.setattr(compat, "SchedulerConfig", Later)
        assert compat.async_scheduling_kwargs(False) == {"async_scheduling": False}
        assert compat.DETECTED == ["async scheduling on by default: set off explicitly"]

    def test_the_built_config_keeps_synchronous_scheduling(self, compat):
        from harness.engines.vllm_adapter import build_vllm_config
        from harness.formats.stream import Config
        vc, _ = build_vllm_config(Config())
        assert vc.scheduler_config.async_scheduling is False

    def test_the_model_config_answers_multimodal_as_the_registry_stand_in(self, compat,
                                                                          monkeypatch):
        """0.31.0 on: the scheduler asks the model config, which asks vLLM's registry."""
        class LaterModelConfig:
            multimodal_config = None

            def _cached_supports_multimodal_inputs(self):
                return False  # no registered processor: "text-only"
        mc = LaterModelConfig()
        monkeypatch.setattr(compat, "BUDGET_ASKS_MODEL_CONFIG", True)
        with compat.multimodal_while_sizing(mc, images=True):
            assert mc._cached_supports_multimodal_inputs() is True
            assert mc.multimodal_config.mm_processor_cache_gb == 0  # no receiver cache
        assert mc._cached_supports_multimodal_inputs() is False
        assert mc.multimodal_config is None
        with compat.multimodal_while_sizing(mc, images=False):
            assert mc._cached_supports_multimodal_inputs() is False

    def test_the_processor_stand_in_has_the_models_context(self):
        from harness.engines.vllm_adapter import EncoderRegistry
        mc = types.SimpleNamespace(max_model_len=64)
        processor = EncoderRegistry(12).create_processor(mc)
        assert processor.info.ctx.model_config is mc
        assert processor.info.get_mm_max_tokens_per_item(64, {"image": 1}) == {"image": 12}

    def test_hash_lookahead_resolved_again_once_the_stand_in_is_set(self, compat):
        class Later:
            num_hash_lookahead_tokens = 0
            speculative_config = None

            def _resolve_num_hash_lookahead_tokens(self):
                return 0 if self.speculative_config is None else 1
        vc = Later()
        vc.speculative_config = "eagle"
        compat.after_speculative_config(vc)
        assert vc.num_hash_lookahead_tokens == 1
        older = types.SimpleNamespace(speculative_config="eagle")
        compat.after_speculative_config(older)  # a property there: nothing to resolve
        assert not hasattr(older, "num_hash_lookahead_tokens")

    def test_the_speculative_stand_in_answers_with_vllms_config_class(self, compat,
                                                                       monkeypatch):
        import sys

        class Base:
            uses_target_hidden_states = False

            def __init__(self, spec):
                self.spec_config = spec

            @classmethod
            def specialize(cls, spec):
                return cls

        class Eagle(Base):
            uses_target_hidden_states = True
        seen = []

        def get_method_config_class(spec):
            seen.append((spec.custom_method, spec.method))
            return Eagle if spec.method == "eagle" else Base
        module = types.ModuleType("speculator_config")
        module.get_method_config_class = get_method_config_class
        monkeypatch.setitem(sys.modules,
                            "vllm.v1.worker.gpu.spec_decode.speculator_config", module)
        from harness.engines.vllm_adapter import SpeculativeStandIn
        eagle, ngram = SpeculativeStandIn(2, "eagle"), SpeculativeStandIn(2, "ngram")
        assert isinstance(eagle.speculator_config, Eagle)
        assert eagle.speculator_config.spec_config is eagle
        assert eagle.uses_target_hidden_states and not ngram.uses_target_hidden_states
        assert seen[0] == (None, "eagle")
        assert eagle.use_eagle_block_drop() and eagle.needs_eagle_block_drop()
        assert not ngram.use_eagle_block_drop()
        assert not eagle.uses_dynamic_speculative_decoding()

    def test_the_block_hasher_gets_the_hash_lookahead_where_it_takes_one(self, compat,
                                                                          monkeypatch):
        """0.33.0 on: the engine core gives ``get_request_block_hasher`` the config's
        ``num_hash_lookahead_tokens``; older releases take two arguments."""
        calls = []

        def later(hash_block_size, caching_hash_fn, num_hash_lookahead_tokens=0):
            calls.append((hash_block_size, caching_hash_fn, num_hash_lookahead_tokens))
        monkeypatch.setattr(compat, "get_request_block_hasher", later)
        vc = types.SimpleNamespace(num_hash_lookahead_tokens=1)
        compat.request_block_hasher(16, hash, vc)
        assert calls == [(16, hash, 1)]
        assert "get_request_block_hasher(num_hash_lookahead_tokens=)" in compat.DETECTED

        def older(block_size, caching_hash_fn):
            calls.append((block_size, caching_hash_fn))
        monkeypatch.setattr(compat, "get_request_block_hasher", older)
        compat.DETECTED.clear()
        compat.request_block_hasher(16, hash, types.SimpleNamespace())
        assert calls[-1] == (16, hash) and compat.DETECTED == []

    def test_the_pool_is_sized_with_the_global_groups_where_vllm_plans_with_them(
            self, compat, monkeypatch):
        import sys
        calls = []
        planning = types.SimpleNamespace(
            get_global_kv_cache_groups=lambda vc, specs: ("groups of", vc),
            get_kv_cache_configs=lambda *args: calls.append(args) or ["config"])
        monkeypatch.setitem(sys.modules, "vllm.v1.core.kv_cache_planning", planning)
        assert compat.kv_cache_configs("vc", [{}], [1024]) == ["config"]
        assert calls == [("vc", [{}], [1024], ("groups of", "vc"))]
        assert "get_kv_cache_configs in kv_cache_planning, with the global groups" in compat.DETECTED

    def test_the_speculative_stand_in_drafts_in_parallel_as_vllm_says(self):
        """0.33.0's ``VllmConfig`` reads ``parallel_drafting``: vLLM sets it for dflash
        and dspark only."""
        from harness.engines.vllm_adapter import SpeculativeStandIn
        assert not SpeculativeStandIn(2, "eagle").parallel_drafting
        assert not SpeculativeStandIn(2, "ngram").parallel_drafting
        assert SpeculativeStandIn(2, "dflash").parallel_drafting

    def test_set_aside_requests_seen_in_the_deferred_set(self, compat):
        """0.31.0 on: ``schedule()`` marks each request it passes over in
        ``deferred_waiting``; only the marks made while the hook is on are recorded."""
        seen = []
        sched = types.SimpleNamespace(deferred_waiting={"old"})
        hooked = compat.set_aside_queue_hook(seen.append, sched)
        sched.deferred_waiting.add("before")
        with hooked():
            sched.deferred_waiting.add("c")
            sched.deferred_waiting.add("a")
        sched.deferred_waiting.add("after")
        assert seen == ["c", "a"]
        assert sched.deferred_waiting == {"old", "before", "c", "a", "after"}
        sched.deferred_waiting.discard("c")
        assert "c" not in sched.deferred_waiting

    def test_bitmask_rows_taken_from_fixed_blocks(self, compat):
        """0.34.0: each request owns 1 + num_spec_tokens rows and fills the first ones; a
        row after a draft the grammar rejects allows every token (all bits set)."""
        rows = [[0, 1], [0, 2], [-1, -1], [-1, -1], [1, 0], [5, 5], [5, 5], [5, 5]]
        out = compat.written_bitmask_rows(rows, ["a", "b"], {"a": [6, 9]}, 3)
        assert out == [[0, 1], [0, 2], ["a", -1], [1, 0]]
        packed = [[0, 1], [0, 2], [1, 0]]  # up to 0.33.0: exactly the written rows
        assert compat.written_bitmask_rows(packed, ["a", "b"], {"a": [6, 9]}, 3) == packed
        full = [[0, 0], [0, 1], [1, 0], [1, 1]]  # every draft: the layouts agree
        assert compat.written_bitmask_rows(full, ["a", "b"], {"a": [1], "b": [2]}, 1) == full

    def test_structured_output_backend_named_as_the_input_processor_names_it(self, compat):
        later = types.SimpleNamespace(structured_outputs=types.SimpleNamespace(_backend=None))
        compat.set_structured_output_backend(later)
        assert later.structured_outputs._backend == "xgrammar"
        chosen = types.SimpleNamespace(
            structured_outputs=types.SimpleNamespace(_backend="guidance"))
        compat.set_structured_output_backend(chosen)
        assert chosen.structured_outputs._backend == "guidance"
        compat.set_structured_output_backend(types.SimpleNamespace(structured_outputs=None))

    def test_the_scripted_executor_answers_sample_tokens_with_the_batch_it_ran(self):
        """0.34.0's EngineCore asks execute_model for a Future without a batch queue too,
        and with one takes sample_tokens' Future as the batch's."""
        from harness.engines.vllm_core import ScriptedExecutor
        executor = object.__new__(ScriptedExecutor)
        engine = types.SimpleNamespace(batch_queue=False, run_model=lambda so: ("out", so))
        executor.engine, executor.pending = engine, None
        assert executor.sample_tokens(None) is None  # nothing ran yet
        future = executor.execute_model("s0", non_block=True)
        assert future.done() and future.result() == ("out", "s0")
        assert executor.sample_tokens(None, non_block=True) is future
        assert executor.sample_tokens(None) == ("out", "s0")
        assert executor.execute_model("s1") == ("out", "s1")
        assert executor.compile_or_warm_up_model() == []

    def test_0_11_0_needs_no_shim(self, compat):
        from harness.engines.vllm_adapter import build_scheduler
        from harness.formats.stream import Config
        build_scheduler(Config())
        assert compat.DETECTED == []
        assert "block_size" not in inspect.signature(compat.Scheduler.__init__).parameters


def test_a_release_the_engine_fails_on_is_listed_as_not_drivable(tmp_path):
    report = tmp_path / "0.19.0.md"
    report.write_text("## Bundled streams\n\n### abort_running: could not run\n\n"
                      "TypeError: BlockTable.compute_slot_mapping() missing 1 required positional "
                      "argument: 'positions' (vllm_adapter.py:92)\n")
    assert upgrade_check._could_not_run(report).startswith("TypeError: BlockTable.compute_slot_mapping")
    report.write_text("## Bundled streams\n\n| a | same |\n")
    assert upgrade_check._could_not_run(report) == ""


@pytest.mark.needs_vllm
def test_a_crash_the_old_release_had_too_is_the_same_not_could_not_run(tmp_path):
    """vLLM crashing on a quirk's stream as 0.11.0 did is behaviour the check compares:
    the installed 0.11.0 against its own recorded traces gives "same"."""
    from harness.jobs import upgrade_campaign
    from harness.formats.paths import STREAMS_DIR
    for name in ("sliding_window_null_page_cached", "lora_slots_overfilled_after_a_skip"):
        (tmp_path / f"{name}.json").write_text((STREAMS_DIR / f"{name}.json").read_text())
    results = upgrade_campaign.check_bundled(upgrade_campaign.Checker("0.11.0"), {}, tmp_path)
    assert [(r.name, r.outcome, r.conforms) for r in results] == [
        ("lora_slots_overfilled_after_a_skip", upgrade_campaign.SAME, True),
        ("sliding_window_null_page_cached", upgrade_campaign.SAME, True)]


@pytest.mark.needs_vllm
def test_an_unexplained_difference_is_named_by_its_first_field_against_the_release_rules():
    """Not by its first difference from 0.11.0, which a known rule change may explain."""
    import copy

    from harness.loop.runner import run
    from harness.formats.stream import parse_stream
    from harness.jobs.upgrade_campaign import Checker

    stream = parse_stream({"config": {"block_size": 4, "num_gpu_blocks": 16,
                                      "max_num_batched_tokens": 16, "max_num_seqs": 4,
                                      "max_model_len": 32},
                           "requests": [{"id": "a", "prompt": [1, 2, 3, 4, 5], "output": [6, 7]}]})
    checker = Checker("0.11.0")
    target = run(checker.target, stream).to_json()
    new, old = copy.deepcopy(target), copy.deepcopy(target)
    new["steps"][1]["free_blocks"] += 1  # what no rule explains
    old["steps"][0]["slots"] = {}  # 0.11.0 differs earlier, elsewhere
    assert checker.cause_of(stream, new, old, target) == ("unexplained", "free_blocks")


def test_the_report_names_the_old_release_in_its_stream_table_after_an_example():
    """The table's header says which release the streams were compared with, even after
    a cause's example has been shown side by side (it once printed that example's trace)."""
    from harness.loop.runner import run
    from harness.formats.stream import parse_stream
    from harness.engines.reference_engine import ReferenceEngine
    from harness.jobs.upgrade_campaign import BundledResult, CampaignResult, Cause, report_text

    data = {"config": {"block_size": 4, "num_gpu_blocks": 16, "max_num_batched_tokens": 16,
                       "max_num_seqs": 4, "max_model_len": 32},
            "requests": [{"id": "a", "prompt": [1, 2, 3, 4, 5], "output": [6, 7]}]}
    old = run(ReferenceEngine("0.11.0"), parse_stream(data)).to_json()
    new = json.loads(json.dumps(old))
    new["steps"][1]["free_blocks"] += 1
    checker = types.SimpleNamespace(old="0.11.0", forget=None,
                                    target=types.SimpleNamespace(release="0.25.1"),
                                    traces=lambda stream: (new, old, new))
    cause = Cause(("unexplained", "free_blocks"), count=1, alone=1, example=data,
                  example_size=(1, 3), example_alone=True)
    text = report_text("0.34.0", checker, [BundledResult("s", "different", cause.key)],
                       CampaignResult(0, 1), {cause.key: cause})
    assert "First difference: step 1, field `free_blocks`." in text
    assert "| stream | vs 0.11.0 | cause | reference (0.25.1 rules) |" in text.splitlines()


@pytest.mark.slow
@pytest.mark.needs_vllm
def test_the_campaign_is_the_same_on_one_process_and_on_forked_workers():
    """Chunked as harness.jobs.chunks cuts a fuzz campaign: the same streams, counters and
    examples whatever number of processes checks them."""
    from harness.jobs.upgrade_campaign import Checker, campaign

    # The installed 0.11.0 as an "upgrade" from 0.11.1: differences with named causes.
    checker = Checker("0.12.0", old="0.11.1")
    runs = []
    for workers in (1, 2):
        causes: dict = {}
        result = campaign(checker, causes, examples=60, seed=3, workers=workers)
        runs.append((result.same, result.different, result.conform, result.stats.counts,
                     result.nonconforming,
                     {k: (c.count, c.alone, c.example) for k, c in sorted(causes.items())}))
    assert runs[0] == runs[1]
    assert runs[0][0] + runs[0][1] == 60 and runs[0][3]["streams"] == 60
    assert runs[0][1] and runs[0][5]  # some streams differ, and their causes are named


def test_the_campaign_draws_without_the_constants_of_loaded_modules(monkeypatch):
    """In a side environment vLLM is not under site-packages, so hypothesis would take it
    for the user's code and draw its literals: other streams per seed than the base's
    campaign, and ~12 s of parsing per process.  The campaign pins that pool empty."""
    from hypothesis.internal.conjecture import providers

    from harness.jobs.chunks import Chunk
    from harness.engines.reference_engine import ReferenceEngine
    from harness.loop.runner import run
    from harness.jobs.upgrade_campaign import check_chunk

    scanned = []
    monkeypatch.setattr(providers, "_harness_pinned", False)
    monkeypatch.setattr(providers, "_get_local_constants",
                        lambda: scanned.append(1) or providers.Constants())
    trace = lambda stream: run(ReferenceEngine(), stream).to_json()  # noqa: E731
    checker = types.SimpleNamespace(traces=lambda s: (trace(s),) * 3, cause_of=lambda *a: None)
    assert len(check_chunk(checker, Chunk(0, 1, 3))) == 3
    assert scanned == [] and providers._harness_pinned


def test_a_stream_no_change_explains_alone_is_named_by_the_fewest_changes_that_do(monkeypatch):
    """Four changes between the releases; the new trace needs `a` and `c` together and
    does not care about `b` and `d`: the cause is (`a`, `c`), found with a run per change
    that a run asks about."""
    from types import SimpleNamespace

    from harness.jobs import upgrade_campaign

    class Engine(SimpleNamespace):
        pass

    runs = []

    def fake_run(engine, stream, like=None):
        # The run asks about `a`, and about `c` only when `a` is on.
        runs.append(engine.rules)
        shows = "a" in engine.rules and "c" in engine.rules
        return SimpleNamespace(verdict="completed", to_json=lambda: {"steps": [], "shows": shows})

    monkeypatch.setattr(upgrade_campaign, "held_to", lambda trace, stream: trace)

    monkeypatch.setattr(upgrade_campaign, "run", fake_run)
    monkeypatch.setattr(upgrade_campaign, "first_divergence", lambda x, y: None if x == y else "differs")
    checker = object.__new__(upgrade_campaign.Checker)
    checker.candidates = ["a", "b", "c", "d", "e"]
    checker.base = Engine(rules=frozenset({"e"}))
    checker.target = Engine(rules=frozenset({"a", "b", "c", "d", "e"}))
    checker._with = {}
    checker.base_with = lambda changes: Engine(rules=checker.base.rules ^ frozenset(changes))
    checker._single = {n: checker.base_with({n}) for n in checker.candidates}
    checker._target_asked = None
    new = {"steps": [], "shows": True}
    old = {"steps": [], "shows": False}
    assert checker.cause_of(None, new, old, new) == ("a", "c")
    # 0.11.0's run asks about `a` alone: `a` tried alone (b, c, d cannot alter that run);
    # the release's run asks about `a` and `c`: each left out once; `b`, `d` go unrun.
    assert len(runs) == 1 + 1 + 1 + 2


def test_the_examples_shrunk_in_forked_workers_come_back_to_their_causes(monkeypatch):
    """Shrinking two causes at a time gives each cause the example its own shrink made."""
    from harness.jobs import upgrade_campaign

    def fake_shrink(checker, cause, seconds):
        cause.example = {"shrunk": cause.key[0], "by": checker}
        cause.shrunk, cause.example_size = True, (1, len(cause.key[0]))

    monkeypatch.setattr(upgrade_campaign, "shrink", fake_shrink)
    results = []
    for workers in (1, 2):
        causes = {(n,): upgrade_campaign.Cause((n,), example={"big": n}) for n in ("ab", "c", "def")}
        causes[("none",)] = upgrade_campaign.Cause(("none",))  # no example: nothing to shrink
        upgrade_campaign.shrink_all("checker", causes, 1.0, workers)
        results.append({k: (c.example, c.shrunk, c.example_size) for k, c in causes.items()})
    assert results[0] == results[1]
    assert results[1][("def",)] == ({"shrunk": "def", "by": "checker"}, True, (1, 3))
    assert results[1][("none",)] == (None, False, (1 << 30, 0))


@pytest.mark.parametrize("name", ["async_load_reserves_a_draft_step",
                                  "whole_item_cut_before_lookups",
                                  "lone_threshold_counts_a_load_set_aside",
                                  "grammar_prefill_chunk_has_no_row",
                                  "priority_preempt_already_scheduled_quirk",
                                  "kv_events_with_lora",
                                  "hybrid_window_hit_pages_left_free"])
def test_a_rule_change_a_run_never_asks_about_leaves_the_run_as_it_was(name):
    """What lets the upgrade check settle a change without running it: turning over any
    change the run did not ask about gives the same trace, and the run asks about the
    changes its stream was written for."""
    from harness.engines.reference_engine import ReferenceEngine
    from harness.formats.paths import STREAMS_DIR
    from harness.loop.runner import run
    from harness.formats.stream import load_stream
    from harness.jobs.upgrade_campaign import Checker
    from reference import releases

    stream = load_stream(STREAMS_DIR / f"{name}.json")
    for release in ("0.11.0", "0.34.0"):
        engine = ReferenceEngine(release)
        trace, asked = Checker.asking(engine, stream)
        trace = trace.to_json()
        assert asked and trace == run(ReferenceEngine(release), stream).to_json()
        unasked = sorted(set(c.name for c in releases.CHANGES) - asked)
        assert unasked
        for change in unasked:
            flipped = ReferenceEngine(release, engine.rules ^ {change})
            assert run(flipped, stream).to_json() == trace, change
    own = {c.name for c in releases.CHANGES} & {name}
    assert own <= Checker.asking(ReferenceEngine("0.34.0"), stream)[1]


def test_a_release_row_says_how_long_its_check_took():
    import datetime
    import os
    import time

    took = upgrade_check._took(time.monotonic() - 75.2)
    assert took == (f"1 min 15 s on {os.cpu_count()} cores, "
                    f"{datetime.date.today().isoformat()}")


def test_a_victim_that_keeps_its_grant_keeps_its_grammar_row_in_grant_order():
    """0.11.0's rules with grammar_rows_in_grant_order alone (a mix the upgrade check
    tries): a priority victim that keeps its grant (0.11.0's quirk) has left the batch
    but not the grants, so it keeps its row; the reference must not skip the grammar
    part for want of a constrained request in the batch."""
    from harness.engines.reference_engine import ReferenceEngine
    from harness.formats.paths import STREAMS_DIR
    from harness.loop.runner import run
    from harness.formats.stream import parse_stream

    data = json.loads((STREAMS_DIR / "priority_preempt_already_scheduled_quirk.json").read_text())
    data["requests"][0]["structured_output"] = {"ready_step": 0, "rejected_tokens": [9]}
    engine = ReferenceEngine("0.11.0", frozenset({"grammar_rows_in_grant_order"}))
    step = run(engine, parse_stream(data)).to_json()["steps"][2]
    assert step["scheduled"] == [["B", 1], ["A", 1]]
    assert step["grammar_index"] == {"B": 0} and step["bitmask_rows"] == [["B", 2]]
