"""What a user asks to constrain generation to: a Lark grammar, a JSON Schema or a regex (host side).

A :class:`GrammarSpec` is hashable, so the generator compiles each distinct spec once per process (and the
grammar compiler caches tables on disk across processes). Every front-end error becomes one
:class:`GrammarSpecError` line naming the source (file or option) and the problem (line and column, keyword).
"""

from __future__ import annotations

import dataclasses
import functools
import json
from pathlib import Path

from specjax.decode.constrain import MAX_DIGIT_BOUND
from specjax.grammar._deadline import deadline
from specjax.grammar.compiler import GrammarOptions, compile_grammar
from specjax.grammar.errors import GrammarError
from specjax.grammar.json_schema import UNENFORCEABLE, JsonSchemaOptions, SchemaError, json_schema_grammar
from specjax.grammar.regex import RegexError, regex_to_lark
from specjax.grammar.runtime import GrammarTables

__all__ = ["GrammarSpec", "GrammarSpecError", "compile_spec"]

KINDS = ("lark", "json_schema", "regex")


class GrammarSpecError(ValueError):
    """A grammar, schema or regex that cannot be used (one line: where, then why)."""


def _one_line(text: str) -> str:
    return " ".join(part.strip() for part in str(text).splitlines() if part.strip())


@dataclasses.dataclass(frozen=True)
class GrammarSpec:
    """A constraint on generated text.

    Attributes:
      kind: "lark" (Lark grammar text), "json_schema" (a JSON Schema as JSON text) or "regex" (Python `re`
        syntax; the whole output must match).
      source: the grammar / schema / regex text.
      origin: where it came from, for messages (a file name or an option); defaults to the kind.
      max_depth: nesting bound of recursive rules (`GrammarOptions.max_depth`): deeper nesting is masked;
        declared structure (a schema's nested properties) is never cut.
      start: start rule (Lark only).
      whitespace: JSON Schema only: "compact" (no whitespace between tokens) or "flexible".
      max_whitespace: JSON Schema, flexible whitespace: at most this many characters per gap.
      strict_objects: JSON Schema only: never generate properties the schema does not list (narrower, sound).
        On by default for generation (as XGrammar): a model asked for a schema's object has no use for extra
        keys, greedy small models loop on them until the length limit, and the "any other key" automaton is
        most of the compile time. False gives the schema's exact language.
      max_repeat: JSON Schema only: at most this many items in arrays without `maxItems` and extra properties
        per object (`JsonSchemaOptions.max_repeat`), so outputs finish; None: unbounded (exact).
      max_digits: JSON Schema only: at most this many digit-only tokens in a row where the grammar could loop
        on digits forever (a number's integer part, fraction or exponent); then the row must leave the run
        (`grammar.digit_guard`, applied in the decode loop: the tables do not grow). With one token per digit
        (Gemma 3, Qwen2.5) 20 keeps every 64-bit integer. None: unbounded (exact), at most 127.
      unknown_formats: JSON Schema only: "refuse" a `format` without an exact grammar, or "ignore" it.
      unenforced: JSON Schema only: keywords (of `json_schema.UNENFORCEABLE`: uniqueItems, oneOf, contains,
        pattern, maxLength, propertyNames) to leave unenforced where they cannot be compiled exactly, instead of
        refusing the schema (`JsonSchemaOptions.unenforced`). Outputs then may break the schema there:
        `violation` checks a text with jsonschema, and the generator fills `Completion.violation`.
      max_states: refuse grammars whose automaton passes this many states (`GrammarOptions.max_states`).
      timeout: compile time limit in seconds of CPU time (`GrammarOptions.timeout`); None: no limit.
      max_ignore: bytes per %ignore'd lexeme (`GrammarOptions.max_ignore`); None: unbounded.
    """

    kind: str
    source: str
    origin: str = ""
    max_depth: int = 3
    start: str = "start"
    whitespace: str = "compact"
    max_whitespace: int = 8
    strict_objects: bool = True
    max_repeat: int | None = 16
    max_digits: int | None = 20
    unknown_formats: str = "refuse"
    unenforced: tuple[str, ...] = ()
    max_states: int = 200_000
    timeout: float | None = 10.0
    max_ignore: int | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise GrammarSpecError(f"grammar kind {self.kind!r} is unknown (one of: {', '.join(KINDS)})")
        if not isinstance(self.max_depth, int) or self.max_depth < 1:
            raise GrammarSpecError(f"grammar max_depth must be a positive integer, got {self.max_depth!r}")
        if self.whitespace not in ("compact", "flexible"):
            raise GrammarSpecError(f"json whitespace must be 'compact' or 'flexible', got {self.whitespace!r}")
        if not isinstance(self.max_whitespace, int) or self.max_whitespace < 1:
            raise GrammarSpecError(f"max_whitespace must be a positive integer, got {self.max_whitespace!r}")
        if self.unknown_formats not in ("refuse", "ignore"):
            raise GrammarSpecError(f"unknown_formats must be 'refuse' or 'ignore', got {self.unknown_formats!r}")
        if self.max_repeat is not None and (not isinstance(self.max_repeat, int) or self.max_repeat < 1):
            raise GrammarSpecError(f"max_repeat must be a positive integer or None, got {self.max_repeat!r}")
        if self.max_digits is not None and (not isinstance(self.max_digits, int)
                                            or not 1 <= self.max_digits <= MAX_DIGIT_BOUND):
            raise GrammarSpecError(f"max_digits must be an integer within 1..{MAX_DIGIT_BOUND} or None, "
                                   f"got {self.max_digits!r}")
        if not isinstance(self.unenforced, tuple):
            raise GrammarSpecError(f"unenforced must be a tuple of JSON Schema keywords, got {self.unenforced!r}")
        if bad := [k for k in self.unenforced if k not in UNENFORCEABLE]:
            raise GrammarSpecError(f"json unenforced: {bad[0]!r} cannot be left unenforced "
                                   f"(only {', '.join(UNENFORCEABLE)})")
        if not isinstance(self.strict_objects, bool):
            raise GrammarSpecError(f"strict_objects must be true or false, got {self.strict_objects!r}")
        try:
            self.options()
        except GrammarError as e:  # max_states, timeout, max_ignore: checked where they are defined
            raise GrammarSpecError(str(e)) from None

    @classmethod
    def from_file(cls, kind: str, path: str, **options) -> GrammarSpec:
        """Reads a .lark grammar or a JSON Schema file (UTF-8)."""
        p = Path(path).expanduser()
        if not p.is_file():
            option = "grammar" if kind == "lark" else kind  # as the CLI option is named
            raise GrammarSpecError(f"{option}={path!r}: no such file")
        return cls(kind=kind, source=p.read_text(encoding="utf-8"), origin=str(p), **options)

    @property
    def where(self) -> str:
        return self.origin or self.kind

    def lark_text(self) -> str:
        """The Lark grammar of this spec (start rule `start` for schemas and regexes)."""
        return _front_end(self)[0]

    def unenforced_at(self) -> tuple[str, ...]:
        """Where `unenforced` dropped a keyword ("uniqueItems at #/properties/tags"); empty for an exact grammar."""
        return _front_end(self)[1]

    def violation(self, text: str) -> str | None:
        """Why ``text`` breaks the schema (jsonschema's first error), or None. Only JSON Schema specs with
        keywords left unenforced can produce such text; any other spec returns None without checking."""
        if not self.unenforced_at():
            return None
        try:
            instance = json.loads(text)
        except json.JSONDecodeError as e:
            return f"not JSON ({e.msg} at character {e.pos})"
        import jsonschema  # a dependency, imported only where outputs need checking

        error = jsonschema.exceptions.best_match(_validator(self).iter_errors(instance))
        if error is None:
            return None
        where = "/".join(str(p) for p in error.absolute_path)
        return f"at /{where}: {_one_line(error.message)[:200]}"

    @property
    def digit_bound(self) -> int | None:
        """The decode loop's bound on digit runs for this spec (`max_digits`; JSON Schema only)."""
        return self.max_digits if self.kind == "json_schema" else None

    def json_schema_options(self) -> JsonSchemaOptions:
        """How this spec's JSON Schema is written as a grammar (the JSON Schema front-end's options)."""
        return JsonSchemaOptions(whitespace=self.whitespace, max_whitespace=self.max_whitespace,
                                 strict_objects=self.strict_objects, unknown_formats=self.unknown_formats,
                                 max_repeat=self.max_repeat, unenforced=self.unenforced)

    def options(self, eos_ids: tuple[int, ...] | None = None) -> GrammarOptions:
        return GrammarOptions(start=self.start if self.kind == "lark" else "start", max_depth=self.max_depth,
                              max_states=self.max_states, timeout=self.timeout, max_ignore=self.max_ignore,
                              eos_ids=eos_ids)


@functools.lru_cache(maxsize=64)
def _validator(spec: GrammarSpec):
    """The schema's jsonschema validator (its own draft), built once per spec rather than once per output."""
    import jsonschema

    schema = json.loads(spec.source)
    return jsonschema.validators.validator_for(schema)(schema)


@functools.lru_cache(maxsize=64)
def _front_end(spec: GrammarSpec) -> tuple[str, tuple[str, ...]]:
    """(Lark text, where keywords were left unenforced) of a spec: the JSON Schema front-end runs once per spec."""
    try:
        if spec.kind == "lark":
            return spec.source, ()
        if spec.kind == "regex":
            return regex_to_lark(spec.source), ()
        try:
            schema = json.loads(spec.source)
        except json.JSONDecodeError as e:
            raise GrammarSpecError(f"{spec.where}:{e.lineno}:{e.colno}: invalid JSON ({e.msg})") from None
        if not isinstance(schema, dict | bool):
            raise GrammarSpecError(f"{spec.where}: a JSON Schema must be an object or a boolean, "
                                   f"got {type(schema).__name__}")
        with deadline(spec.timeout):  # the compile time limit covers the schema front-end too
            return json_schema_grammar(schema, spec.json_schema_options())
    except (SchemaError, RegexError, GrammarError) as e:
        raise GrammarSpecError(f"{spec.where}: {_one_line(e)}") from None


def compile_spec(spec: GrammarSpec, tokenizer, eos_ids: tuple[int, ...] | None = None) -> GrammarTables:
    """Compiles a spec against a tokenizer's vocabulary (the compiler caches the tables on disk).

    Raises:
      GrammarSpecError: the grammar, schema or regex is invalid, unsupported, empty or too large.
    """
    text = spec.lark_text()
    try:
        return compile_grammar(text, tokenizer, spec.options(eos_ids))
    except GrammarError as e:
        raise GrammarSpecError(f"{spec.where}: {_one_line(e)}") from None
