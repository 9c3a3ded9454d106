"""KV sizing of every bundled model: the reference against vLLM's own computation.

For each folder of ``fixtures/models``: the model shape (layers, KV heads, head
size, dtype) as each side reads ``config.json``; bytes per token; the page size
of one layer and of all layers for every block size the bundled streams use
(and 16); one request's need for a few ``max_model_len`` values; and the blocks
vLLM's start-up makes of a few memory budgets.  vLLM's side comes from its own
objects (``ModelConfig``, ``FullAttentionSpec``, ``get_kv_cache_configs``)
through :mod:`harness.engines`; the reference's from ``reference.kv_sizing``.

``make conformance`` prints :func:`report`; ``tests/test_kv_sizing_conformance.py``
asserts :func:`differences` is empty for each model.  A reference mutant of the
KV sizing is killed when :func:`differences` is not empty under its patch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.engines import EngineUnavailable, vllm_kv_sizes, vllm_sizing
from harness.paths import MODELS_DIR, STREAMS_DIR
from harness.stream import load_stream
from reference.kv_sizing import ModelShape, kv_cache_layout, min_bytes_for_max_model_len

DEFAULT_BLOCK_SIZE = 16
MAX_MODEL_LENS = (1, 100, 2048)  # within every bundled model's max_position_embeddings
BUDGET_MAX_MODEL_LEN = 2048
BUDGETS = (1 << 30, 3 * (1 << 30) + 12345)  # bytes: 1 GiB, and 3 GiB plus a ragged tail


@dataclass(frozen=True)
class Check:
    """One number (or name) of one model, as each side computes it."""

    model: str
    field: str
    reference: Any
    vllm: Any

    @property
    def equal(self) -> bool:
        return self.reference == self.vllm

    def line(self) -> str:
        return f"{self.model}: {self.field}: reference {self.reference}, vLLM {self.vllm}"


def model_dirs() -> list[Path]:
    """Every bundled model config folder."""
    return sorted(p for p in MODELS_DIR.iterdir() if (p / "config.json").is_file())


def block_sizes_of(block_sizes: Iterable[int] | None = None) -> list[int]:
    """``block_sizes`` (default: those of the bundled streams), and 16."""
    if block_sizes is None:
        block_sizes = {load_stream(p).config.block_size for p in STREAMS_DIR.glob("*.json")}
    return sorted(set(block_sizes) | {DEFAULT_BLOCK_SIZE})


# -- each side's numbers, under the same names -------------------------------------------

def _fields(shape: tuple, per_token: int, page: Callable[[int], tuple[int, int]],
            need: Callable[[int, int], int], blocks: Callable[[int], int],
            block_sizes: Iterable[int]) -> dict[str, Any]:
    layers, heads, head_size, dtype = shape
    values: dict[str, Any] = {"layers": layers, "KV heads": heads, "head size": head_size,
                              "dtype": dtype, "bytes per token": per_token}
    for bs in block_sizes:
        one, every = page(bs)
        values[f"page bytes, one layer, block {bs}"] = one
        values[f"page bytes, all layers, block {bs}"] = every
        for mml in MAX_MODEL_LENS:
            values[f"one request's need, block {bs}, max_model_len {mml}"] = need(bs, mml)
    for budget in BUDGETS:
        values[f"num blocks, block {DEFAULT_BLOCK_SIZE}, max_model_len {BUDGET_MAX_MODEL_LEN}, "
               f"budget {_gib(budget)}"] = blocks(budget)
    return values


def reference_values(model_dir: Path, block_sizes: Iterable[int]) -> dict[str, Any]:
    s = ModelShape.load(model_dir)
    return _fields(
        (s.num_layers, s.num_kv_heads, s.head_size, s.dtype), s.bytes_per_token,
        lambda bs: (s.page_size_bytes(bs), s.page_size_bytes_all_layers(bs)),
        lambda bs, mml: min_bytes_for_max_model_len(s, bs, mml),
        lambda budget: kv_cache_layout(s, DEFAULT_BLOCK_SIZE, budget,
                                       BUDGET_MAX_MODEL_LEN).num_blocks,
        block_sizes)


def vllm_values(model_dir: Path, block_sizes: Iterable[int]) -> dict[str, Any]:
    vl = vllm_sizing(model_dir)
    shape = layers, heads, head, dtype = vl.model_shape("auto", BUDGET_MAX_MODEL_LEN)
    per_token, _ = vllm_kv_sizes(model_dir, DEFAULT_BLOCK_SIZE, BUDGET_MAX_MODEL_LEN)
    return _fields(
        shape, per_token,
        lambda bs: (vl.page_size_bytes(bs, heads, head, dtype, "auto"),
                    vllm_kv_sizes(model_dir, bs, BUDGET_MAX_MODEL_LEN)[1]),
        lambda bs, mml: vl.request_need(layers, bs, heads, head, dtype, "auto", mml)[1],
        lambda budget: vl.kv_cache_config(dtype, "auto", DEFAULT_BLOCK_SIZE, layers, heads, head,
                                          BUDGET_MAX_MODEL_LEN, budget)["num_blocks"],
        block_sizes)


def side_values(side: Callable, model_dir: Path, block_sizes: list[int]) -> dict[str, Any] | str:
    """One side's numbers, or the one-line error that kept it from giving them."""
    try:
        return side(model_dir, block_sizes)
    except EngineUnavailable:
        raise
    except Exception as exc:  # noqa: BLE001 -- a broken rule may fail instead of answering
        return f"error: {type(exc).__name__}: {' '.join(str(exc).split())}"


# -- the comparison ------------------------------------------------------------------------

def checks(models: Iterable[Path] | None = None,
           block_sizes: Iterable[int] | None = None) -> list[Check]:
    """Every KV sizing check of ``models`` (default: every bundled model)."""
    sizes = block_sizes_of(block_sizes)
    out = []
    for model_dir in (model_dirs() if models is None else models):
        ref = side_values(reference_values, model_dir, sizes)
        vllm = side_values(vllm_values, model_dir, sizes)
        if isinstance(ref, str) or isinstance(vllm, str):
            out.append(Check(model_dir.name, "sizing",
                             ref if isinstance(ref, str) else "answered",
                             vllm if isinstance(vllm, str) else "answered"))
            continue
        out += [Check(model_dir.name, field, ref[field], vllm.get(field)) for field in ref]
    return out


def differences(models: Iterable[Path] | None = None,
                block_sizes: Iterable[int] | None = None) -> list[Check]:
    """The checks on which the reference and vLLM differ (empty: the KV sizing conforms)."""
    return [c for c in checks(models, block_sizes) if not c.equal]


def report(block_sizes: Iterable[int] | None = None) -> tuple[str, int, int]:
    """The text of the main job's KV sizing part, the number of equal checks, and of all."""
    sizes = block_sizes_of(block_sizes)
    models = model_dirs()
    results = checks(models, sizes)
    equal = sum(c.equal for c in results)
    scope = (f"{len(models)} models ({', '.join(m.name for m in models)}); block sizes "
             f"{', '.join(map(str, sizes))}; max_model_len {', '.join(map(str, MAX_MODEL_LENS))}; "
             f"budgets {', '.join(map(_gib, BUDGETS))}")
    lines = [scope, f"{equal}/{len(results)} KV sizing checks equal"]
    lines += [f"  differs: {c.line()}" for c in results if not c.equal]
    return "\n".join(lines), equal, len(results)


def _gib(n_bytes: int) -> str:
    whole, rest = divmod(n_bytes, 1 << 30)
    return f"{whole} GiB" + (f" + {rest:,} B" if rest else "")
