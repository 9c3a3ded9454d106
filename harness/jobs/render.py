"""The rules of one vLLM release as plain code: the reference with every rule ask answered.

The reference states 0.11.0's rules and asks ``has("<change>")`` wherever a later
release changed one (``reference.releases``).  Rendering a release answers each ask for
that release and keeps only the code that runs there, in the spirit of
ethereum/execution-specs, whose forks are whole readable packages:

* every ``has("<change>")`` becomes ``True`` or ``False``, and the boolean expressions,
  conditional expressions and ``if`` statements around it fold to the branch taken;
* statements after a ``return`` or ``raise`` that folding left unconditional go;
* the plumbing that carries the answers (``Config.has``, ``has=`` parameters and
  arguments, ``HasRule``) goes, and so does ``releases.py`` itself;
* a function the reference calls only from another release's rules goes too;
* docstrings, comments and layout stay: libcst edits the concrete syntax tree.

Folding assumes what the reference's style promises: an ask comes after the cheap,
side-effect-free tests of the step's own state, so ``x and False`` may drop ``x``.
``tests/test_render.py`` proves each rendering exact by replaying every recorded trace
of the release with the rendered modules in place of ``reference/``.
"""

from __future__ import annotations

import difflib
import functools
import re
from dataclasses import dataclass
from pathlib import Path

import libcst as cst

from harness.formats.paths import ROOT
from reference import releases

REFERENCE_DIR = ROOT / "reference"
#: The rule registry: what rendering answers from, not a rule of any release.
NOT_RENDERED = ("releases.py",)
#: The names of the plumbing that carries rule answers.
ASK = "has"
PLUMBING = frozenset({ASK, "HasRule", "only_0_11_0"})


def render_module(source: str | cst.Module, rules: frozenset[str]) -> str:
    """One reference module's source with every ask answered from ``rules``."""
    tree = cst.parse_module(source) if isinstance(source, str) else source
    tree = tree.visit(_AnswerAsks(rules))
    tree = tree.visit(_DropPlumbing())
    return tree.code


@functools.lru_cache(maxsize=None)
def _modules(source_dir: Path) -> tuple[tuple[str, cst.Module, frozenset[str]], ...]:
    """The reference's modules, parsed once: name, tree, the changes it asks about."""
    out = []
    for path in sorted(source_dir.glob("*.py")):
        if path.name not in NOT_RENDERED:
            tree = cst.parse_module(path.read_text())
            out.append((path.name, tree, frozenset(_asks_in(tree))))
    return tuple(out)


def _answered(rules: frozenset[str], source_dir: Path) -> dict[str, str]:
    return {name: _render_cached(name, tree, rules & asked)
            for name, tree, asked in _modules(source_dir)}


@functools.lru_cache(maxsize=4096)
def _render_cached(name: str, tree: cst.Module, rules: frozenset[str]) -> str:
    # Keyed by the rules the module asks about: a change it never asks leaves it alone.
    return render_module(tree, rules)


def render(release: str, source_dir: Path = REFERENCE_DIR) -> dict[str, str]:
    """Every module of the reference rendered for ``release``: file name -> source."""
    return render_rules(releases.rules_of(release), source_dir)


@functools.lru_cache(maxsize=256)
def render_rules(rules: frozenset[str], source_dir: Path = REFERENCE_DIR) -> dict[str, str]:
    """Every module of the reference with its asks answered from ``rules``, without the
    functions only other releases' rules call."""
    files = _answered(rules, source_dir)
    return _without_dead_functions(files, _names_used_outside(),
                                   _words_of_the_reference(source_dir))


# -- functions no rule of the release calls ------------------------------------------------


@functools.lru_cache(maxsize=None)
def _names_used_outside() -> frozenset[str]:
    """Every name the harness's own modules (the engines, the tests' tools) use: a
    function they call stays even where the release's rules never do."""
    words: set[str] = set()
    for path in (ROOT / "harness").rglob("*.py"):
        if "mutants" not in path.parts and path.name != "render.py":
            words.update(re.findall(r"\w+", path.read_text()))
    return frozenset(words)


@functools.lru_cache(maxsize=None)
def _words_of_the_reference(source_dir: Path) -> dict[str, int]:
    return _word_counts(path.read_text() for path in sorted(source_dir.glob("*.py"))
                        if path.name not in NOT_RENDERED)


def _word_counts(texts) -> dict[str, int]:
    """How many times each word appears in the texts."""
    counts: dict[str, int] = {}
    for text in texts:
        for w in re.findall(r"\w+", text):
            counts[w] = counts.get(w, 0) + 1
    return counts


def _without_dead_functions(files: dict[str, str], outside: frozenset[str],
                            before: dict[str, int]) -> dict[str, str]:
    """Drop the functions and methods that answering the asks left uncalled: named
    somewhere besides their definition in the reference (``before``), and now nowhere
    in the tree nor in the harness.  A function the reference itself never calls (a
    helper for tests and tools) stays.  Repeated until none is left, since one dropped
    can leave another uncalled."""
    texts = dict(files)
    while True:
        defined: dict[str, int] = {}
        for text in texts.values():
            for fn in _DEF.findall(text):
                defined[fn] = defined.get(fn, 0) + 1
        words = _word_counts(texts.values())
        dead = {fn for fn, n in defined.items()
                if not fn.startswith("__") and words.get(fn, 0) <= n
                and before.get(fn, 0) > n and fn not in outside}
        if not dead:
            return texts
        for name, text in texts.items():  # parse only the modules that define one
            mine = frozenset(dead & set(_DEF.findall(text)))
            if mine:
                texts[name] = _drop_functions(text, mine)


@functools.lru_cache(maxsize=1024)
def _drop_functions(text: str, dead: frozenset[str]) -> str:
    return cst.parse_module(text).visit(_DropFunctions(dead)).code


#: A function or method definition, by name (a word count decides, not the parse).
_DEF = re.compile(r"^\s*def (\w+)", re.MULTILINE)


class _DropFunctions(cst.CSTTransformer):
    def __init__(self, dead: set[str]) -> None:
        self.dead = dead

    def leave_FunctionDef(self, original, updated):
        return cst.RemovalSentinel.REMOVE if updated.name.value in self.dead else updated

    def leave_IndentedBlock(self, original, updated):
        return _never_empty(updated)


def _asks_in(tree: cst.Module) -> set[str]:
    found: set[str] = set()

    class Collect(cst.CSTVisitor):
        def visit_Call(self, node):
            change = _ask_of(node)
            if change is not None:
                found.add(change)

    tree.visit(Collect())
    return found


def write(release: str, out_dir: Path) -> list[Path]:
    """Render ``release`` into ``out_dir`` (made if needed); the files written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in render(release).items():
        (out_dir / name).write_text(text)
        written.append(out_dir / name)
    return written


# -- answering the asks ------------------------------------------------------------------


def _ask_of(node: cst.BaseExpression) -> str | None:
    """The change a ``has("<change>")`` / ``x.has("<change>")`` call asks about."""
    if not isinstance(node, cst.Call) or len(node.args) != 1:
        return None
    func = node.func
    name = func.value if isinstance(func, cst.Name) else \
        func.attr.value if isinstance(func, cst.Attribute) else None
    arg = node.args[0].value
    if name != ASK or not isinstance(arg, cst.SimpleString):
        return None
    return arg.evaluated_value


def _truth(node: cst.BaseExpression) -> bool | None:
    """True or False when the expression is that literal, else None."""
    if isinstance(node, cst.Name) and node.value in ("True", "False"):
        return node.value == "True"
    return None


def _literal(value: bool) -> cst.Name:
    """``True`` or ``False``, with no parentheses: a name needs none."""
    return cst.Name("True" if value else "False")


def _keep_parens(result: cst.BaseExpression, outer: cst.BaseExpression) -> cst.BaseExpression:
    """``result`` standing where ``outer`` stood: it keeps the parentheses ``outer`` had."""
    if outer.lpar and not result.lpar:
        return result.with_changes(lpar=outer.lpar, rpar=outer.rpar)
    return result


class _AnswerAsks(cst.CSTTransformer):
    def __init__(self, rules: frozenset[str]) -> None:
        self.rules = rules

    def leave_Call(self, original, updated):
        change = _ask_of(updated)
        if change is None:
            return updated
        return _literal(change in self.rules)

    def leave_UnaryOperation(self, original, updated):
        value = _truth(updated.expression)
        if isinstance(updated.operator, cst.Not) and value is not None:
            return _literal(not value)
        return updated

    def leave_BooleanOperation(self, original, updated):
        left, right = _truth(updated.left), _truth(updated.right)
        is_and = isinstance(updated.operator, cst.And)
        if left is not None:  # True and x -> x; False and x -> False; mirrored for or
            return _keep_parens(updated.right, updated) if left == is_and \
                else _literal(left)
        if right is not None:  # x and True -> x; x and False -> False (x has no effect)
            return _keep_parens(updated.left, updated) if right == is_and \
                else _literal(right)
        return updated

    def leave_IfExp(self, original, updated):
        value = _truth(updated.test)
        if value is None:
            return updated
        return _keep_parens(updated.body if value else updated.orelse, updated)

    def leave_If(self, original, updated):
        updated = _fold_elifs(updated)
        value = _truth(updated.test)
        if value is None:
            return updated
        if value:
            return _flatten(updated.body.body, updated.leading_lines)
        if updated.orelse is None:
            return cst.RemovalSentinel.REMOVE
        if isinstance(updated.orelse, cst.If):  # the elif becomes the if
            return updated.orelse.with_changes(leading_lines=updated.leading_lines)
        return _flatten(updated.orelse.body.body, updated.leading_lines)

    def leave_IndentedBlock(self, original, updated):
        return _never_empty(updated.with_changes(body=_until_the_exit(updated.body)))

    def leave_Module(self, original, updated):
        return updated.with_changes(body=_until_the_exit(updated.body))


def _never_empty(block: cst.IndentedBlock) -> cst.IndentedBlock:
    """A block whose statements all went holds ``pass``."""
    if block.body:
        return block
    return block.with_changes(body=[cst.SimpleStatementLine([cst.Pass()])])


def _fold_elifs(node: cst.If) -> cst.If:
    """``elif True:`` becomes ``else:``; an ``elif False:`` leaves the chain."""
    orelse = node.orelse
    while isinstance(orelse, cst.If) and _truth(orelse.test) is not None:
        if _truth(orelse.test):
            orelse = cst.Else(body=orelse.body)
        else:
            orelse = orelse.orelse
    return node.with_changes(orelse=orelse)


def _flatten(statements, leading_lines) -> cst.FlattenSentinel | cst.RemovalSentinel:
    """A branch's statements in place of its ``if``; the ``if``'s comments go first."""
    statements = list(statements)
    if not statements:
        return cst.RemovalSentinel.REMOVE
    first = statements[0]
    statements[0] = first.with_changes(
        leading_lines=list(leading_lines) + list(first.leading_lines))
    return cst.FlattenSentinel(statements)


def _until_the_exit(body):
    """A block's statements up to and with the first unconditional ``return`` or
    ``raise``: what folding left after it can never run."""
    kept = []
    for statement in body:
        kept.append(statement)
        if isinstance(statement, cst.SimpleStatementLine) and any(
                isinstance(s, (cst.Return, cst.Raise)) for s in statement.body):
            break
    return kept


# -- dropping the plumbing -----------------------------------------------------------------


def _is_plumbing(node: cst.BaseExpression) -> bool:
    """``has``, ``config.has``, ``self.has``: the ask function passed along."""
    if isinstance(node, cst.Name):
        return node.value in PLUMBING
    return isinstance(node, cst.Attribute) and node.attr.value == ASK


class _DropPlumbing(cst.CSTTransformer):
    def leave_Param(self, original, updated):
        return cst.RemovalSentinel.REMOVE if updated.name.value == ASK else updated

    def leave_Arg(self, original, updated):
        if (updated.keyword is not None and updated.keyword.value == ASK) or \
                _is_plumbing(updated.value):
            return cst.RemovalSentinel.REMOVE
        return updated

    def leave_Parameters(self, original, updated):
        if len(updated.params) < len(original.params) and updated.params:
            updated = updated.with_changes(params=_without_last_comma(updated.params))
        return updated

    def leave_Call(self, original, updated):
        if len(updated.args) < len(original.args) and updated.args:
            updated = updated.with_changes(args=_without_last_comma(updated.args))
        return updated

    def leave_FunctionDef(self, original, updated):
        return cst.RemovalSentinel.REMOVE if updated.name.value in PLUMBING else updated

    def leave_SimpleStatementLine(self, original, updated):
        body = [s for s in updated.body if not _assigns_plumbing(s)]
        if not body:
            return cst.RemovalSentinel.REMOVE
        return updated.with_changes(body=body)

    def leave_ImportFrom(self, original, updated):
        if isinstance(updated.names, cst.ImportStar):
            return updated
        names = [n for n in updated.names if n.name.value not in PLUMBING]
        if not names:
            return cst.RemovalSentinel.REMOVE
        if len(names) != len(updated.names):
            names[-1] = names[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
        return updated.with_changes(names=names)


def _without_last_comma(items):
    """A parameter or argument list whose last item went: the new last one ends it."""
    items = list(items)
    items[-1] = items[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
    return items


def _assigns_plumbing(statement) -> bool:
    """``self.has = has``, or ``HasRule = ...``."""
    if isinstance(statement, cst.Assign):
        return any(_is_plumbing(t.target) for t in statement.targets)
    return False


# -- diffs between releases ----------------------------------------------------------------


def _hunks(name: str, old: str, new: str, label_old: str, label_new: str) -> list[list[str]]:
    """The unified diff of one module as hunks: each its header line and its lines (the
    first hunk also carries the ``---``/``+++`` lines)."""
    lines = list(difflib.unified_diff(old.splitlines(keepends=True),
                                      new.splitlines(keepends=True),
                                      f"{label_old}/{name}", f"{label_new}/{name}"))
    hunks: list[list[str]] = []
    head: list[str] = []
    for line in lines:
        if line.startswith("@@"):
            hunks.append(head + [line])
            head = []
        elif hunks:
            hunks[-1].append(line)
        else:
            head.append(line)
    return hunks


def _edits(hunk: list[str]) -> set[tuple[str, str]]:
    """A hunk's removed and added lines, by sign and text (blank lines aside): what a
    change does, wherever difflib happens to align it."""
    return {(line[0], line[1:].strip()) for line in hunk
            if line[:1] in "+-" and not line.startswith(("---", "+++")) and line[1:].strip()}


@dataclass
class Hunk:
    module: str
    lines: list[str]
    changes: list[releases.RuleChange]

    @property
    def text(self) -> str:
        return "".join(self.lines)


@functools.lru_cache(maxsize=None)
def attributed_diff(old: str, new: str) -> list[Hunk]:
    """The hunks of the rendered modules' diff from release ``old`` to ``new``, each with
    the rule changes it comes from: a change is behind a hunk when answering that change
    alone as ``new`` does, from ``old``'s rules, changes the same lines."""
    rules_old, rules_new = releases.rules_of(old), releases.rules_of(new)
    a, b = render_rules(rules_old), render_rules(rules_new)
    changes = releases.changes_between(old, new)
    alone = {c.name: render_rules(rules_old ^ {c.name}) for c in changes}
    out = []
    for name in sorted(set(a) | set(b)):
        edits = {c.name: set().union(*[_edits(h) for h in _hunks(
            name, a.get(name, ""), alone[c.name].get(name, ""), old, new)])
            for c in changes}
        for hunk in _hunks(name, a.get(name, ""), b.get(name, ""), old, new):
            behind = [c for c in changes if _edits(hunk) & edits[c.name]]
            out.append(Hunk(name, hunk, behind))
    return out


# -- the pages of docs/releases/ -----------------------------------------------------------

PAGES_DIR = ROOT / "docs" / "releases"
#: The releases whose rendered modules are committed whole: the base and the newest.
COMMITTED = (releases.RELEASES[0], releases.RELEASES[-1])


def _change_line(c: releases.RuleChange) -> str:
    pr = f"vLLM PR {c.pr}" if c.pr else "PR not identified"
    undone = f"; undone in {c.until}" if c.until else ""
    return (f"* `{c.name}` ({c.since}{undone}; {pr}; `{c.mirrors}`): {c.summary}  In the "
            f"reference: {', '.join(f'`{f}`' for f in c.applies_in)}.")


def diff_page(old: str, new: str) -> str:
    """The page ``<old>-to-<new>.md``: the rule changes between two releases, and the diff
    of their rendered modules with each hunk labelled by the changes behind it."""
    changes = releases.changes_between(old, new)
    hunks = attributed_diff(old, new)
    lines = [f"# vLLM {old} to {new}: the rules that changed", "",
             f"Written by `python -m harness releases pages` from `reference/` "
             f"([index](README.md)); `python -m harness releases render --diff {old} {new}` "
             f"prints the same diff.", ""]
    if not changes:
        lines += [f"No rule change: the rendered modules of {old} and {new} are the same.", ""]
        return "\n".join(lines)
    lines += [f"## {len(changes)} rule change{'s' * (len(changes) != 1)}", ""]
    lines += [_change_line(c) for c in changes] + [""]
    lines += [f"## The diff ({len(hunks)} hunk{'s' * (len(hunks) != 1)})", ""]
    for h in hunks:
        names = ", ".join(f"`{c.name}`" for c in h.changes) or "NO RULE CHANGE"
        lines += [f"### `{h.module}`: {names}", "", "```diff", h.text.rstrip("\n"), "```", ""]
    return "\n".join(lines)


def index_page() -> str:
    pairs = list(zip(releases.RELEASES, releases.RELEASES[1:]))
    lines = ["# The rules of each vLLM release", "",
             "Written by `python -m harness releases pages`.  Each release's rules are the "
             "reference's modules with every rule ask answered for that release "
             "(`harness/jobs/render.py`): plain code, docstrings and comments kept, nothing of "
             "other releases' rules.  The base release and the newest are here whole; any "
             "other renders on demand:", "",
             "```sh",
             "python -m harness releases render 0.19.0 -o /tmp/vllm-0.19.0-rules",
             "python -m harness releases render --diff 0.19.0 0.34.0",
             "```", "",
             f"* [{COMMITTED[0]}]({COMMITTED[0]}/) (the base) and "
             f"[{COMMITTED[1]}]({COMMITTED[1]}/) (the newest described): start with "
             "`scheduler.py`'s `schedule`, then `kv_cache_manager.py` and `block_pool.py`.",
             "* Every rendering is proven exact: `tests/test_render.py` replays each recorded "
             "release's traces (`fixtures/traces/`) with its rendered modules in place of "
             "`reference/`.", "",
             "| from | to | rule changes | diff |", "|---|---|---|---|"]
    for old, new in pairs:
        n = len(releases.changes_between(old, new))
        lines.append(f"| {old} | {new} | {n} | [{old}-to-{new}]({old}-to-{new}.md) |")
    return "\n".join(lines) + "\n"


def pages() -> dict[str, str]:
    """Every file of docs/releases/: relative path -> text."""
    out = {"README.md": index_page()}
    for release in COMMITTED:
        for name, text in render(release).items():
            out[f"{release}/{name}"] = text
    for old, new in zip(releases.RELEASES, releases.RELEASES[1:]):
        out[f"{old}-to-{new}.md"] = diff_page(old, new)
    return out


def write_pages(out_dir: Path = PAGES_DIR) -> int:
    """Write docs/releases/ afresh; the number of files."""
    import shutil
    if out_dir.exists():
        shutil.rmtree(out_dir)
    files = pages()
    for rel, text in files.items():
        path = out_dir / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return len(files)
