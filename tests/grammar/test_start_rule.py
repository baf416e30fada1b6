"""The start rule option, its error messages, and %declare'd (postlexer) terminals, python.lark included."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from python_grammar import python_lark

from specjax.grammar import GrammarError, GrammarOptions, allowed, compile_grammar
from specjax.grammar.frontend import load_lark

EXPR = '''
expr: term ("+" term)*
term: "a" | "(" expr ")"
other: "b" expr?
cs_list{item}: item ("," item)*
'''


class ListTokenizer:
    eos_ids = (1,)
    pieces = [b"", b"", b"a", b"+", b"(", b")", b"b", b","]

    def token_bytes(self) -> list[bytes]:
        return list(self.pieces)


TOK = ListTokenizer()


def first_tokens(tables) -> set[bytes]:
    row = np.asarray(allowed(tables, jnp.array([tables.initial_state], jnp.int32)))[0]
    return {TOK.pieces[i] for i in np.nonzero(row)[0]}


def refusal(text: str, start: str = "start") -> str:
    with pytest.raises(GrammarError) as info:
        load_lark(text, start)
    return str(info.value)


TOP = "top-level rules (used by no rule outside their own recursion): "


def test_missing_start_rule_names_the_top_level_rules_and_the_option():
    message = refusal(EXPR)
    assert "no rule named 'start'" in message
    assert TOP + "other —" in message  # other uses expr, term is used by expr
    assert "GrammarOptions(start=" in message and "grammar_start=" in message
    # expr and term recurse into each other: their group is top-level once other no longer uses it
    assert TOP + "expr, other —" in refusal(EXPR.replace("expr?", '"b"'))
    assert TOP + "a —" in refusal('a: "x" | "(" b ")"\nb: a')


def test_unknown_start_rule_is_named_with_a_suggestion():
    message = refusal(EXPR, "exr")
    assert "no rule named 'exr'" in message and "did you mean 'expr'?" in message
    assert "template" in refusal(EXPR, "cs_list")


def test_non_default_start_compiles_its_own_language(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECJAX_CACHE", str(tmp_path))
    expr = compile_grammar(EXPR, TOK, GrammarOptions(start="expr"))
    other = compile_grammar(EXPR, TOK, GrammarOptions(start="other"))  # same text: the start is in the cache key
    assert first_tokens(expr) == {b"a", b"("}
    assert first_tokens(other) == {b"b"}
    assert len(list((tmp_path / "grammar").glob("*/tables.npz"))) == 2


def test_reachable_declared_terminals_need_a_postlexer():
    message = refusal(python_lark(), "file_input")
    assert "terminals _DEDENT, _INDENT (used by rules match_stmt, suite)" in message
    assert "postlexer" in message and "start rules that do not reach them: eval_input" in message
    assert "_INDENT (used by rule start) is %declare'd" in refusal('%declare _INDENT\nstart: _INDENT "a"')


def test_unreachable_declared_terminals_are_fine():
    text = '%declare _INDENT _DEDENT\nblock: _INDENT expr+ _DEDENT\nexpr: "a" | "(" expr ")"'
    tables = compile_grammar(text, TOK, GrammarOptions(start="expr", cache=False))
    assert first_tokens(tables) == {b"a", b"("}


def test_python_eval_input_lookaround_terminal_is_named_with_the_override_hint():
    message = refusal(python_lark(overrides=False), "eval_input")
    assert "terminal DEC_NUMBER" in message and "lookaround" in message
    assert "used by rule number" in message and "'%override DEC_NUMBER: ...'" in message


def test_python_eval_input_loads_with_templates_expanded():
    cfg = load_lark(python_lark(), "eval_input")
    names = set(cfg.rule_names)
    # lark instantiated comprehension{comp_result} for each argument the expression rules pass it
    assert {"comprehension{test}", "comprehension{key_value}", "comprehension{test_or_star_expr}"} <= names
    assert {"STRING", "LONG_STRING", "DEC_NUMBER", "NAME", "_NEWLINE"} <= set(cfg.terminal_names)
    assert not {"_INDENT", "_DEDENT"} & set(cfg.terminal_names)


def test_python_eval_input_is_refused_as_too_large_naming_the_options():
    with pytest.raises(GrammarError) as info:
        compile_grammar(python_lark(), TOK, GrammarOptions(start="eval_input", max_depth=1, max_states=2000,
                                                           cache=False))
    assert "max_states=2000" in str(info.value) and "max_depth" in str(info.value)


def test_cli_grammar_start_reaches_the_compiler(tmp_path):
    from specjax.decode.cli import DecodeOptions, grammar_spec
    from specjax.decode.grammar_spec import GrammarSpecError, compile_spec

    path = tmp_path / "g.lark"
    path.write_text(EXPR)
    spec = grammar_spec(DecodeOptions(grammar=str(path), grammar_start="other"))
    assert first_tokens(compile_spec(spec, TOK)) == {b"b"}
    with pytest.raises(GrammarSpecError, match=r"g\.lark: the grammar has no rule named 'start'.*grammar_start="):
        compile_spec(grammar_spec(DecodeOptions(grammar=str(path))), TOK)


def test_python_literal_overrides_agree_with_the_original_grammar():
    """Our automaton of the overridden literals (greedy lexer) vs lark's LALR on python.lark's own terminals."""
    import random

    import lark

    from specjax.grammar.automaton import build_automaton

    extra = "\nstart: number | string_concat\n"
    auto = build_automaton(load_lark(python_lark() + extra), 3, 10_000)
    original = lark.Lark(python_lark(overrides=False) + extra, parser="lalr")

    def ours(s: str) -> bool:
        q = auto.trans_sb.dtype.type(1)
        for b in s.encode():
            q = auto.trans_sb[q, b]
        return bool(auto.accept_s[q])

    def theirs(s: str) -> bool:
        try:
            original.parse(s)
        except lark.exceptions.LarkError:
            return False
        return True

    rng = random.Random(0)
    alphabet = ['"', "'", "\\", "a", " ", "\n", "0", "1", "_", ".", "e", "j", "x", '"""', "'''"]
    cases = set()
    for _ in range(4000):
        body = "".join(rng.choices(alphabet, k=rng.randint(1, 6)))
        quote = rng.choice(["", '"', "'", '"""', "'''"])  # around the body half of the time: more valid literals
        cases.add(rng.choice(["", "r", "b", "rb", "f"]) + (quote + body + quote if rng.random() < 0.5 else body))
    assert [s for s in sorted(cases) if ours(s) != theirs(s)] == []
    assert sum(map(ours, cases)) > 400  # the sample holds accepted literals, not only garbage


def test_empty_start_option_is_refused():
    with pytest.raises(GrammarError, match="start must be the name of a rule"):
        GrammarOptions(start="")
