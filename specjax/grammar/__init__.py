"""Constrained decoding: grammars compiled to token-mask tables used inside the jitted decode loop.

See docs/grammar.md. Entry points: :func:`compile_grammar` and the in-graph :func:`mask_logits`,
:func:`advance` and :func:`allowed`.
"""

from specjax.grammar.compiler import GrammarOptions, compile_grammar
from specjax.grammar.errors import GrammarError
from specjax.grammar.runtime import GrammarTables, advance, allowed, mask_logits, stack_grammars

__all__ = ["GrammarError", "GrammarOptions", "GrammarTables", "advance", "allowed", "compile_grammar",
           "mask_logits", "stack_grammars"]
