"""Which named rules a reference run decides, seen from the sites of their mutants.

Each rule's mutant puts a replacement in place of one attribute of the reference
(:class:`harness.formats.mutant.Replacement`).  A run that never goes through that site
calls the same code with the mutant as without it, so it gives the same trace:
the stream cannot reach the rule.

Many sites only answer a question (``cap_model_len``, ``has_free_seat``,
``Config.has``, ...): they read the state and change nothing, and so do their
mutants' replacements.  For these, a site gone through is not enough: the
watch asks the replacement too, call by call, with the same arguments, and the
rule is decided only where the two answers differ.  If they agree on every call
of the run, the mutant's run would have met the same state at every call and
given the same answer, so it is the same run.

:meth:`Watch.decided_during` runs the reference once with every site watched and
returns the run's result with the rules it decided; the rule report
(:mod:`harness.jobs.rule_report`) runs a rule's mutant only on the streams that decided it.
A site that cannot be watched (not a function) counts as decided on every stream.
"""

from __future__ import annotations

import functools
import inspect
from contextlib import ExitStack
from typing import Callable, Iterable
from unittest import mock

from harness.formats.mutant import Replacement

_RAISED = object()


def site_of(mutant) -> tuple[object, str] | None:
    """The attribute a mutant replaces, or None when its patch does not say."""
    patch = mutant.patch
    return (patch.owner, patch.attr) if isinstance(patch, Replacement) else None


def _function_of(attribute):
    """The plain function behind an attribute as its owner stores it, or None."""
    if isinstance(attribute, (staticmethod, classmethod)):
        attribute = attribute.__func__
    elif isinstance(attribute, property):
        attribute = attribute.fget
    return attribute if inspect.isroutine(attribute) else None


def _rewrapped(attribute, function):
    """``function`` stored as ``attribute`` was (a static, class method or property)."""
    if isinstance(attribute, (staticmethod, classmethod)):
        return type(attribute)(function)
    if isinstance(attribute, property):
        return property(function, attribute.fset, attribute.fdel, attribute.__doc__)
    return function


def _answer(function, args, kwargs) -> tuple:
    try:
        return (function(*args, **kwargs),)
    except Exception as exc:  # the answer is the exception
        return (_RAISED, type(exc), str(exc), exc)


def _same(a: tuple, b: tuple) -> bool:
    if len(a) != len(b):
        return False
    if len(a) == 4:
        return a[:3] == b[:3]
    x, y = a[0], b[0]
    return x is y or (type(x) is type(y) and x == y)


class Watch:
    """The sites of some rules' mutants, watched while the reference runs."""

    def __init__(self, rules: Iterable) -> None:
        self.by_site: dict[tuple[object, str], list] = {}  # (owner, attribute): its rules
        self.always: list[str] = []  # rules whose site cannot be watched
        for rule in rules:
            site = site_of(rule.mutant)
            if site is None:
                self.always.append(rule.name)
            else:
                self.by_site.setdefault(site, []).append(rule)

    def decided_during(self, run: Callable[[], object]) -> tuple[object, set[str]]:
        """``run()``'s result and the names of the rules it decided."""
        decided = set(self.always)
        shadowing = [False]  # inside a replacement asked in the shadow: nothing is noted

        def watching(attribute, rules):
            original = _function_of(attribute)
            if original is None:
                return None
            # What is still open at this site: rules decided by any call, and questions
            # whose answers have agreed so far.
            plain = [r.name for r in rules if not r.mutant.patch.question]
            questions = [(r.name, _function_of(r.mutant.patch.new)) for r in rules
                         if r.mutant.patch.question]

            @functools.wraps(original)
            def watched(*args, **kwargs):
                if shadowing[0] or not (plain or questions):
                    return original(*args, **kwargs)
                if plain:
                    decided.update(plain)
                    plain.clear()
                    if not questions:
                        return original(*args, **kwargs)
                ours = _answer(original, args, kwargs)
                shadowing[0] = True
                try:
                    for question in list(questions):
                        if not _same(ours, _answer(question[1], args, kwargs)):
                            decided.add(question[0])
                            questions.remove(question)
                finally:
                    shadowing[0] = False
                if ours[0] is _RAISED:
                    raise ours[3]
                return ours[0]
            return _rewrapped(attribute, watched)

        with ExitStack() as stack:
            for (owner, attr), rules in self.by_site.items():
                watched = watching(inspect.getattr_static(owner, attr), rules)
                if watched is None:
                    decided.update(r.name for r in rules)
                    continue
                stack.enter_context(mock.patch.object(owner, attr, watched))
            result = run()
        return result, decided
