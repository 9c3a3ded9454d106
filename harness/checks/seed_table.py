"""The per-step table, in the form of the project's seed example.

One row per scheduled request per step: the tokens it computes (drafts marked
``d``), the KV bytes written before the step, the tokens computed now, the KV
bytes after, the pages it holds and their ids (long lists shortened), the
prefix-cache hit of a request admitted in this step, its drafts (scheduled /
accepted) and the preemptions of the step.

The KB figures of a vLLM run come from vLLM (its KV cache spec's page size for
the model as its ModelConfig reads it); those of a reference run from the
reference's ``ModelShape``.
"""

from __future__ import annotations

from typing import Any

from harness.engines import get_engine, vllm_kv_sizes
from harness.formats.paths import MODELS_DIR
from harness.loop.runner import run
from harness.formats.stream import Stream
from harness.formats.trace import COMPLETED
from reference.kv_sizing import ModelShape


def _kb(n_bytes: int) -> str:
    return f"{n_bytes / 1024:g} KB"


def _tokens(ids: list[int], drafts: list[int]) -> str:
    real = " ".join(f"t{t}" for t in ids) if len(ids) <= 6 else \
        f"t{ids[0]} t{ids[1]} .. t{ids[-1]} ({len(ids)})"
    return " ".join([real] + [f"d{t}" for t in drafts]).strip()


def _pages(ids: list[int]) -> str:
    if len(ids) <= 8:
        return str(ids)
    return f"[{ids[0]}, {ids[1]}, {ids[2]}, {ids[3]}, .., {ids[-2]}, {ids[-1]}]"


def _group(g: dict[str, Any]) -> str:
    param = g.get("sliding_window") or g.get("attention_chunk_size")
    return g["type"] + (f"({param})" if param else "")


def _drafts(step: dict[str, Any], rid: str) -> str:
    """Scheduled drafts / accepted ones; the model's answer holds the accepted plus one."""
    drafts = step["spec_tokens"].get(rid)
    if not drafts:
        return ""
    emitted = step["emitted"].get(rid)
    accepted = max(len(emitted) - 1, 0) if emitted else 0
    return f"{len(drafts)}/{accepted}"


def kv_sizes(trace: dict[str, Any]) -> tuple[int, int]:
    """(bytes per token, bytes per page), over all layers, for the engine that made ``trace``.

    A vLLM run's come from vLLM's own objects (its ModelConfig's reading of the model and its
    FullAttentionSpec's page size, through :func:`harness.engines.vllm_kv_sizes`); the
    reference's from ``reference.kv_sizing``.
    """
    config = trace["stream"]["config"]
    model_dir = MODELS_DIR / config["model"]
    if trace["engine"] == "vllm":
        return vllm_kv_sizes(model_dir, config["block_size"], config["max_model_len"])
    shape = ModelShape.load(model_dir)
    return shape.bytes_per_token, shape.page_size_bytes_all_layers(config["block_size"])


def render(trace: dict[str, Any]) -> str:
    stream = trace["stream"]
    config = stream["config"]
    per_token, page = kv_sizes(trace)
    prompts = {r["id"]: list(r["prompt"]) for r in stream["requests"]}
    outputs: dict[str, list[int]] = {rid: [] for rid in prompts}
    groups = config.get("kv_cache_groups") or [{"type": "full"}]
    tables: dict[str, list[list[int]]] = {rid: [[] for _ in groups] for rid in prompts}

    header = (f"{trace['engine']} (vLLM {trace['vllm_version']}), model {config['model']}: "
              f"{_kb(per_token)} per token, {_kb(page)} per {config['block_size']}-token page")
    if len(groups) > 1 or groups[0]["type"] != "full":
        header += ("\nKV cache groups: " + ", ".join(_group(g) for g in groups)
                   + " (KB figures count every layer as full attention; pages and page ids "
                     "are per group)")
    rows = [("step", "req", "tokens", "KV before", "computed", "KV after", "pages", "page ids",
             "hit", "drafts", "preempted")]
    for step in trace["steps"]:
        for rid in step["preempted"]:
            tables[rid] = [[] for _ in groups]  # freed; a resumed request gets its tables again
        for rid, new in step["new_block_ids"].items():
            if rid in step["prefix_hit_tokens"]:  # admitted: its whole tables
                tables[rid] = [[] for _ in groups]
            for table, ids in zip(tables[rid], new):
                table += ids
        first = True
        for rid, n in step["scheduled"]:
            before = step["computed_before"][rid]
            seq = prompts[rid] + outputs[rid]
            drafts = step["spec_tokens"].get(rid, [])
            real = seq[before:before + n - len(drafts)]
            hit = step["prefix_hit_tokens"].get(rid)
            rows.append((
                str(step["step"]) if first else "", rid, _tokens(real, drafts),
                _kb(before * per_token), str(n), _kb((before + n) * per_token),
                "+".join(str(len(t)) for t in tables[rid]),
                " ".join(_pages(t) for t in tables[rid]),
                "" if hit is None else str(hit), _drafts(step, rid),
                ",".join(step["preempted"]) if first else ""))
            first = False
        if not step["scheduled"]:
            rows.append((str(step["step"]), "-", "(nothing scheduled)", "", "0", "", "", "", "", "",
                         ",".join(step["preempted"])))
        for rid, toks in step["emitted"].items():
            outputs[rid] += toks
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = [header] + ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    lines.append(f"verdict: {trace['verdict']}" + (f" ({trace['failure']['message']})"
                                                    if trace.get("failure") else ""))
    return "\n".join(lines)



def show(stream: Stream, engine_name: str) -> tuple[str, bool]:
    """The table of one engine's run of ``stream``, and whether the run completed."""
    trace = run(get_engine(engine_name), stream)
    return render(trace.to_json()), trace.verdict == COMPLETED
