"""Anchors inside groups and factored branches (`_regex_anchors`): the translated regex (search semantics)
full-matches exactly the strings `re.search` finds the pattern in, over every short string of a small alphabet
(no newline: Python's `$` also matches before a final newline, ECMA-262's does not)."""

from __future__ import annotations

import itertools
import re

import pytest

from specjax.grammar import _charsets as cs
from specjax.grammar.json_schema import json_schema_to_lark
from specjax.grammar.regex import RegexError, translate

CASES = [
    (r"^ab$|^ac$|^b$", "abc,"),  # re's parser moves "^a" out of the first two branches
    (r"(^ab|^b|ca)", "abc,"),
    (r"^([^,]|$)", "ab,"),
    (r"^([ab]+\.[ab]*$|%c%)", "ab.%c"),
    (r"x(^|a)", "xa"),  # "^" after "x" never matches: that alternative is empty, the other stays
]


@pytest.mark.parametrize(("pattern", "alphabet"), CASES)
def test_anchors_inside_groups_keep_search_semantics(pattern, alphabet):
    try:
        translated = re.compile(translate(pattern, cs.class_text, search=True))
    except RegexError:
        assert pattern == r"x(^|a)"  # an anchor that is neither first nor last stays refused
        return
    for n in range(5):
        for chars in itertools.product(alphabet, repeat=n):
            s = "".join(chars)
            assert bool(translated.fullmatch(s)) == bool(re.search(pattern, s)), (pattern, s)


def test_anchored_alternatives_in_a_json_schema_pattern_compile():
    text = json_schema_to_lark({"type": "string", "pattern": "^mqtt:connect$|^mqtt:subscribe$|^mqtt:publish$"})
    assert text.count("mqtt") >= 3
    with pytest.raises(RegexError, match="anchor"):
        translate("(^a)*", search=True)  # inside a repetition: not expanded
