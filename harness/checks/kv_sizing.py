"""KV sizing of every bundled model: the reference against vLLM's own computation.

For each folder of ``fixtures/models``: the model shape (layers, KV heads, head
size, dtype) as each side reads ``config.json``; bytes per token; the page size
of one layer and of all layers for every block size the bundled streams use
(and 16); one request's need for a few ``max_model_len`` values; and the blocks
vLLM's start-up makes of a few memory budgets.  vLLM's side comes from its own
objects (``ModelConfig``, ``FullAttentionSpec``, ``get_kv_cache_configs``)
through :mod:`harness.engines`; the reference's from ``reference.kv_sizing``.

Hybrid models (a layer that is not plain full attention: Gemma 3, Llama 4,
Granite 4.0-H) are checked instead on their start-up sizing as on a CUDA GPU
(``reference.kv_sizing_hybrid`` against ``VllmKVSizing.hybrid_sizing``): for
each setting of the hybrid KV cache manager (:data:`SETTINGS`), block size,
``max_model_len`` and ``max_num_batched_tokens``: whether the manager stays on,
the attention block size after the Mamba adjustment, the padded Mamba page,
the layers' specs, one request's need, and per budget the estimated longest
length, the start-up error or the groups (kind, block size, window, chunk,
speculative pages, layer names, in vLLM's order), their page sizes, the
blocks, the tensors (size, shared by) and the maximum concurrency.

``make conformance`` prints :func:`report`; ``tests/test_kv_sizing_conformance.py``
asserts :func:`differences` is empty for each model.  A reference mutant of the
KV sizing is killed when :func:`differences` is not empty under its patch.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.engines import EngineUnavailable, vllm_kv_sizes, vllm_sizing
from harness.formats.paths import MODELS_DIR, STREAMS_DIR
from reference.kv_sizing import (ModelShape, NotEnoughKVCacheMemory, kv_cache_layout,
                                 min_bytes_for_max_model_len)
from reference import kv_sizing_hybrid as rkvh  # by module: a mutant's patch is seen

DEFAULT_BLOCK_SIZE = 16
MAX_MODEL_LENS = (1, 100, 2048)  # within every bundled model's max_position_embeddings
BUDGET_MAX_MODEL_LEN = 2048
BUDGETS = (1 << 30, 3 * (1 << 30) + 12345)  # bytes: 1 GiB, and 3 GiB plus a ragged tail

# Hybrid models: (name, --disable-hybrid-kv-cache-manager,
# VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE=1), every one 0.11.0 accepts on a GPU.
SETTINGS = (("default", False, False), ("hybrid manager disabled", True, False),
            ("chunked local allowed", False, True))
HYBRID_EXTRA_BLOCK_SIZES = (64, 512)  # 512: above Granite 4.0-H's raised attention block (400)
HYBRID_MAX_MODEL_LENS = (100, 2048, 16384)
HYBRID_BATCHED_TOKENS = (2048, 8192)
HYBRID_BUDGETS = (64 << 20, 1 << 30, 3 * (1 << 30) + 12345)  # 64 MiB: too small at 16384


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
    """``block_sizes`` (default: those of the bundled streams), and 16.

    The bundled streams' block sizes are read from their JSON, not through stream
    validation: validation sizes a pool from memory with the reference's KV sizing,
    which a KV sizing mutant (``make mutants``) has just broken."""
    if block_sizes is None:
        block_sizes = {json.loads(p.read_text())["config"].get("block_size", DEFAULT_BLOCK_SIZE)
                       for p in STREAMS_DIR.glob("*.json")}
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


def _hybrid_scenarios(block_sizes: Iterable[int]):
    sizes = sorted(set(block_sizes) | set(HYBRID_EXTRA_BLOCK_SIZES))
    for name, disable, allow in SETTINGS:
        for bs in sizes:
            for mml in HYBRID_MAX_MODEL_LENS:
                for batched in HYBRID_BATCHED_TOKENS:
                    yield (f"{name}, block {bs}, max_model_len {mml}, batched {batched}",
                           disable, allow, bs, mml, batched)


def _hybrid_fields(shape: tuple, scenario: Callable[..., dict], block_sizes: Iterable[int]
                   ) -> dict[str, Any]:
    """The hybrid checks, flattened: ``scenario(disable, allow, bs, mml, batched)`` answers
    the per-scenario values with a "budgets" dict of per-budget values."""
    layers, heads, head_size, dtype = shape
    values: dict[str, Any] = {"layers": layers, "KV heads": heads, "head size": head_size,
                              "dtype": dtype}
    for label, *args in _hybrid_scenarios(block_sizes):
        one = scenario(*args)
        for field, value in one.items():
            if field != "budgets":
                values[f"{label}: {field}"] = value
        for budget, row in one["budgets"].items():
            for field, value in row.items():
                values[f"{label}, budget {_gib(budget)}: {field}"] = value
    return values


def reference_hybrid_scenario(model: rkvh.HybridModel, disable: bool, allow: bool, bs: int,
                              mml: int, batched: int) -> dict[str, Any]:
    """The reference's answers for one scenario, shaped as ``VllmKVSizing.hybrid_sizing``'s."""
    specs = model.layer_specs(bs, mml)
    on = rkvh.hybrid_manager_on(model.cfg, disable, allow)
    mamba = [s for s in specs.values() if s.kind == "mamba"]
    counts: dict = {}
    for s in specs.values():
        key = (s.kind, s.block_size, s.sliding_window, s.attention_chunk_size, s.page_size_bytes)
        counts[key] = counts.get(key, 0) + 1
    out: dict[str, Any] = {
        "hybrid manager": on,
        "attention block size": model.attention_block_size(bs),
        "mamba page padded to": mamba[0].padded_page if mamba else None,
        "prefix caching turned off": bool(mamba),
        "layer specs": sorted(counts.items(), key=repr),
        "need": rkvh.request_need(specs, mml, batched),
        "budgets": {},
    }
    for budget in HYBRID_BUDGETS:
        row: dict[str, Any] = {
            "estimate": rkvh.estimate_max_model_len(specs, mml, batched, budget)}
        try:
            lay = rkvh.hybrid_layout(specs, budget, mml, batched, hybrid_manager=on)
        except NotEnoughKVCacheMemory:
            row["error"] = "not enough memory"
        except rkvh.CannotUnifyKVCacheSpecs:
            row["error"] = "cannot unify"
        else:
            row.update({
                "num blocks": lay.num_blocks,
                "group page sizes": [g.page_size_bytes for g in lay.groups],
                "groups": [(g.spec.kind, g.spec.block_size, g.spec.sliding_window,
                            g.spec.attention_chunk_size, g.spec.num_speculative_blocks,
                            g.layer_names) for g in lay.groups],
                "tensors": [(t.size, t.shared_by) for t in lay.tensors],
                "max concurrency": lay.max_concurrency if lay.num_blocks else None,
            })
        out["budgets"][budget] = row
    return out


def reference_values(model_dir: Path, block_sizes: Iterable[int]) -> dict[str, Any]:
    cfg = rkvh.HybridModel.load(model_dir)
    if rkvh.is_hybrid_config(cfg.cfg):
        s = cfg.shape
        return _hybrid_fields(
            (s.num_layers, s.num_kv_heads, s.head_size, s.dtype),
            lambda *args: reference_hybrid_scenario(cfg, *args), block_sizes)
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
    if vl.is_hybrid():
        return _hybrid_fields(
            shape, lambda disable, allow, bs, mml, batched: vl.hybrid_sizing(
                bs, mml, batched, list(HYBRID_BUDGETS), disable, allow), block_sizes)
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
    lines = [scope]
    hybrid = [m.name for m in models if rkvh.is_hybrid_config(rkvh.HybridModel.load(m).cfg)]
    if hybrid:
        lines.append(
            f"hybrid models ({', '.join(hybrid)}), sized as on a CUDA GPU: "
            f"{', '.join(name for name, _, _ in SETTINGS)}; block sizes "
            f"{', '.join(map(str, sorted(set(sizes) | set(HYBRID_EXTRA_BLOCK_SIZES))))}; "
            f"max_model_len {', '.join(map(str, HYBRID_MAX_MODEL_LENS))}; max_num_batched_tokens "
            f"{', '.join(map(str, HYBRID_BATCHED_TOKENS))}; budgets "
            f"{', '.join(map(_gib, HYBRID_BUDGETS))}")
    lines.append(f"{equal}/{len(results)} KV sizing checks equal")
    lines += [f"  differs: {c.line()}" for c in results if not c.equal]
    return "\n".join(lines), equal, len(results)


def _gib(n_bytes: int) -> str:
    whole, rest = divmod(n_bytes, 1 << 30)
    if not whole and rest % (1 << 20) == 0:
        return f"{rest >> 20} MiB"
    return f"{whole} GiB" + (f" + {rest:,} B" if rest else "")
