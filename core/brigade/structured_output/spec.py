"""GrammarSpec: one request's output constraint in a canonical, hashable form, and its xgrammar Grammar.

The same conversion serves two processes: the front end builds the
Grammar once to refuse a bad schema, regex or EBNF with a 400 before anything is queued (cheap: no
tokenizer is involved), and the EngineCore builds it again in a worker thread and compiles it against
the model's vocabulary. The canonical text is the compile cache key, so identical constraints sent with
different key order or whitespace compile once.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from brigade.sampling_params import InvalidParamError, StructuredOutputsParams

__all__ = ["GrammarSpec", "validate_structured_outputs", "MAX_SPEC_CHARS"]

# A constraint this large is far beyond any real schema; refusing it bounds front-end and compile work.
MAX_SPEC_CHARS = 256 * 1024
# Whitespace policy of JSON grammars. Free whitespace (xgrammar's any_whitespace) lets small models loop
# on blanks until max_tokens and so emit truncated JSON; one canonical layout (", " and ": ") cannot.
_JSON_ANY_WHITESPACE = False
# xgrammar prefixes C++ errors with "[hh:mm:ss] /path/file.cc:123: "; users need only the message.
_XGRAMMAR_PREFIX = re.compile(r"^\[[0-9:]+\]\s+\S+:\d+:\s*")


def _clean_error(exc: BaseException) -> str:
    return _XGRAMMAR_PREFIX.sub("", str(exc).strip()).strip() or type(exc).__name__


def _ebnf_literal(text: str) -> str:
    """``text`` as an EBNF string literal (JSON escaping is a subset xgrammar reads)."""
    return json.dumps(text, ensure_ascii=False)


@dataclass(frozen=True, slots=True)
class GrammarSpec:
    """A constraint in canonical form.

    Attributes:
        kind: "json" (a JSON schema), "json_object" (any JSON object), "regex", "choice" or "grammar" (EBNF).
        text: canonical source: the schema as sorted compact JSON, the regex, the EBNF, or the choices
            as a JSON list; "" for json_object.
    """

    kind: str
    text: str

    @classmethod
    def from_params(cls, params: StructuredOutputsParams, param: str = "structured_outputs") -> GrammarSpec:
        """Canonicalize ``params``.

        Raises:
            InvalidParamError: not exactly one constraint, a schema that is not JSON, empty choices, or a
                source over MAX_SPEC_CHARS; ``param`` names the request field.
        """
        try:
            kind = params.kind()
        except InvalidParamError as exc:
            raise InvalidParamError(str(exc), param=param) from None
        if kind == "json_object" or (kind == "json" and params.json is True):
            spec = cls("json_object", "")
        elif kind == "json":
            spec = cls("json", _canonical_schema(params.json, param))
        elif kind == "choice":
            choices = params.choice
            if not choices or not all(isinstance(c, str) and c for c in choices):
                raise InvalidParamError("structured_outputs.choice must be a non-empty list of non-empty strings",
                                        param=param)
            spec = cls("choice", json.dumps(list(dict.fromkeys(choices)), ensure_ascii=False))
        else:
            source = params.regex if kind == "regex" else params.grammar
            if not isinstance(source, str) or not source:
                raise InvalidParamError(f"structured_outputs.{kind} must be a non-empty string", param=param)
            spec = cls(kind, source)
        if len(spec.text) > MAX_SPEC_CHARS:
            raise InvalidParamError(f"the {kind} constraint is {len(spec.text)} characters; the limit is "
                                    f"{MAX_SPEC_CHARS}", param=param)
        return spec

    def build_grammar(self):
        """The xgrammar Grammar of this constraint (not yet compiled to a vocabulary).

        Raises:
            ValueError: xgrammar rejects the schema, regex or grammar (the message says why).
        """
        import xgrammar as xgr

        try:
            if self.kind == "json_object":
                return xgr.Grammar.from_json_schema('{"type": "object"}', strict_mode=False,
                                                    any_whitespace=_JSON_ANY_WHITESPACE)
            if self.kind == "json":
                return xgr.Grammar.from_json_schema(self.text, strict_mode=True, any_whitespace=_JSON_ANY_WHITESPACE)
            if self.kind == "regex":
                return xgr.Grammar.from_regex(self.text)
            if self.kind == "choice":
                return xgr.Grammar.from_ebnf("root ::= " + " | ".join(_ebnf_literal(c) for c in json.loads(self.text)))
            return xgr.Grammar.from_ebnf(self.text)
        except (RuntimeError, ValueError, TypeError) as exc:  # xgrammar reports parse errors as RuntimeError
            raise ValueError(_clean_error(exc)) from None


def _canonical_schema(schema: Any, param: str) -> str:
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as exc:
            raise InvalidParamError(f"the JSON schema is not valid JSON: {exc}", param=param) from None
    if not isinstance(schema, dict):
        raise InvalidParamError(f"a JSON schema must be an object, got {type(schema).__name__}", param=param)
    return json.dumps(schema, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def validate_structured_outputs(params: StructuredOutputsParams, param: str = "structured_outputs") -> GrammarSpec:
    """Check a constraint the way the engine will compile it, before the request is queued.

    Builds the xgrammar Grammar (schema, regex or EBNF parse) without a tokenizer: milliseconds for
    real schemas, and it catches every error the engine's compile would hit on the grammar itself.

    Returns: the canonical spec.
    Raises:
        InvalidParamError: ``param`` names the request field (structured_outputs, response_format, tools).
    """
    spec = GrammarSpec.from_params(params, param)
    try:
        spec.build_grammar()
    except ValueError as exc:
        raise InvalidParamError(f"invalid {spec.kind.replace('_', ' ')} constraint: {exc}", param=param) from None
    return spec
