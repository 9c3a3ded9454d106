"""Comparing two traces step by step, and the report a reader gets.

The comparison is exact: every field of every step record (see
``harness.trace.STEP_FIELDS``) and the run's verdict.  DeepDiff finds what
changed inside the first divergent step; the report names the step, the
field, both values, and shows the steps around it side by side.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from deepdiff import DeepDiff

from harness.trace import STEP_FIELDS

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
    """The first step (and field) where trace ``a`` and trace ``b`` differ."""
    ea, eb = a["engine"], b["engine"]
    for i, (sa, sb) in enumerate(zip(a["steps"], b["steps"])):
        if sa == sb:
            continue
        for name in STEP_FIELDS:
            if sa.get(name) != sb.get(name):
                dd = DeepDiff(sa.get(name), sb.get(name), verbose_level=2)
                return Divergence(i, name, sa.get(name), sb.get(name), _describe(dd), ea, eb)
        extra = sorted(set(sa) ^ set(sb))
        return Divergence(i, ",".join(extra) or "?", None, None, "fields differ", ea, eb)
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


def _failure_step(t: dict[str, Any]) -> int | None:
    return t["failure"]["step"] if t.get("failure") else None


def _describe(dd: DeepDiff) -> str:
    parts = []
    for kind, changes in dd.to_dict().items():
        if isinstance(changes, dict):
            for path, change in list(changes.items())[:4]:
                parts.append(f"{kind} at {path.replace('root', '') or '.'}: {_short(change)}")
        else:
            parts.append(f"{kind}: {_short(changes)}")
    return "; ".join(parts[:6])


def _short(v: Any, limit: int = 160) -> str:
    text = json.dumps(v, sort_keys=True, default=str) if not isinstance(v, str) else v
    return text if len(text) <= limit else text[: limit - 3] + "..."


SUMMARY_FIELDS = ("new_block_ids", "preempted", "prefix_hit_tokens", "spec_tokens", "emitted",
                  "finished", "evicted")


def _step_lines(step: dict[str, Any] | None) -> dict[str, str]:
    """The interesting fields of one step, a line each, keyed by field."""
    if step is None:
        return {"scheduled": "(no step)"}
    lines = {"scheduled": f"scheduled {_short(step['scheduled'], 60)}"}
    for name in SUMMARY_FIELDS:
        if step.get(name):
            lines[name] = f"{name} {_short(step[name], 60)}"
    lines["computed"] = f"computed {_short(step['num_computed_tokens'], 60)}"
    lines["free_blocks"] = f"free_blocks {step['free_blocks']}"
    return lines


def side_by_side(a: dict[str, Any], b: dict[str, Any], center: int) -> str:
    """The steps around ``center`` of both traces, in two columns, field beside field."""
    width = 72
    out = [f"{'step':>5}  {a['engine']:<{width}}  {b['engine']}"]
    lo = max(0, center - CONTEXT_STEPS)
    hi = min(max(len(a["steps"]), len(b["steps"])), center + 2)
    order = ("scheduled",) + SUMMARY_FIELDS + ("computed", "free_blocks")
    for i in range(lo, hi):
        la = _step_lines(a["steps"][i] if i < len(a["steps"]) else None)
        lb = _step_lines(b["steps"][i] if i < len(b["steps"]) else None)
        mark = ">>" if i == center else "  "
        first = True
        for key in order:
            if key not in la and key not in lb:
                continue
            label = f"{mark}{i:>3}" if first else ""
            out.append(f"{label:>5}  {la.get(key, ''):<{width}}  {lb.get(key, '')}")
            first = False
        out.append("")
    return "\n".join(out).rstrip()


def report(a: dict[str, Any], b: dict[str, Any], d: Divergence) -> str:
    """A readable account of a divergence."""
    where = "at the end of the run" if d.step is None else f"at step {d.step}"
    lines = [
        f"DIVERGENCE {where}, field '{d.field}'",
        f"  {d.left_engine:>9}: {_short(d.left, 400)}",
        f"  {d.right_engine:>9}: {_short(d.right, 400)}",
        f"  detail: {d.detail}",
    ]
    if d.step is not None:
        lines += ["", side_by_side(a, b, d.step)]
    return "\n".join(lines)
