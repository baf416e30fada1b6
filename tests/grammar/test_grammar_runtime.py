"""In-graph mask/advance on tiny vocabularies: masks, EOS, dead state, specials, UTF-8 splits, batching."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import lark
import numpy as np
import pytest

from specjax.grammar import GrammarError, GrammarOptions, advance, allowed, compile_grammar, mask_logits, stack_grammars


class ListTokenizer:
    """A vocabulary given as a list of byte strings (b"" = special); EOS is id 1."""

    eos_ids = (1,)

    def __init__(self, pieces: list[bytes]):
        self.pieces = pieces

    def token_bytes(self) -> list[bytes]:
        return list(self.pieces)


PIECES = [b"", b"", b"a", b"b", b"ab", b"ba", b"(", b")", b"()", b" ", b"a)", b"\xc3", b"\xa9", b"\xc3\xa9",
          b"\xe6", b"\x9d\xb1", b"\xe6\x9d\xb1", b"x", b"aa"]
TOK = ListTokenizer(PIECES)
ID = {p: i for i, p in enumerate(PIECES) if p}
NO_CACHE = dict(cache=False)


def walk(tables, ids: list[int], state: int | None = None) -> int:
    s = jnp.array([tables.initial_state if state is None else state], jnp.int32)
    for i in ids:
        s = advance(tables, s, jnp.array([i], jnp.int32))
    return int(s[0])


def allowed_set(tables, state: int) -> set[bytes | int]:
    row = np.asarray(allowed(tables, jnp.array([state], jnp.int32)))[0]
    return {PIECES[i] or i for i in np.nonzero(row)[0]}


def test_masks_follow_the_grammar_and_eos_only_when_accepting():
    t = compile_grammar('start: "a" "b"+', TOK, GrammarOptions(**NO_CACHE))
    assert allowed_set(t, t.initial_state) == {b"a", b"ab"}
    after_a = walk(t, [ID[b"a"]])
    assert allowed_set(t, after_a) == {b"b"}  # not EOS: "a" alone is not a sentence
    after_ab = walk(t, [ID[b"ab"]])
    assert allowed_set(t, after_ab) == {b"b", 1}  # EOS (id 1) allowed: "ab" is complete
    assert walk(t, [1], after_ab) == after_ab  # EOS keeps the (accepting) state


def test_dead_state_is_explicit_and_absorbing():
    t = compile_grammar('start: "a" "b"', TOK, GrammarOptions(**NO_CACHE))
    dead = walk(t, [ID[b"b"]])
    assert dead == 0
    assert walk(t, [ID[b"a"], ID[b"b"]], dead) == 0
    assert allowed_set(t, 0) == set()
    logits = mask_logits(t, jnp.array([0, t.initial_state]), jnp.zeros((2, len(PIECES))))
    assert bool(jnp.all(jnp.isneginf(logits[0])))
    assert not bool(jnp.isneginf(logits[1, ID[b"a"]]))
    assert walk(t, [1]) == 0  # EOS where the grammar does not accept: dead


def test_special_tokens_never_match_text():
    t = compile_grammar('start: /[^x]+/ "x"', TOK, GrammarOptions(**NO_CACHE))
    for state in (t.initial_state, walk(t, [ID[b"a"]])):
        assert 0 not in allowed_set(t, state)
        assert walk(t, [0], state) == 0


def test_multibyte_characters_split_across_tokens():
    t = compile_grammar('start: ("é" | "東")+', TOK, GrammarOptions(**NO_CACHE))
    first = allowed_set(t, t.initial_state)
    assert {b"\xc3", b"\xc3\xa9", b"\xe6", b"\xe6\x9d\xb1"} <= first and b"\xa9" not in first
    half = walk(t, [ID[b"\xc3"]])
    assert allowed_set(t, half) == {b"\xa9"}
    assert 1 in allowed_set(t, walk(t, [ID[b"\xa9"]], half))
    assert 1 in allowed_set(t, walk(t, [ID[b"\xe6"], ID[b"\x9d\xb1"]]))
    assert walk(t, [ID[b"\xe6"], ID[b"\xa9"]]) == 0


def test_nesting_beyond_max_depth_is_masked_out():
    grammar = 'start: e\ne: "(" e ")" | "a"'
    t = compile_grammar(grammar, TOK, GrammarOptions(max_depth=2, **NO_CACHE))
    two = walk(t, [ID[b"("], ID[b"("]])
    assert two != 0 and b"(" not in allowed_set(t, two) and b"a" in allowed_set(t, two)
    assert t.truncated
    deep = compile_grammar(grammar, TOK, GrammarOptions(max_depth=3, **NO_CACHE))
    assert b"(" in allowed_set(deep, walk(deep, [ID[b"("], ID[b"("]]))


def test_greedy_lexer_does_not_split_a_growing_lexeme():
    t = compile_grammar('start: A "b" A\nA: /a+/', TOK, GrammarOptions(**NO_CACHE))
    s = walk(t, [ID[b"a"], ID[b"a"]])
    assert allowed_set(t, s) == {b"a", b"b", b"ab", b"ba", b"aa"}
    with pytest.raises(GrammarError, match="empty"):  # "aaaa" never splits into two A lexemes
        compile_grammar("start: A A\nA: /a+/", TOK, GrammarOptions(**NO_CACHE))


def test_batch_rows_follow_their_own_grammars_in_a_jitted_loop():
    g1 = compile_grammar('start: "a"+', TOK, GrammarOptions(**NO_CACHE))
    g2 = compile_grammar('start: "b"+ "x"', TOK, GrammarOptions(**NO_CACHE))
    both, initial = stack_grammars([g1, g2])
    path_bt = jnp.array([[ID[b"a"], ID[b"aa"], 1], [ID[b"b"], ID[b"b"], ID[b"x"]]], jnp.int32)

    @jax.jit
    def run(tables, state_b, path_bt):
        def body(i, carry):
            state_b, ok_b = carry
            token_b = path_bt[:, i]
            ok_b &= allowed(tables, state_b)[jnp.arange(state_b.shape[0]), token_b]
            return advance(tables, state_b, token_b), ok_b
        return jax.lax.fori_loop(0, path_bt.shape[1], body, (state_b, jnp.ones(state_b.shape, bool)))

    state_b, ok_b = run(both, jnp.array(initial, jnp.int32), path_bt)
    assert ok_b.tolist() == [True, True]
    assert bool(both.accept_s[state_b[0]]) and bool(both.accept_s[state_b[1]])
    crossed = jnp.array([[ID[b"b"]], [ID[b"a"]]], jnp.int32)  # each row's token is the other grammar's
    _, ok_b = run(both, jnp.array(initial, jnp.int32), crossed)
    assert ok_b.tolist() == [False, False]


def test_byte_tokenizer_fixture_and_explicit_eos(byte_tokenizer):
    t = compile_grammar('start: "ab" | "ba"', byte_tokenizer, GrammarOptions(eos_ids=(1,), **NO_CACHE))
    pieces = byte_tokenizer.token_bytes()
    ids = [pieces.index(b"a"), pieces.index(b"b")]
    row = np.asarray(allowed(t, jnp.array([walk(t, ids)])))[0]
    assert np.nonzero(row)[0].tolist() == [1]
    first = {pieces[i] for i in np.nonzero(np.asarray(allowed(t, jnp.array([1]))))[1]}
    assert first == {b"a", b"b"}


@pytest.mark.parametrize("text", ["(a)", "((a))", "a"])
def test_accepted_strings_parse_with_lark(text):
    grammar = 'start: e\ne: "(" e ")" | "a"'
    t = compile_grammar(grammar, TOK, GrammarOptions(**NO_CACHE))
    state = walk(t, [ID[bytes([c])] for c in text.encode()])
    assert bool(t.accept_s[state])
    lark.Lark(grammar).parse(text)


def _oracle_advance(tables, pieces: list[bytes], state: int, token: int) -> int:
    """advance() spelled out in Python: EOS keeps an accepting state, specials die, text walks its bytes."""
    trans_sb, accept_s, kind_v = (np.asarray(a) for a in (tables.trans_sb, tables.accept_s, tables.kind_v))
    if kind_v[token] == 1:
        return state if accept_s[state] else 0
    if kind_v[token] == 2:
        return 0
    for byte in pieces[token]:
        state = int(trans_sb[state, byte])
    return state


def test_advance_matches_a_python_byte_walk_on_mixed_length_tokens():
    # Tokens of 1..13 bytes (across the loop's 4-byte unroll) over JSON's alphabet, EOS and a special,
    # advanced in batches that mix short and long tokens and start from every state (dead included).
    from grammar_samples import JSON_LARK

    rng = np.random.default_rng(0)
    alphabet = list(b'{}[]",: 0123456789.-eatrulfsn\\') + [0xC3, 0xA9]
    pieces = [b"", b""] + [bytes(rng.choice(alphabet, size=n).tolist()) for n in rng.integers(1, 14, size=300)]
    pieces += [b'{"a": ', b'"ab"', b"true", b"null", b"[1, 2, 3]", b'{"key": "value"}', b"1234567890123"]
    tables = compile_grammar(JSON_LARK, ListTokenizer(pieces), GrammarOptions(max_depth=3, **NO_CACHE))
    assert tables.bytes_vl.shape[1] == 16
    jitted = jax.jit(advance)
    for batch in (1, 7, 64):
        state_b = rng.integers(0, tables.n_states, size=batch).astype(np.int32)
        token_b = rng.integers(0, len(pieces), size=batch).astype(np.int32)
        want = [_oracle_advance(tables, pieces, int(s), int(t)) for s, t in zip(state_b, token_b, strict=True)]
        assert np.asarray(jitted(tables, jnp.asarray(state_b), jnp.asarray(token_b))).tolist() == want
    # Along real paths (states stay alive), one row at a time and all rows in one batch.
    ids = [pieces.index(p) for p in (b'{"a": ', b"[1, 2, 3]", b"}")]
    assert walk(tables, ids) != 0 and bool(tables.accept_s[walk(tables, ids)])
    states = [tables.initial_state]
    for t in ids:
        states.append(_oracle_advance(tables, pieces, states[-1], t))
    got = jitted(tables, jnp.asarray(states[:-1], jnp.int32), jnp.asarray(ids, jnp.int32))
    assert np.asarray(got).tolist() == states[1:]
