"""Differential test against llguidance on the Gemma 3 vocabulary: allowed-token sets step by step.

Along random valid token paths, both engines' allowed sets must be equal except for the two kinds of
difference explained in docs/grammar.md:

* "ignore-at-ends": before the first and after the last terminal, specjax allows ``%ignore`` text (as lark
  does); llguidance does not.
* "nesting": llguidance has an unbounded stack; specjax masks out tokens that open brackets beyond
  ``max_depth``. Such a token's walk dies on an opening-bracket byte.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from grammar_samples import GRAMMARS

from specjax.grammar import GrammarOptions, allowed, compile_grammar

llguidance = pytest.importorskip("llguidance")
lnp = pytest.importorskip("llguidance.numpy")

pytestmark = pytest.mark.real_model
OPENERS = set(b"([{")
STEPS, PATHS = 40, 3


class _Wrapper:
    """llguidance's duck-typed tokenizer: raw bytes per token, specials 0xFF-prefixed (as grammar_peers.py)."""

    def __init__(self, tok):
        pieces = tok.token_bytes()
        self.tokens = [b or b"\xff" + tok.id_to_piece(i).encode() for i, b in enumerate(pieces)]
        self.eos_token_id, self.bos_token_id = tok.eos_ids[0], tok.bos_id
        self.special_token_ids = [i for i, b in enumerate(pieces) if not b]
        self._tok = tok

    def __call__(self, s):
        return self._tok.encode(s.decode("utf-8", "replace") if isinstance(s, bytes) else s, add_bos=False)


@pytest.fixture(scope="module")
def llg_tokenizer(real_tokenizer):
    return llguidance.LLTokenizer(llguidance.TokenizerWrapper(_Wrapper(real_tokenizer)),
                                  eos_token=list(real_tokenizer.eos_ids))


def _dies_on_opener(trans_sb: np.ndarray, state: int, data: bytes) -> bool:
    for b in data:
        nxt = int(trans_sb[state, b])
        if nxt == 0:
            return b in OPENERS
        state = nxt
    return False


@pytest.mark.parametrize("name", ["json", "arith", "sql"])
def test_allowed_sets_match_llguidance(name, real_tokenizer, llg_tokenizer):
    # max_ignore=None: llguidance bounds no ignored text; timeout=None: the Gemma vocabulary on a loaded machine
    tables = compile_grammar(GRAMMARS[name], real_tokenizer, GrammarOptions(max_depth=2, max_ignore=None, timeout=None))
    trans_sb, accept_s = np.asarray(tables.trans_sb), np.asarray(tables.accept_s)
    pieces = real_tokenizer.token_bytes()
    punct = np.array([bool(p) and not p.strip().isalnum() for p in pieces])
    allowed_fn = jax.jit(allowed)
    bitmask = lnp.allocate_token_bitmask(1, real_tokenizer.vocab_size)
    compared = 0
    for seed in range(PATHS):
        rng = np.random.default_rng(seed)
        matcher = llguidance.LLMatcher(llg_tokenizer, llguidance.LLMatcher.grammar_from_lark(GRAMMARS[name]))
        assert not matcher.is_error(), matcher.get_error()
        state, text = tables.initial_state, b""
        for _ in range(STEPS):
            lnp.fill_next_token_bitmask(matcher, bitmask, 0)
            theirs = np.unpackbits(bitmask.view(np.uint8), bitorder="little")[:real_tokenizer.vocab_size] > 0
            ours = np.asarray(allowed_fn(tables, jnp.array([state], jnp.int32)))[0]
            at_start, at_end = not text.strip(), bool(accept_s[state])
            for t in np.nonzero(ours & ~theirs)[0]:
                leading = at_start and pieces[t][:1].isspace()
                trailing = at_end and pieces[t].isspace()
                assert leading or trailing, f"after {text!r}: only specjax allows {pieces[t]!r}"
            for t in np.nonzero(theirs & ~ours)[0]:
                assert _dies_on_opener(trans_sb, state, pieces[t]), \
                    f"after {text!r}: only llguidance allows {pieces[t]!r}"
            common = np.nonzero(ours & theirs)[0]
            compared += 1
            choice = common[punct[common]] if rng.random() < 0.7 and punct[common].any() else common
            token = int(rng.choice(choice))
            if token in real_tokenizer.eos_ids:
                break
            assert matcher.consume_token(token), matcher.get_error()
            state, text = _walk(trans_sb, state, pieces[token]), text + pieces[token]
    assert compared >= PATHS * 5


def _walk(trans_sb: np.ndarray, state: int, data: bytes) -> int:
    for b in data:
        state = int(trans_sb[state, b])
    return state
