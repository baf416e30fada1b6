"""Numeric ranges as regexes over canonical JSON number text.

Integers are written without leading zeros and never as "-0". Alternatives are ordered longest
first, so that Python's first-match alternation (which lark uses to lex) takes the whole number.
"""

from __future__ import annotations

# Doubles keep 15 significant decimal digits: a fraction whose first non-zero digit is within
# 15 - (integer digits) places stays distinguishable from an integer bound after json.loads.
FLOAT_DIGITS = 15


def _fixed(lo: str, hi: str) -> list[str]:
    """Regexes for the same-length digit strings lo..hi (lo <= hi)."""
    if not lo:
        return [""]
    if lo == hi:
        return [lo]
    n = len(lo)
    if lo == "0" * n and hi == "9" * n:
        return [_digits(n)]
    a, b = lo[0], hi[0]
    if a == b:
        return [a + rest for rest in _fixed(lo[1:], hi[1:])]
    out = []
    # Top digit b with the rest up to hi[1:], middle digits free, bottom digit a with rest from lo[1:].
    if hi[1:] == "9" * (n - 1):
        b_lo = b
    else:
        out += [b + rest for rest in _fixed("0" * (n - 1), hi[1:])]
        b_lo = str(int(b) - 1)
    a_hi = a if lo[1:] == "0" * (n - 1) else str(int(a) + 1)
    if int(a_hi) <= int(b_lo):
        out.append(_digit_class(a_hi, b_lo) + _digits(n - 1))
    if a_hi != a:
        out += [a + rest for rest in _fixed(lo[1:], "9" * (n - 1))]
    return out


def _digit_class(a: str, b: str) -> str:
    return a if a == b else f"[{a}-{b}]"


def _digits(n: int) -> str:
    return "" if n == 0 else "[0-9]" if n == 1 else f"[0-9]{{{n}}}"


def _nonneg(lo: int, hi: int | None) -> list[str]:
    """Alternatives for canonical non-negative integers lo..hi (hi None: unbounded), longest first."""
    out = []
    if hi is None:
        width = len(str(lo))
        out.append(f"[1-9][0-9]{{{width},}}" if width > 1 else "[1-9][0-9]+")
        hi = 10**width - 1
    for width in range(len(str(hi)), len(str(lo)) - 1, -1):
        a = max(lo, 10 ** (width - 1) if width > 1 else 0)
        b = min(hi, 10**width - 1)
        if a <= b:
            out += _fixed(str(a), str(b))
    return out


def int_range(lo: int | None, hi: int | None) -> str | None:
    """Regex for canonical integers n with lo <= n <= hi (None: unbounded); None when empty."""
    if lo is not None and hi is not None and lo > hi:
        return None
    alts = []
    if lo is None or lo < 0:  # negatives: "-" then magnitude in [max(1, -hi), -lo]
        mag_lo = 1 if hi is None or hi >= 0 else -hi
        alts += ["-" + a for a in _nonneg(mag_lo, None if lo is None else -lo)]
    if hi is None or hi >= 0:
        alts += _nonneg(max(lo or 0, 0), hi)
    return alts[0] if len(alts) == 1 else "(?:" + "|".join(alts) + ")"


def _fraction(kind: str, cap: int | None) -> str:
    """Fraction part: 'any' (optional), 'zero' (optional, all zeros) or 'nonzero' (required)."""
    if kind == "zero":
        return r"(?:\.0+)?"
    if kind == "any":
        return r"(?:\.[0-9]+)?" if cap is None else rf"(?:\.[0-9]{{1,{cap}}})?"
    lead = "[0-9]*" if cap is None else f"[0-9]{{0,{cap - 1}}}"
    return rf"\.{lead}[1-9][0-9]*"


def _nonneg_decimal(lo: int, lo_excl: bool, hi: int | None, hi_excl: bool, cap: int | None) -> list[str]:
    """Decimals y (no exponent) with lo <(=) y <(=) hi, for integers 0 <= lo, as (integer part, fraction)."""
    alts = []
    any_lo = lo + 1 if lo_excl else lo
    any_hi = None if hi is None else hi - 1
    if any_hi is None or any_lo <= any_hi:
        ints = int_range(any_lo, any_hi)
        alts.append(ints + _fraction("any", cap))
    if lo_excl and (hi is None or lo < hi):
        alts.append(str(lo) + _fraction("nonzero", cap))
    if hi is not None and not hi_excl and (hi > lo or (hi == lo and not lo_excl)):
        alts.append(str(hi) + _fraction("zero", cap))
    return alts


def number_range(lo: int | None, lo_excl: bool, hi: int | None, hi_excl: bool) -> list[str]:
    """Regexes whose union is the decimal numbers x (no exponent) within integer bounds ([] when empty).

    Separate regexes rather than one alternation: each is safe for first-match lexing on its own,
    while e.g. "-12" (a prefix of "-127") would win inside a single alternation.

    Exclusive bounds cap the fraction's first non-zero digit so that float rounding in a validator
    (json.loads then compare) cannot turn x into the bound itself.
    """
    if lo is not None and hi is not None and (lo > hi or (lo == hi and (lo_excl or hi_excl))):
        return None
    cap = None
    if lo_excl or hi_excl:
        magnitude = max(abs(b) for b in (lo, hi) if b is not None)
        cap = FLOAT_DIGITS - len(str(magnitude))
    alts = []
    if hi is None or hi > 0 or (hi == 0 and not hi_excl):
        alts += _nonneg_decimal(max(lo, 0) if lo is not None else 0, lo is not None and lo >= 0 and lo_excl,
                                hi, hi_excl, cap)
    if lo is None or lo < 0:  # x = -y with y > 0: y from max(-hi, 0) (exclusive when 0) to -lo
        y_lo = 0 if hi is None or hi >= 0 else -hi
        y_lo_excl = y_lo == 0 or hi_excl
        alts += ["-" + a for a in _nonneg_decimal(y_lo, y_lo_excl, None if lo is None else -lo, lo_excl, cap)]
    return alts


# ----------------------------------------------------------------------------------- decimal bounds
_ANY_FRACTION = r"(?:\.[0-9]+)?"
_NONNEG = r"(?:0|[1-9][0-9]*)" + _ANY_FRACTION


def _split(value) -> tuple[int, str]:
    """A non-negative Decimal as (integer part, fraction digits without trailing zeros)."""
    whole, _, fraction = format(value, "f").partition(".")
    return int(whole), fraction.rstrip("0")


def _fraction_at_least(b: str) -> str:
    """Fraction digit strings F (after the point) with 0.F >= 0.b."""
    alts = [f"{b[:i]}[{int(d) + 1}-9][0-9]*" for i, d in enumerate(b) if d != "9"]
    return "(?:" + "|".join([*alts, f"{b}[0-9]*"]) + ")"


def _fraction_at_most(b: str) -> str:
    """Fraction digit strings F (after the point) with 0.F <= 0.b."""
    alts = [f"{b[:i]}[0-{int(d) - 1}][0-9]*" for i, d in enumerate(b) if d != "0"]
    alts += [f"{b[:j]}0*" for j in range(1, len(b) + 1)] + ["0+"]
    return "(?:" + "|".join(alts) + ")"


def _nonneg_at_least(low) -> str:
    whole, fraction = _split(low)
    alts = [int_range(whole + 1, None) + _ANY_FRACTION]
    alts.append(f"{whole}{_ANY_FRACTION}" if not fraction else rf"{whole}\.{_fraction_at_least(fraction)}")
    return "(?:" + "|".join(alts) + ")"


def _nonneg_at_most(high) -> str:
    whole, fraction = _split(high)
    alts = [int_range(0, whole - 1) + _ANY_FRACTION] if whole >= 1 else []
    alts.append(rf"{whole}(?:\.0+)?" if not fraction else rf"{whole}(?:\.{_fraction_at_most(fraction)})?")
    return "(?:" + "|".join(alts) + ")"


def decimal_at_least(low) -> str:
    """Regex for plain decimal texts (``-?(0|[1-9][0-9]*)(\\.[0-9]+)?``) whose exact value is >= ``low`` (a
    Decimal). The texts "-0", "-0.0", ... may match: callers remove them."""
    if low >= 0:
        return _nonneg_at_least(low)
    return f"(?:{_NONNEG}|-{_nonneg_at_most(-low)})"


def decimal_at_most(high) -> str:
    """Regex for plain decimal texts whose exact value is <= ``high`` (a Decimal); see `decimal_at_least`."""
    if high >= 0:
        return f"(?:-{_NONNEG}|{_nonneg_at_most(high)})"
    return f"-{_nonneg_at_least(-high)}"
