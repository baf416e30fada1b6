"""Anchors of the regex front-end: a pattern as top-level alternatives, each anchored at its start and/or end.

``^`` and ``$`` are only compiled at the ends of an alternative (elsewhere the emitter refuses them). Python's
parser moves a common prefix out of the branches (``^a$|^b$`` parses as ``^(?:a$|b$)``, and ``^mqtt:x$|^mqtt:y$``
as ``^mqtt:(?:x$|y$)``), and patterns put anchors inside a group (``(^Hpt_|_Armour_)``, ``^([^,]|$)``). So a
group or a branch that holds an anchor is expanded into alternatives of the whole pattern (up to
``_MAX_ALTERNATIVES``) before the anchors are stripped: the same language, written as a union.
"""

from __future__ import annotations

from re import _constants as C  # noqa: N812

_MAX_ALTERNATIVES = 64
_ANCHORS = ((C.AT, C.AT_BEGINNING), (C.AT, C.AT_END))


def strip_anchors(items: list) -> tuple[bool, list, bool]:
    """(anchored at start, body, anchored at end); anchors anywhere else are refused later.

    Looks through one enclosing group: `(^a+$)` is anchored like `^a+$`.
    """
    start = end = False
    while items and items[0] == (C.AT, C.AT_BEGINNING):
        items, start = items[1:], True
    while items and items[-1] == (C.AT, C.AT_END):
        items, end = items[:-1], True
    if len(items) == 1 and items[0][0] is C.SUBPATTERN and not items[0][1][1] and not items[0][1][2]:
        inner = list(items[0][1][3])
        if inner and (inner[0] == (C.AT, C.AT_BEGINNING) or inner[-1] == (C.AT, C.AT_END)):
            s, body, e = strip_anchors(inner)
            return start or s, body, end or e
    return start, list(items), end


def alternatives(tree) -> list[tuple[bool, list, bool]]:
    """Top-level alternatives as (anchored start, body, anchored end): `^a$|^b$` has two."""
    start, body, end = strip_anchors(list(tree))
    if len(body) == 1 and body[0][0] is C.BRANCH:  # re's parser moves a common `^` out of the branches
        alts = [strip_anchors(list(alt)) for alt in body[0][1][1]]
        alts = [(start or s, b, end or e) for s, b, e in alts]
    else:
        alts = [(start, body, end)]
    if not any(_has_anchor(b) for _, b, _ in alts):
        return alts
    expanded = _expand(list(tree))
    if expanded is None:
        return alts  # too many: the emitter refuses the inner anchor, naming its column
    return [strip_anchors(items) for items in expanded]


def _has_anchor(items) -> bool:
    for op, av in items:
        if (op, av) in _ANCHORS:
            return True
        if op is C.SUBPATTERN and _has_anchor(av[3]) or op is C.BRANCH and any(_has_anchor(a) for a in av[1]):
            return True
        if op in (C.MAX_REPEAT, C.MIN_REPEAT) and _has_anchor(av[2]):
            return True
    return False


def _expand(items: list) -> list[list] | None:
    """The pattern as a union of sequences, inlining plain groups and distributing branches that hold an anchor
    (a group's capture does not change the language: backreferences are refused). None past the limit."""
    for i, (op, av) in enumerate(items):
        if op is C.SUBPATTERN and not av[1] and not av[2] and _has_anchor(av[3]):
            return _expand(items[:i] + list(av[3]) + items[i + 1:])
        if op is C.BRANCH and any(_has_anchor(alt) for alt in av[1]):
            out: list[list] = []
            for alt in av[1]:
                more = _expand(items[:i] + list(alt) + items[i + 1:])
                if more is None or len(out) + len(more) > _MAX_ALTERNATIVES:
                    return None
                out += more
            return out
    return [items]
