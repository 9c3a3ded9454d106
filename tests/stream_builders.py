"""Small valid stream dicts for the stream tests, and the bad-input assertion."""

from __future__ import annotations

import copy

import pytest

from harness.formats.stream import StreamError, parse_stream

# A small valid config: 4-token blocks, 16 blocks, 32-token model length.
SMALL = {"block_size": 4, "num_gpu_blocks": 16, "max_num_batched_tokens": 16,
         "max_num_seqs": 4, "max_model_len": 32}


def req(id: str = "a", **kw) -> dict:
    """A valid request dict; keyword arguments override or add fields."""
    r = {"id": id, "prompt": [1, 2, 3], "output": [4, 5]}
    r.update(kw)
    return r


def stream(config: dict | None = None, requests: list | None = None, **top) -> dict:
    """A valid stream dict built on SMALL; ``config`` entries override SMALL's."""
    data = {"config": {**SMALL, **(config or {})}, "requests": requests or [req()]}
    data.update(top)
    return data


def rejects(data, match: str) -> str:
    """Assert parse_stream rejects ``data`` with a one-line message matching ``match``."""
    with pytest.raises(StreamError, match=match) as info:
        parse_stream(copy.deepcopy(data))
    message = str(info.value)
    assert "\n" not in message and "\r" not in message
    return message


MINIMAL = {"requests": [{"id": "a", "prompt": [1, 2], "output": [3, 4, 5]}]}
