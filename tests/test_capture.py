"""Captures (traces in which a model chose the tokens) turned into scripted streams and
replayed: the CPU half of ``make gpu-check``, on captures of the ``vllm-core`` engine."""

from __future__ import annotations

import copy
import json

import pytest

from harness.jobs.capture import check_capture, read_capture, stream_from_capture, tokens_kept
from harness.loop.runner import run
from harness.formats.stream import StreamError, parse_stream
from tests.stream_builders import req, stream as stream_dict

pytestmark = [pytest.mark.needs_vllm]


@pytest.fixture(scope="module")
def core(vllm_engine):
    from harness.engines import get_engine
    return get_engine("vllm-core")


def _sampled_elsewhere(data: dict, core) -> dict:
    """A capture whose model said other tokens than the stream's script: the stream is
    run with shifted scripts, and the capture keeps the original stream, as a GPU run
    keeps the script it never read."""
    shifted = copy.deepcopy(data)
    for r in shifted["requests"]:
        r["output"] = [t + 1 for t in r["output"]]
    capture = run(core, parse_stream(shifted)).to_json()
    capture["stream"] = parse_stream(data).to_json()
    return capture


def test_the_captured_tokens_become_the_script(core):
    data = stream_dict(requests=[req(id="a", prompt=[1, 2, 3, 4], output=[5, 6, 7]),
                                 req(id="b", prompt=[1, 2, 9], output=[8, 8])])
    capture = _sampled_elsewhere(data, core)
    assert tokens_kept(capture) == {"a": [6, 7, 8], "b": [9, 9]}
    stream = stream_from_capture(capture)
    assert [r.output for r in stream.requests] == [(6, 7, 8), (9, 9)]
    for name, d, why in check_capture(capture, ("reference", "vllm")):
        assert (d, why) == (None, ""), name


def test_async_tokens_past_the_stop_are_not_the_requests(core):
    """Under async scheduling the batch scheduled after a request's last token samples
    once more; that token is not kept."""
    data = stream_dict({"async_scheduling": True},
                       requests=[req(id="a", prompt=[1, 2, 3], output=[4, 5], max_tokens=2)])
    capture = run(core, parse_stream(data)).to_json()
    emitted = [t for s in capture["steps"] for t in s["emitted"].get("a", [])]
    assert tokens_kept(capture) == {"a": [4, 5]} and emitted[:2] == [4, 5]
    assert all(d is None for _, d, _ in check_capture(capture, ("reference",)))


def test_a_capture_the_engines_do_not_give_is_reported(core):
    """The check can fail: a capture whose pages differ from what the scheduler hands out."""
    data = stream_dict(requests=[req(id="a", prompt=[1, 2, 3, 4, 5], output=[6, 7])])
    capture = run(core, parse_stream(data)).to_json()
    capture["steps"][0]["new_block_ids"]["a"] = [[7]]
    ((name, d, why),) = check_capture(capture, ("reference",))
    assert d is not None and d.step == 0 and d.field == "new_block_ids"


def test_a_file_that_is_not_a_capture_is_refused_in_one_line(tmp_path):
    path = tmp_path / "x.json"
    path.write_text(json.dumps({"steps": []}))
    with pytest.raises(StreamError, match=r"x\.json: not a trace \(needs engine, stream and steps"):
        read_capture(path)
