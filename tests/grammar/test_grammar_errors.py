"""Bad grammars and options → one GrammarError naming the cause."""

from __future__ import annotations

import pytest

from specjax.grammar import GrammarError, GrammarOptions, compile_grammar


class Tok:
    eos_ids = (1,)

    def token_bytes(self) -> list[bytes]:
        return [b"", b"", b"a", b"b", b"(", b")"]


def fails(grammar: str, **options) -> str:
    with pytest.raises(GrammarError) as info:
        compile_grammar(grammar, Tok(), GrammarOptions(cache=False, **options))
    return str(info.value)


def test_syntax_error_names_line_and_column():
    message = fails('start: "a"\nitem: "b" (\n')
    assert "line 2" in message and "column" in message


def test_undefined_rule_is_named():
    assert "'missing'" in fails('start: "a" missing')


def test_empty_language_is_refused():
    assert "empty" in fails('start: x\nx: "(" x ")"')
    assert "empty" in fails('start: A A\nA: /a+/')  # the greedy lexer never splits "aa..." in two


@pytest.mark.parametrize(("regex", "construct"), [("a(?=b)", "lookaround"), ("a(?!b)", "lookaround"),
                                                   ("(a)\\\\1", "backreference"), ("^a", "anchor")])
def test_unsupported_regex_constructs_are_named(regex, construct):
    message = fails(f"start: /{regex}/".replace("\\\\", "\\"))
    assert construct in message and "terminal" in message


def test_declared_terminal_without_definition():
    assert "_INDENT" in fails('%declare _INDENT\nstart: _INDENT "a"')


def test_indirect_left_recursion_is_accepted():  # rewritten as iteration: tests/grammar/test_left_recursion.py
    compile_grammar('start: x\nx: y "a" | "b"\ny: x "b"', Tok(), GrammarOptions(cache=False))


def test_state_cap_names_the_option_and_rules():
    message = fails('start: e\ne: "(" e ")" | "[" e "]" | "a"', max_depth=12, max_states=50)
    assert "max_states" in message and "max_depth" in message


def test_bad_options():
    with pytest.raises(GrammarError, match="max_depth"):
        GrammarOptions(max_depth=0)


def test_missing_eos():
    class NoEos:
        def token_bytes(self):
            return [b"a"]

    with pytest.raises(GrammarError, match="eos_ids"):
        compile_grammar('start: "a"', NoEos(), GrammarOptions(cache=False))
