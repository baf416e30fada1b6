"""Numbers of the JSON Schema compiler: bounds (integer or not) and ``multipleOf``.

Exactness against validators that compare floats: the instance text is read by ``json.loads`` (an integer text
as an exact int, any other as a float) and compared with the schema's bound (a float when written with a
fraction). A non-integer bound ``b`` is compiled as the exact decimal ``repr(b)`` (an exclusive one as
``repr(nextafter(b))``, the next double): rounding to the nearest double is monotone and ``repr`` of the doubles
is increasing, so a text at or past that decimal passes the validator, and every value that passes has its
canonical (shortest round-trip) text at or past it.

``multipleOf``: a positive integer ``k`` (integers divisible by ``k``: a remainder automaton), or ``2**-j``
(decimals whose fraction is a multiple of ``2**-j``, where a double's division is exact). Any other step
(``0.01``) is refused: validators test ``instance / step`` in floating point (``0.07 / 0.01`` is
``7.000000000000001``), so the valid numbers are no decimal pattern.
"""

from __future__ import annotations

import math
from decimal import Decimal
from fractions import Fraction

import interegular
from interegular.fsm import FSM, Alphabet, anything_else

from specjax.grammar import _charsets as cs
from specjax.grammar._json_schema_logic import SchemaError
from specjax.grammar._json_text import _MAX_SAFE, NUMBER_REGEX
from specjax.grammar._regex_fsm import TooLarge, _minimal, fsm_rules
from specjax.grammar._regex_ranges import FLOAT_DIGITS, decimal_at_least, decimal_at_most, int_range, number_range

_PLAIN = r"(?:0|-?[1-9][0-9]*(?:\.[0-9]+)?|-?0\.[0-9]*[1-9][0-9]*)"  # plain decimals without "-0", "-0.0", ...
_MAX_DIGITS = 40  # fraction digits of a bound's decimal (an exclusive bound next to 1e-300 would be 300)
_MAX_DYADIC = 6  # multipleOf 2**-j up to j = 6 (64 fractions)


class NumberEmitter:
    """The number part of :class:`~specjax.grammar._json_schema_types.TypeEmitter` (a mixin: ``self.c`` is the
    owning compiler; ``_add_rules`` comes from the ObjectEmitter)."""

    def number(self, node: dict, path: str, integer: bool) -> str | None:
        """A ``/regex/`` terminal or a rule name for the node's numbers (None: none)."""
        step = self._step(node, path)
        if isinstance(step, int):
            integer = True
        lo, lo_excl, hi, hi_excl = self._bounds(node, path)
        if integer:
            ilo = None if lo is None else math.floor(lo) + 1 if lo_excl else math.ceil(lo)
            ihi = None if hi is None else math.ceil(hi) - 1 if hi_excl else math.floor(hi)
            if isinstance(step, int) and step > 1:
                return self._number_rules(path, [int_range(ilo, ihi)], _multiples(step), "multipleOf")
            text = int_range(ilo, ihi)
            return None if text is None else f"/{text}/"
        if step is not None:  # 2**-j
            regexes = [_dyadic(step)] + self._decimal_bounds(lo, lo_excl, hi, hi_excl, path)
            return self._number_rules(path, regexes, None, "multipleOf")
        if lo is None and hi is None:
            return f"/{NUMBER_REGEX}/"
        if all(b is None or float(b).is_integer() and abs(b) <= _MAX_SAFE for b in (lo, hi)):
            alts = number_range(None if lo is None else int(lo), lo_excl, None if hi is None else int(hi), hi_excl)
            return " | ".join(f"/{a}/" for a in alts or []) or None
        return self._number_rules(path, [_PLAIN, *self._decimal_bounds(lo, lo_excl, hi, hi_excl, path)], None,
                                  "minimum")

    def _number_rules(self, path: str, regexes: list[str | None], fsm, kw: str) -> str | None:
        """Right-linear rules for the texts of every regex (and ``fsm``); None when empty."""
        if any(r is None for r in regexes):
            return None

        def make(name: str) -> dict[str, str]:
            machine = fsm
            for regex in regexes:
                part = interegular.parse_pattern(regex).to_fsm()
                machine = part if machine is None else machine & part
            machine = _minimal(machine)
            return {} if not machine.finals else fsm_rules(machine, 0, None, name, render=cs.class_text, quoted=False)

        try:
            return self._add_rules(f"{path}/number", make)[0]
        except TooLarge as e:
            raise SchemaError(kw, path, f"the number automaton has {e}; not compiled") from None

    def _decimal_bounds(self, lo, lo_excl: bool, hi, hi_excl: bool, path: str) -> list[str]:
        """Regexes for plain decimals within the bounds (see the module docstring); [] when unbounded."""
        out = []
        for kw, b, excl, up in (("minimum", lo, lo_excl, True), ("maximum", hi, hi_excl, False)):
            if b is None:
                continue
            if abs(b) > _MAX_SAFE:
                raise SchemaError(kw, path, f"bound {b!r} on a non-integer number: bounds beyond 2**53 are not "
                                            "compiled (floats and integers compare differently there)")
            if excl and float(b).is_integer():  # as number_range: the first non-zero fraction digit within reach
                cap = FLOAT_DIGITS - len(str(abs(int(b))))
                edge = Decimal(int(b)) + (Decimal(1).scaleb(-cap) if up else -Decimal(1).scaleb(-cap))
            else:
                edge = Decimal(repr(math.nextafter(float(b), math.inf if up else -math.inf) if excl else b))
            if -edge.as_tuple().exponent > _MAX_DIGITS:
                raise SchemaError(kw, path, f"bound {b!r}: its decimal has more than {_MAX_DIGITS} fraction digits; "
                                            "not compiled")
            out.append(decimal_at_least(edge) if up else decimal_at_most(edge))
        return out

    @staticmethod
    def _step(node: dict, path: str) -> int | Fraction | None:
        """multipleOf as a positive int k, or 2**-j as a Fraction; None when absent; refuses any other step."""
        if "multipleOf" not in node:
            return None
        step = node["multipleOf"]
        if isinstance(step, bool) or not isinstance(step, int | float) or not math.isfinite(step) or step <= 0:
            raise SchemaError("multipleOf", path, f"must be a number > 0, got {step!r}")
        if isinstance(step, int) or step == 1:
            return int(step)
        exact = Fraction(step)
        if exact.numerator == 1 and exact.denominator <= 2**_MAX_DYADIC:  # 2**-j: the division is exact
            return exact
        raise SchemaError("multipleOf", path, f"multipleOf {step!r}: validators divide in floating point "
                                              "(0.07 / 0.01 is 7.000000000000001), so the valid numbers are no "
                                              "decimal pattern; compiled are integer steps (written without a "
                                              f"fraction) and 2**-j up to 2**-{_MAX_DYADIC}")

    def _bounds(self, node: dict, path: str):
        """(lo, lo exclusive, hi, hi exclusive) under the draft's syntax (draft 4: boolean exclusives)."""
        out = []
        for inc, exc in (("minimum", "exclusiveMinimum"), ("maximum", "exclusiveMaximum")):
            m, e = node.get(inc), node.get(exc)
            for kw, v in ((inc, m), (exc, e)):
                if v is not None and not (isinstance(v, int | float) and math.isfinite(v)) and \
                        not (self.c.draft <= 4 and kw == exc and isinstance(v, bool)):
                    raise SchemaError(kw, path, f"must be a finite number, got {v!r}")
            if self.c.draft <= 4:
                out += [m, bool(e) and m is not None]
            elif isinstance(e, bool):
                raise SchemaError(exc, path, "a boolean is draft 4 syntax; from draft 6 on it must be a number")
            elif e is None or m is None:
                out += [m, False] if e is None else [e, True]
            else:
                tighter_e = e >= m if inc == "minimum" else e <= m
                out += [e, True] if tighter_e else [m, False]
        return tuple(out)


def _dyadic(step: Fraction) -> str:
    """Plain decimals that are multiples of ``step`` = 2**-j: a fraction among the j-digit expansions of m/2**j."""
    fractions = [format(Decimal(m) / step.denominator, "f").partition(".")[2].rstrip("0")
                 for m in range(1, step.denominator)]
    tail = "|".join(sorted(fractions, key=len, reverse=True))
    return rf"(?:0|-?[1-9][0-9]*(?:\.(?:{tail}))?|-?0\.(?:{tail}))"


def _multiples(k: int):
    """An interegular DFA of the canonical integers divisible by ``k`` (no leading zeros, no "-0"): states
    0 start, 1 after "-", 2 the text "0", 3 + r remainder r of the digits so far."""
    digits = [str(d) for d in range(10)]
    alphabet = Alphabet.from_groups(*([d] for d in digits), ["-"], [anything_else])
    key = {s: alphabet[s] for s in [*digits, "-"]}
    table: dict = {0: {key["-"]: 1, key["0"]: 2}, 1: {}, 2: {}}
    for d in range(1, 10):
        table[0][key[str(d)]] = table[1][key[str(d)]] = 3 + d % k
    for r in range(k):
        table[3 + r] = {key[str(d)]: 3 + (10 * r + d) % k for d in range(10)}
    return FSM(alphabet, set(table), 0, {2, 3}, table)
