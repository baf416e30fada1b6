"""JSON Schema → Lark grammar front-end.

`json_schema_to_lark(schema)` returns Lark text (start rule `start`) whose language is a subset of
the JSON texts valid under the schema, and contains the canonical text of every valid value
(see docs/grammar-json-schema.md for the exact policy):

* output form: compact by default (no whitespace), object properties in the order of the
  schema's `properties` (optional ones may be skipped; extra properties, where allowed, after
  them), strings in json.dumps(ensure_ascii=False) form, numbers without exponent when bounded;
* what cannot be compiled exactly raises `SchemaError` naming the keyword and its JSON pointer;
* annotation keywords (`ANNOTATIONS`) and keywords no draft defines are ignored, as validators do.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from urllib.parse import unquote

from specjax.grammar import _charsets as cs
from specjax.grammar import _deadline
from specjax.grammar import _json_conditions as conditions
from specjax.grammar import _json_schema_logic as logic
from specjax.grammar._ebnf_productive import productive
from specjax.grammar._json_merge import merge
from specjax.grammar._json_schema_logic import EmptySchemaError, SchemaError
from specjax.grammar._json_schema_types import TypeEmitter
from specjax.grammar._json_text import NUMBER_REGEX

__all__ = ["UNENFORCEABLE", "JsonSchemaOptions", "SchemaError", "json_schema_grammar", "json_schema_to_lark"]

_RULE_NAME = re.compile(r"\b(?:s_\w+|any_value)\b")  # names the front-end gives rules (_new_name, any_value)
_MAX_NESTING = 60  # nested schema rules; Python's stack allows ~90
_DRAFTS = (("draft-03", 3), ("draft-04", 4), ("draft-06", 6), ("draft-07", 7), ("2019-09", 2019), ("2020-12", 2020))
# Keywords `JsonSchemaOptions.unenforced` may leave unenforced where they cannot be compiled exactly.
UNENFORCEABLE = ("uniqueItems", "oneOf", "contains", "pattern", "maxLength", "propertyNames")
_CONTAINS = ("contains", "minContains", "maxContains")
_REFUSAL_WHY = {
    "propertyNames": "key constraints are not compiled",
    "contains": "counting matching items is not compiled",
    "uniqueItems": "item uniqueness is not context-free",
}


def _option_keyword(keyword: str) -> str:
    """The `unenforced` entry covering a refused keyword (minContains and maxContains go with contains)."""
    return "contains" if keyword in _CONTAINS else keyword


@dataclass(frozen=True)
class JsonSchemaOptions:
    """How the grammar writes JSON.

    Attributes:
      whitespace: "compact" (none, the default: shortest output, and no whitespace loop for a model
        to fall into) or "flexible" (JSON whitespace allowed between tokens).
      max_whitespace: "flexible" only: at most this many whitespace characters per gap; None means
        unbounded, which lets a model emit whitespace forever and is not recommended.
      unknown_formats: "refuse" (default) or "ignore" (formats without a regex here are then not
        enforced, as in a validator without format assertion).
      max_repeat: at most this many items in an array without `maxItems` (or `minItems` items if more) and
        extra properties per object; None: unbounded (exact). A bound makes constrained generation finish where
        a model would loop on a free-form repetition; narrower than the schema, still sound. Generic JSON
        values (`{}`) stay unbounded: a counter per nesting level would multiply the automaton; so do arrays
        whose items may hold one (the counter copies the item's automaton once per position).
      strict_objects: True: never generate properties outside `properties` (+ required), even
        where the schema allows them (narrower than the schema, still sound; xgrammar's default).
      unenforced: keywords of `UNENFORCEABLE` to leave unenforced *where* they cannot be compiled exactly, instead
        of refusing the schema: there the language is wider than the schema (uniqueItems, contains,
        propertyNames, a pattern the regex front-end refuses, a maxLength too long to count are dropped; oneOf
        branches that cannot be made disjoint are read as anyOf). Everywhere else they are compiled exactly.
        `json_schema_grammar` says where a keyword was dropped, so a caller can check outputs (the decoder does,
        with jsonschema). Off by default: XGrammar approximates these silently, llguidance refuses them.
    """

    whitespace: str = "compact"
    max_whitespace: int | None = 8
    unknown_formats: str = "refuse"
    strict_objects: bool = False
    max_repeat: int | None = None
    unenforced: tuple[str, ...] = ()

    def __post_init__(self):
        if self.whitespace not in ("compact", "flexible"):
            raise ValueError(f"whitespace must be 'compact' or 'flexible', got {self.whitespace!r}")
        if self.unknown_formats not in ("refuse", "ignore"):
            raise ValueError(f"unknown_formats must be 'refuse' or 'ignore', got {self.unknown_formats!r}")
        if self.max_repeat is not None and (not isinstance(self.max_repeat, int) or self.max_repeat < 1):
            raise ValueError(f"max_repeat must be >= 1 or None, got {self.max_repeat}")
        if self.max_whitespace is not None and self.max_whitespace < 1:
            raise ValueError(f"max_whitespace must be >= 1 or None, got {self.max_whitespace}")
        if bad := [k for k in self.unenforced if k not in UNENFORCEABLE]:
            raise ValueError(f"unenforced: {bad[0]!r} cannot be left unenforced (only {', '.join(UNENFORCEABLE)})")


def json_schema_to_lark(schema: dict | bool, options: JsonSchemaOptions | None = None) -> str:
    """Compile a JSON Schema (a dict, or True/False) to Lark grammar text with start rule `start`.

    Raises:
      SchemaError: a keyword that cannot be compiled exactly (message: keyword, JSON pointer, reason).
    """
    return json_schema_grammar(schema, options)[0]


def json_schema_grammar(schema: dict | bool, options: JsonSchemaOptions | None = None) -> tuple[str, tuple[str, ...]]:
    """:func:`json_schema_to_lark`, and where keywords were left unenforced (``"uniqueItems at #/properties/a"``).

    The second part is empty unless ``options.unenforced`` names a keyword that could not be compiled exactly
    somewhere; then the grammar accepts more than the schema there, and outputs need checking.

    Raises:
      SchemaError: as :func:`json_schema_to_lark`; a keyword that ``unenforced`` could drop says so.
    """
    compiler = _Compiler(schema, options or JsonSchemaOptions())
    try:
        text = compiler.compile()
    except SchemaError as e:
        kw = _option_keyword(e.keyword)
        if type(e) is not SchemaError or kw not in UNENFORCEABLE:
            raise
        raise SchemaError(e.keyword, e.path, f"{e.why}; unenforced=('{kw}',) leaves it unenforced where it cannot "
                                             f"be compiled, outputs then checked after generation "
                                             f"(json_unenforced=[{kw}] on the command line)") from None
    return text, tuple(dict.fromkeys(compiler.relaxed))


def draft_of(schema) -> int:
    """Draft year/number from `$schema` (unknown or absent: 2020-12, as the jsonschema package does)."""
    uri = schema.get("$schema", "") if isinstance(schema, dict) else ""
    uri = uri if isinstance(uri, str) else ""
    if "json-schema.org" in uri:
        for tag, draft in _DRAFTS:
            if tag in uri:
                return draft
    return 2020


class _Compiler:
    """Walks the schema, writing one Lark rule per schema location (memoized: $ref cycles recurse)."""

    def __init__(self, root, options: JsonSchemaOptions):
        self.root, self.options = root, options
        self.draft = draft_of(root)
        if self.draft == 3:
            raise SchemaError("$schema", "#", "draft-03 is not supported (drafts 4, 6, 7, 2019-09, 2020-12 are)")
        self.rules: dict[str, str] = {}
        self.names: dict[str, str] = {}
        self.suffix: dict[str, int] = {}
        self.depth = 0
        ws = options.whitespace == "flexible"
        n = options.max_whitespace
        self.ws = (" WS?" if ws else "")
        self.ws_terminal = (f"WS: /[ \\t\\n\\r]{{1,{n}}}/" if n else "WS: /[ \\t\\n\\r]+/") if ws else ""
        self.types = TypeEmitter(self)
        self.has_refs = '"$ref"' in json.dumps(root)
        # Rules that keep max_repeat off an array whose items use them: generic JSON and the arrays it already
        # counts (a counter copies the item's automaton per position; see TypeEmitter.array).
        self.count_blockers: set[str] = {"any_value"}
        self.relaxed: list[str] = []  # "keyword at path" where JsonSchemaOptions.unenforced dropped a keyword

    def leave_unenforced(self, error: SchemaError) -> bool:
        """Whether the keyword ``error`` refuses may be dropped where it occurs (``JsonSchemaOptions.unenforced``);
        if so, records where."""
        if type(error) is not SchemaError or _option_keyword(error.keyword) not in self.options.unenforced:
            return False
        self.relaxed.append(f"{error.keyword} at {error.path}")
        return True

    # ------------------------------------------------------------------------------------- output
    def compile(self) -> str:
        top = self.rule(self.root, "#")
        lines = [f"start:{self.ws} {top}{self.ws}"]
        lines += [f"{name}: {body}" for name, body in self.rules.items()]
        if self.ws_terminal:
            lines.append(self.ws_terminal)
        text = "\n".join(lines) + "\n"
        if "start" not in productive({"start": lines[0][len("start:"):], **self.rules}):
            if self.has_refs:
                raise EmptySchemaError("$ref", "#", "every instance would have to recurse forever through required "
                                                    "references (empty language)")
            raise EmptySchemaError("allOf", "#", "the case analysis of not/if/oneOf closed a cycle without a value "
                                                 "(empty grammar); not compiled")
        return text

    def rule(self, node, path: str, key: str | None = None) -> str:
        """Name of the rule for the schema at `path` (created on first use; cycles refer back to it).

        `key` (default: `path`) identifies the schema for memoization when a node is derived from
        the one at `path` (an anyOf branch merged with its siblings).
        """
        key = path if key is None else key
        if key in self.names:
            return self.names[key]
        _deadline.check()  # a caller's compile time limit (GrammarSpec wraps the front-end in it)
        if self.depth > _MAX_NESTING:
            raise SchemaError("$ref", path, f"schema nesting deeper than {_MAX_NESTING} (a recursion through "
                                            "allOf/$ref merging that never repeats itself?)")
        if node is True or node == {}:
            return self.any_value()
        n_rules, n_names = len(self.rules), len(self.names)  # both dicts only grow, in insertion order
        name = self.names[key] = self._new_name(path)
        self.rules[name] = ""  # reserve: a $ref cycle reaching this path uses the name
        self.depth += 1
        try:
            self.rules[name] = self.expr(node, path)
        except SchemaError:  # roll back rules made meanwhile: they may refer to this one
            for added in list(self.rules)[n_rules:]:
                del self.rules[added]
            for added in list(self.names)[n_names:]:
                del self.names[added]
            raise
        finally:
            self.depth -= 1
        return name

    def rule_text(self, path: str, body: str) -> str:
        """A new helper rule with a given body (object member chains)."""
        name = self._new_name(path)
        self.rules[name] = body
        return name

    def _new_name(self, path: str) -> str:
        base = "s_" + re.sub(r"[^a-z0-9]+", "_", path.lower()).strip("_")
        base = base if base != "s_" else "s_root"
        k = self.suffix.get(base, 0)  # the next suffix to try: a scan from 1 made long rule chains quadratic
        name = base if k == 0 else f"{base}_{k}"
        while name in self.rules:
            k += 1
            name = f"{base}_{k}"
        self.suffix[base] = k + 1
        return name

    def reaches(self, name: str | None, targets: set[str]) -> bool:
        """Whether the rule ``name`` is one of ``targets`` or uses one, directly or through other rules."""
        seen, todo = set(), [name] if name else []
        while todo:
            rule = todo.pop()
            if rule in targets:
                return True
            if rule not in seen:
                seen.add(rule)
                todo += [r for r in _RULE_NAME.findall(self.rules.get(rule, "")) if r not in seen]
        return False

    def any_value(self) -> str:
        """Rules for an unconstrained JSON value (schema `true` or `{}`)."""
        if "any_value" not in self.rules:
            w, char = self.ws, cs.json_class_text(cs.ANY)
            string, number = f"/{cs.QUOTE}{char}*{cs.QUOTE}/", f"/{NUMBER_REGEX}/"
            self.rules["any_value"] = f'any_object | any_array | {string} | {number} | "true" | "false" | "null"'
            self.rules["any_object"] = (f'"{{"{w} (any_pair ({w} ","{w} any_pair)*)?{w} "}}"')
            self.rules["any_pair"] = f'{string}{w} ":"{w} any_value'
            self.rules["any_array"] = f'"["{w} (any_value ({w} ","{w} any_value)*)?{w} "]"'
        return "any_value"

    # ----------------------------------------------------------------------------------- schemas
    def expr(self, node, path: str) -> str:
        """Lark expression for the schema `node` at `path`."""
        if node is True or node == {}:
            return self.any_value()
        if node is False:
            raise EmptySchemaError("false", path, "schema false matches nothing (empty language)")
        if not isinstance(node, dict):
            raise SchemaError("(schema)", path, f"a schema must be an object or boolean, got {type(node).__name__}")
        if "$ref" in node and (self.draft <= 7 or all(k in logic.ANNOTATIONS for k in node if k != "$ref")):
            # A plain reference (draft <= 7 ignores its siblings): refer to the target's own rule, so
            # recursive schemas become recursive rules.
            target, target_path = self.resolve(node["$ref"], path)
            if target is False:
                raise EmptySchemaError("$ref", path, f"target {node['$ref']!r} is the false schema (empty language)")
            return self.rule(target, target_path)
        flat, path = self.flatten(node, path)
        if flat is not node and ("allOf" in node or "$ref" in node):
            # A merged schema: memoized by content, so a merge that recurs through its own
            # properties (allOf [{$ref: self}, …]) becomes a recursive rule instead of unrolling.
            return self.rule(flat, path, key="merged:" + logic.canonical(flat))
        node = flat
        if "if" in node or "then" in node or "else" in node:  # by cases (see _json_conditions)
            new = conditions.conditional(node, path, self.flatten, self.draft)
            return self.rule(new, path, key="if:" + logic.canonical(new))
        if (new := conditions.split_dependencies(node, path, self.draft)) is not None:
            return self.rule(new, path, key="deps:" + logic.canonical(new))
        if (new := conditions.split_not(node, path, self.flatten, self.draft)) is not None:
            return self.rule(new, path, key="not:" + logic.canonical(new))
        for kw in ("anyOf", "oneOf"):
            if kw in node:
                return self.alternatives(node, kw, path)
        return self.types.typed(node, path)

    def flatten(self, node: dict, path: str, depth: int = 0) -> tuple[dict, str]:
        """Resolve $ref and allOf into one schema dict (refusing what does not merge exactly)."""
        if depth > 32:
            raise SchemaError("$ref", path, "$ref/allOf chain deeper than 32 without structure (cyclic?)")
        self.refuse_unsupported(node, path)
        if "$ref" in node:
            target, target_path = self.resolve(node["$ref"], path)
            siblings = {k: v for k, v in node.items() if k != "$ref"}
            if self.draft <= 7 or all(k in logic.ANNOTATIONS for k in siblings):
                if target is False:
                    raise EmptySchemaError("$ref", path, f"target {node['$ref']!r} is the false schema "
                                                         "(empty language)")
                if not isinstance(target, dict):
                    return {}, target_path
                return self.flatten(target, target_path, depth + 1)
            node = {"allOf": [target, siblings]}
        if "allOf" in node:
            merged = {k: v for k, v in node.items() if k != "allOf"}
            for i, branch in enumerate(node["allOf"]):
                if branch is True:
                    continue
                if not isinstance(branch, dict):
                    raise EmptySchemaError("allOf", f"{path}/allOf/{i}", "a false branch matches nothing "
                                                                         "(empty language)")
                flat, _ = self.flatten(branch, f"{path}/allOf/{i}", depth + 1)
                merged = merge(merged, flat, path)
            return self.flatten(merged, path, depth + 1) if "allOf" in merged or "$ref" in merged else (merged, path)
        return node, path

    def refuse_unsupported(self, node: dict, path: str) -> None:
        for kw in node:
            if kw in logic.REFUSED:
                error = SchemaError(kw, path, _REFUSAL_WHY.get(kw, "not supported by the grammar front-end"))
                if kw in _CONTAINS and self.leave_unenforced(error):
                    continue  # the array compiles without it (typed() reads only the keywords it compiles)
                raise error
            if kw == "$id" and path != "#" and isinstance(node[kw], str) and self.has_refs:
                raise SchemaError("$id", path, "a nested $id changes how $ref resolves; not supported")

    def resolve(self, ref, path: str):
        """Target schema and JSON pointer of a local `$ref`."""
        if not isinstance(ref, str) or not ref.startswith("#") or (len(ref) > 1 and ref[1] != "/"):
            raise SchemaError("$ref", path, f"only local JSON-pointer references (#/...) are supported, got {ref!r}")
        node = self.root
        for part in ref[2:].split("/") if len(ref) > 1 else []:
            part = unquote(part).replace("~1", "/").replace("~0", "~")
            try:
                node = node[int(part)] if isinstance(node, list) else node[part]
            except (KeyError, IndexError, ValueError, TypeError):
                raise SchemaError("$ref", path, f"target {ref!r} does not exist") from None
        return node, "#" + ref[1:]

    def exclusive(self, flats: list, path: str) -> list:
        """oneOf branches as disjoint pieces: a branch that may overlap others becomes ``allOf [Bᵢ, ¬Bⱼ…]``, the
        complements by case analysis (``_json_conditions.negate``), one piece per combination (up to 64)."""
        out = []
        for i, (flat, fpath, _, _) in enumerate(flats):
            overlap = [j for j in range(len(flats)) if j != i and not logic.disjoint(flat, flats[j][0], path)]
            if not overlap:
                out.append(flats[i])
                continue
            try:
                combos = self._exclusion_cases(flats, i, overlap, path)
            except SchemaError as e:
                if self.leave_unenforced(e):
                    out.append(flats[i])  # read as anyOf: an instance may match this branch and another
                    continue
                raise
            for k, combo in enumerate(combos):
                # each piece is its own schema location: the rules of its members are memoized by path
                piece = {"allOf": [flat, *combo]}
                out.append((piece, f"{fpath}/(case {k})", "oneOf:" + logic.canonical(piece), piece))
        return out

    def _exclusion_cases(self, flats: list, i: int, overlap: list[int], path: str) -> list[list]:
        """The combinations of complements (one case of each overlapping branch's complement) for branch i."""
        try:
            negs = [conditions.negate(flats[j][3], f"{path}/oneOf/{j}", self.flatten, draft=self.draft)
                    for j in overlap]
        except SchemaError as e:
            raise SchemaError("oneOf", path, f"branches {i} and {overlap[0]} may both match an instance, and "
                                             f"the complement of a branch is not compiled ({e.why})") from None
        combos = [[]]
        for options in negs:
            combos = [c + [n] for c in combos for n in options]
            if len(combos) > 64:
                raise SchemaError("oneOf", path, f"branch {i} overlaps others in more than 64 cases")
        return combos

    def alternatives(self, node: dict, kw: str, path: str) -> str:
        """anyOf (union) or oneOf (union of provably disjoint branches); siblings distribute into each."""
        branches = node[kw]
        if not isinstance(branches, list) or not branches:
            raise SchemaError(kw, path, "must be a non-empty array of schemas")
        rest = {k: v for k, v in node.items() if k != kw and k not in logic.ANNOTATIONS}
        derived = kw == "anyOf" and "oneOf" in rest
        if derived:  # anyOf [A...] and oneOf B: anyOf [allOf [A, oneOf B]...], each its own (derived) schema
            one = {"oneOf": rest.pop("oneOf")}
            branches = [{"allOf": [b, one]} for b in branches]
        flats, names = [], []
        for i, branch in enumerate(branches):
            bpath = f"{path}/{kw}/{i}"
            if branch is True:
                branch = {}
            elif not isinstance(branch, dict):
                continue  # a false branch contributes nothing to a union
            try:
                flat, fpath = self.flatten(branch, bpath)
                if rest or derived:  # siblings distribute into each branch: a derived schema, memoized by content
                    merged = merge(rest, flat, bpath) if rest else flat
                    flats.append((merged, bpath, "merged:" + logic.canonical(merged), flat))
                else:
                    flats.append((flat, fpath, fpath, flat))
            except EmptySchemaError:
                continue  # a branch nothing satisfies adds nothing to the union
        if kw == "oneOf":
            flats = self.exclusive(flats, path)
        if not flats:
            raise EmptySchemaError(kw, path, "no branch can match (empty language)")
        for flat, fpath, key, _ in flats:
            try:
                names.append(self.rule(flat, fpath, key))
            except EmptySchemaError:
                continue  # a branch nothing satisfies adds nothing to the union
        if not names:
            raise EmptySchemaError(kw, path, "no branch can match (empty language)")
        return " | ".join(names)
