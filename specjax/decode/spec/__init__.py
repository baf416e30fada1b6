"""Speculative decoding, an add-on to plain decoding (`specjax.decode`).

`config.py` (SpecConfig) → `driver.py` (SpeculativeGenerator, host side) → `program.py` (the jitted
program: prefill, first token, `initial_state`) → `policy.py` (Adaptive: which round runs when) →
`rounds.py` (RoundContext and the two kinds of round) → `verify.py` / `trees.py`; the carry is
`state.py`, drafters are `drafters/` (one module each, built by `drafters/registry.py`).
"""

from specjax._lazy import lazy_exports

_EXPORTS = {
    "SpecConfig": "config", "SpecStats": "driver", "SpeculativeGenerator": "driver",
    "Adaptive": "policy", "estimated_verify_cost": "policy",
    "speculative_program": "program", "initial_state": "program",
    "RoundContext": "rounds", "plain_round": "rounds", "spec_round": "rounds", "propose": "rounds",
    "SpecState": "state", "SpecRow": "state", "PolicyState": "state", "Counters": "state", "Shadow": "state",
    "StaticTree": "trees",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
