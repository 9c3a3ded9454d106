"""``harness certify``: an engine held to the reference of the vLLM release it claims.

The conformance profile (:mod:`harness.jobs.engine_profile`) of the engine, its streams
drawn inside the features it declares, judged against the reference stating the rules
of ``--release``; written as a report a simulator's maintainers can read and CI can
read:

* ``report.json`` and ``report.md``: per family and per fidelity level
  (:mod:`harness.checks.levels`) the streams taken, conforming and diverging; the rules
  and design differences named (:mod:`harness.checks.designs`) and the divergent streams
  left unexplained; the engine's own crashes with their site; why streams were not
  taken; the shrunk counterexamples (``counterexamples/<family>.json``);
* ``badge.svg``: the release and the share of taken streams exact at tokens and at
  every field.

The same engine, release, streams and seed give the same report, byte for byte.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any, Sequence

from harness.checks.levels import EXACT, LEVELS, fields_of
from harness.formats.paths import write_atomic, write_json
from harness.formats.text import markdown_table
from harness.jobs.engine_profile import Profile, profile

#: Divergent streams per family the certificate tries to explain.
EXPLAINED = 5


def certify(engine: str, release: str, streams: int = 50, level: str = EXACT,
            families: Sequence[str] | None = None, folder: Path | None = None,
            on_family=None) -> dict[str, Any]:
    """The certificate of ``engine`` against the reference of ``release``, written to
    ``folder`` when given; divergences are explained on the fields of ``level``."""
    examples = None if folder is None else folder / "counterexamples"
    result = profile(engine, streams, fields_of(level), "reference", families, examples,
                     examples is not None, on_family, release=release,
                     explain_per_family=EXPLAINED)
    report = summary(result, release, level, _shown_name(engine))
    if folder is not None:
        write_json(folder / "report.json", report)
        write_atomic(folder / "report.md", markdown(report))
        write_atomic(folder / "badge.svg", badge(report))
    return report


def _shown_name(spec: str) -> str:
    """The name an engine gives itself (``nano-vllm``), else how it was named."""
    from harness.engines import get_engine
    engine = get_engine(spec)
    return str(getattr(getattr(engine, "engine", engine), "name", None) or engine.name)


def summary(p: Profile, release: str, level: str, name: str | None = None) -> dict[str, Any]:
    """The certificate as data (report.json)."""
    inside = [f for f in p.families if not f.outside]
    taken = sum(f.taken for f in inside)
    named = Counter()
    for f in inside:
        named.update(f.rules)
    crashes, crash_examples = Counter(), {}
    for f in inside:
        crashes.update(f.crashes)
        for kind, message in f.crash_examples.items():
            crash_examples.setdefault(kind, message)
    examined = sum(sum(f.rules.values()) + f.unexplained for f in inside)
    return {
        "engine": name or p.engine, "spec": p.engine, "release": release,
        "level_compared": level,
        "features": None if p.features is None else sorted(p.features),
        "generated": p.generated, "taken": taken,
        "share_taken": _share(taken, p.generated),
        "conforming": {lvl: sum(f.held_at(lvl) for f in inside) for lvl in LEVELS},
        "level_reached": level_reached(inside),
        "diverging": sum(f.diverge for f in inside),
        "explained": sum(named.values()), "unexplained": sum(f.unexplained for f in inside),
        "examined": examined,
        "named": dict(sorted(named.items())),
        "crashes": dict(sorted(crashes.items())),
        "crash_examples": dict(sorted(crash_examples.items())),
        "not_taken": dict(p.refusals.most_common()),
        "families": [_family(f) for f in p.families],
    }


def level_reached(families) -> str | None:
    """The highest level at which every taken stream conforms (None: not even tokens)."""
    reached = None
    taken = sum(f.taken for f in families)
    for lvl in LEVELS:
        if taken and sum(f.held_at(lvl) for f in families) == taken:
            reached = lvl
    return reached


def _family(f) -> dict[str, Any]:
    return {"name": f.name, "outside": f.outside, "generated": f.streams, "taken": f.taken,
            "conforming": {lvl: f.held_at(lvl) for lvl in LEVELS}, "diverging": f.diverge,
            "first_divergence": f.first, "named": dict(sorted(f.rules.items())),
            "unexplained": f.unexplained, "unexplained_at": list(f.unexplained_at),
            "crashes": dict(sorted(f.crashes.items())),
            "counterexample": Path(f.example).name if f.example else None}


def _share(n: int, total: int) -> float:
    return round(100 * n / total, 1) if total else 0.0


def markdown(r: dict[str, Any]) -> str:
    """The certificate as a page (report.md)."""
    taken = r["taken"]
    lines = [f"# {r['engine']} held to vLLM {r['release']}", "",
             f"Features declared: {', '.join(r['features']) if r['features'] else 'none (every stream)'}.",
             f"Streams taken: **{taken} of {r['generated']} ({r['share_taken']:g}%)**; "
             f"level reached by every taken stream: **{r['level_reached'] or 'none'}**; "
             f"divergences explained on the fields of level {r['level_compared']}.", "",
             markdown_table([["level", "conforming", "share of taken"],
                             *([lvl, str(r["conforming"][lvl]),
                                f"{_share(r['conforming'][lvl], taken):g}%"]
                               for lvl in LEVELS)]), ""]
    rows = [["family", "taken", *LEVELS, "named (streams)", "unexplained"]]
    for f in r["families"]:
        if f["outside"]:
            rows.append([f["name"], f"outside: {f['outside']}", *["-"] * len(LEVELS), "-", "-"])
            continue
        rows.append([f["name"], f"{f['taken']}/{f['generated']}",
                     *(str(f["conforming"][lvl]) for lvl in LEVELS),
                     ", ".join(f"{k} ({v})" for k, v in f["named"].items()) or "-",
                     str(f["unexplained"])])
    lines += ["## Per family", "", markdown_table(rows), ""]
    lines += ["## Named", "",
              f"{r['explained']} of the {r['examined']} divergent streams examined are "
              f"explained ({r['diverging']} diverge in all, crashes included; a stream on "
              f"which the engine crashed is counted below, not explained); "
              f"{r['unexplained']} are not.", ""]
    lines += [f"* {name}: {n}" for name, n in r["named"].items()] or ["* nothing"]
    left = [(f["name"], at) for f in r["families"] for at in f.get("unexplained_at", [])]
    if left:
        lines += ["", "Unexplained (stream digest: first divergence):", ""]
        lines += [f"* {family}: {at}" for family, at in left]
    lines += ["", "## The engine's own failures", ""]
    lines += [f"* {n} stream(s): {kind}, e.g. `{r['crash_examples'][kind]}`"
              for kind, n in r["crashes"].items()] or ["* none"]
    lines += ["", "## Not taken", ""]
    lines += [f"* {n}: {why}" for why, n in r["not_taken"].items()] or ["* every stream taken"]
    examples = [f for f in r["families"] if f["counterexample"]]
    if examples:
        lines += ["", "## Counterexamples (shrunk)", ""]
        lines += [f"* {f['name']}: `counterexamples/{f['counterexample']}` "
                  f"(first divergence: {f['first_divergence']})" for f in examples]
    return "\n".join(lines) + "\n"


def badge(r: dict[str, Any]) -> str:
    """A flat SVG badge: the release, and the share of taken streams exact at tokens and
    at every field."""
    taken = r["taken"]
    tokens = _share(r["conforming"]["tokens"], taken)
    exact = _share(r["conforming"][EXACT], taken)
    left, right = f"vLLM {r['release']}", f"tokens {tokens:g}% | exact {exact:g}%"
    color = "#4c1" if exact == 100 else "#dfb317" if tokens >= 50 else "#e05d44"
    lw, rw = 7 * len(left) + 10, 7 * len(right) + 10
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{lw + rw}" height="20" '
            f'role="img" aria-label="{left}: {right}"><title>{left}: {right}</title>'
            f'<rect width="{lw}" height="20" fill="#555"/>'
            f'<rect x="{lw}" width="{rw}" height="20" fill="{color}"/>'
            f'<g fill="#fff" font-family="Verdana,DejaVu Sans,sans-serif" font-size="11">'
            f'<text x="5" y="14">{left}</text><text x="{lw + 5}" y="14">{right}</text></g>'
            f'</svg>\n')


def named_entries(r: dict[str, Any]) -> list[str]:
    """Every rule and design difference a certificate names, each once (combinations split)."""
    return sorted({name for key in r["named"] for name in key.split(" + ")})


def compliance_table(reports: Sequence[dict[str, Any]]) -> str:
    """The compliance table of docs/simulators.md, one row per certificate."""
    rows = [["engine", "release", "taken", "level reached", *LEVELS, "named",
             "unexplained", "crashes"]]
    for r in reports:
        taken = r["taken"]
        rows.append([r["engine"], r["release"], f"{r['share_taken']:g}%",
                     r["level_reached"] or "none",
                     *(f"{_share(r['conforming'][lvl], taken):g}%" for lvl in LEVELS),
                     ", ".join(named_entries(r)) or "-",
                     f"{r['unexplained']}/{r['examined']}",
                     str(sum(r["crashes"].values()))])
    return markdown_table(rows)
