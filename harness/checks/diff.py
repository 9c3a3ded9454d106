"""Comparing two traces step by step, and the report a reader gets.

The comparison is exact: every field of every step record (see
``harness.formats.trace.STEP_FIELDS``) and the run's verdict.  DeepDiff finds what
changed inside the first divergent step; the report names the step, the
field, both values, and shows the steps around it side by side.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from deepdiff import DeepDiff

from harness.formats.trace import STEP_FIELDS

CONTEXT_STEPS = 2


@dataclass
class Divergence:
    step: int | None  # None: the runs differ in verdict only
    field: str
    left: Any
    right: Any
    detail: str
    left_engine: str
    right_engine: str


def first_divergence(a: dict[str, Any], b: dict[str, Any]) -> Divergence | None:
    """The first step (and field) where trace ``a`` and trace ``b`` differ; the pool of the
    header (``kv_cache``) first."""
    ea, eb = a["engine"], b["engine"]
    if a.get("kv_cache") != b.get("kv_cache"):
        dd = DeepDiff(a.get("kv_cache"), b.get("kv_cache"), verbose_level=2)
        return Divergence(None, "kv_cache", a.get("kv_cache"), b.get("kv_cache"),
                          _describe(dd), ea, eb)
    if a["steps"] != b["steps"]:  # (equal runs, the common case, are told apart at once)
        d = first_divergent_step(a["steps"], b["steps"], ea, eb)
        if d is not None:
            return d
    na, nb = len(a["steps"]), len(b["steps"])
    if na != nb:
        step = min(na, nb)
        return Divergence(step, "steps", f"{na} steps ({a['verdict']})",
                          f"{nb} steps ({b['verdict']})", "one run ended earlier", ea, eb)
    # Failure messages are engine-specific; the verdict and the failing step are not.
    if (a["verdict"], _failure_step(a)) != (b["verdict"], _failure_step(b)):
        return Divergence(None, "verdict", [a["verdict"], a["failure"]],
                          [b["verdict"], b["failure"]], "the runs ended differently", ea, eb)
    return None


def first_divergent_step(steps_a: list[dict[str, Any]], steps_b: list[dict[str, Any]],
                         ea: str, eb: str) -> Divergence | None:
    """The first step (and field) where two runs' steps differ, over the steps both ran."""
    for i, (sa, sb) in enumerate(zip(steps_a, steps_b)):
        if sa == sb:
            continue
        for name in STEP_FIELDS:
            if sa.get(name) != sb.get(name):
                dd = DeepDiff(sa.get(name), sb.get(name), verbose_level=2)
                return Divergence(i, name, sa.get(name), sb.get(name), _describe(dd), ea, eb)
        extra = sorted(set(sa) ^ set(sb))
        return Divergence(i, ",".join(extra) or "?", None, None, "fields differ", ea, eb)
    return None


def only_fields(trace: dict[str, Any], fields) -> dict[str, Any]:
    """``trace`` compared on ``fields`` only: each step keeps those fields, and the pool
    header (``kv_cache``) stays only when named.  The number of steps and the verdict
    are always compared."""
    kept = dict(trace)
    kept["steps"] = [{k: v for k, v in step.items() if k in fields} for step in trace["steps"]]
    if "kv_cache" not in fields:
        kept.pop("kv_cache", None)
    return kept


def _failure_step(t: dict[str, Any]) -> int | None:
    return t["failure"]["step"] if t.get("failure") else None


def _describe(dd: DeepDiff) -> str:
    """Every change DeepDiff found, uncut: ``path: left -> right``."""
    parts = []
    for kind, changes in dd.to_dict().items():
        if isinstance(changes, dict):
            for path, change in changes.items():
                where = path.replace("root", "") or "."
                if isinstance(change, dict) and "old_value" in change:
                    parts.append(f"{where}: {_json(change['old_value'])} -> {_json(change['new_value'])}")
                else:
                    parts.append(f"{kind} at {where}: {_json(change)}")
        else:
            parts.append(f"{kind}: {_json(changes)}")
    return "; ".join(parts)


def _json(v: Any) -> str:
    return v if isinstance(v, str) else json.dumps(v, sort_keys=True, default=str)


def _short(v: Any, limit: int = 160) -> str:
    text = _json(v)
    return text if len(text) <= limit else text[: limit - 3] + "..."


SUMMARY_FIELDS = ("new_block_ids", "preempted", "prefix_hit_tokens", "spec_tokens", "emitted",
                  "finished", "evicted")
CONTEXT_WIDTH = 60  # context lines are cut here; the differing values never are


def _step_lines(step: dict[str, Any] | None) -> dict[str, str]:
    """The interesting fields of one step, a line each, keyed by field."""
    if step is None:
        return {"scheduled": "(no step)"}
    lines = {"scheduled": f"scheduled {_short(step['scheduled'], CONTEXT_WIDTH)}"}
    for name in SUMMARY_FIELDS:
        if step.get(name):
            lines[name] = f"{name} {_short(step[name], CONTEXT_WIDTH)}"
    lines["computed"] = f"computed {_short(step['num_computed_tokens'], CONTEXT_WIDTH)}"
    lines["free_blocks"] = f"free_blocks {step['free_blocks']}"
    return lines


def differing_fields(sa: dict[str, Any] | None, sb: dict[str, Any] | None) -> list[str]:
    """Every field of a step that differs between the two traces, in report order."""
    if sa is None or sb is None:
        return []
    return [f for f in STEP_FIELDS if sa.get(f) != sb.get(f)]


def _mark(text: str, color: bool) -> str:
    return f"\033[1;31m{text}\033[0m" if color else text


def side_by_side(a: dict[str, Any], b: dict[str, Any], center: int, color: bool = False) -> str:
    """The steps around ``center`` of both traces, in two columns, field beside field.

    Under the marked step, every field that differs there is shown whole, both
    values one above the other, marked with ``*`` (and in colour on a terminal).
    """
    width = 72
    out = [f"{'step':>5}  {a['engine']:<{width}}  {b['engine']}"]
    lo = max(0, center - CONTEXT_STEPS)
    hi = min(max(len(a["steps"]), len(b["steps"])), center + 2)
    order = ("scheduled",) + SUMMARY_FIELDS + ("computed", "free_blocks")
    label_width = max(len(a["engine"]), len(b["engine"]))
    for i in range(lo, hi):
        sa = a["steps"][i] if i < len(a["steps"]) else None
        sb = b["steps"][i] if i < len(b["steps"]) else None
        la, lb = _step_lines(sa), _step_lines(sb)
        mark = ">>" if i == center else "  "
        first = True
        for key in order:
            if key not in la and key not in lb:
                continue
            label = f"{mark}{i:>3}" if first else ""
            out.append(f"{label:>5}  {la.get(key, ''):<{width}}  {lb.get(key, '')}")
            first = False
        if i == center:
            for name in differing_fields(sa, sb):
                out.append(f"       {_mark('* ' + name + ' differs:', color)}")
                out.append(f"         {a['engine']:>{label_width}}: {_json(sa.get(name))}")
                out.append(f"         {b['engine']:>{label_width}}: {_json(sb.get(name))}")
        out.append("")
    return "\n".join(out).rstrip()


def report(a: dict[str, Any], b: dict[str, Any], d: Divergence, color: bool | None = None) -> str:
    """A readable account of a divergence: where, what differs (uncut), the steps around it."""
    if color is None:
        color = _color_wanted()
    where = "at the end of the run" if d.step is None else f"at step {d.step}"
    others = []
    if d.step is not None:
        others = [f for f in differing_fields(a["steps"][d.step] if d.step < len(a["steps"]) else None,
                                              b["steps"][d.step] if d.step < len(b["steps"]) else None)
                  if f != d.field]
    also = f" (also differs there: {', '.join(others)})" if others else ""
    lines = [
        f"DIVERGENCE {where}, field '{d.field}'{also}",
        f"  {d.left_engine:>9}: {_json(d.left)}",
        f"  {d.right_engine:>9}: {_json(d.right)}",
        f"  detail: {d.detail}",
    ]
    if d.step is not None:
        lines += ["", side_by_side(a, b, d.step, color)]
    return "\n".join(lines)


def _color_wanted() -> bool:
    import os
    import sys
    return sys.stdout.isatty() and "NO_COLOR" not in os.environ
