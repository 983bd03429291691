"""Which grammar a request's output must match, from the fields each API names it by:

- OpenAI: `response_format` {"type": "json_object"} or {"type": "json_schema",
  "json_schema": {"name", "schema", "strict"}} ("text": none);
- vLLM: `guided_json`, `guided_regex`, `guided_choice`, `guided_grammar`, and
  `structured_outputs` {"json" | "regex" | "choice" | "grammar"};
- SGLang: `regex`, `ebnf` and `json_schema` beside the OpenAI fields, and the same
  three keys in /generate's `sampling_params`.

At most one per request; a field this server does not implement (vLLM's
structural tags, say) is refused by name, never ignored.
"""

from __future__ import annotations

from typing import Any, Optional

from rvascend.engine import Grammar
from rvascend.server.protocol import UnsupportedField, load_json


def _json_schema(value: Any, field: str) -> Grammar:
    # JSON text escapes the request's nesting check (protocol.check_nesting) until it
    # is parsed, and the parser itself recurses: parsed here, within the same limit.
    return Grammar.json_schema(load_json(field, value) if isinstance(value, str) else value)


def _from(kind: str, value: Any, field: str) -> Grammar:
    if kind == "json_schema":
        return _json_schema(value, field)
    if kind == "choice":
        if not isinstance(value, list):
            raise UnsupportedField(f"'{field}' must be a list of strings")
        return Grammar.choice(value)
    if not isinstance(value, str):
        raise UnsupportedField(f"'{field}' must be a string")
    return Grammar(kind, value)


def _response_format(fmt: Any) -> Optional[Grammar]:
    if fmt in (None, {}):
        return None
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return Grammar("json_object")
    if kind == "json_schema":
        spec = fmt.get("json_schema")
        if not isinstance(spec, dict) or "schema" not in spec:
            raise UnsupportedField("response_format.json_schema needs a 'schema'")
        if spec.get("strict") not in (None, True, False):
            raise UnsupportedField("response_format.json_schema.strict must be a boolean")
        # strict or not, the output follows the schema: this server has one mode, the strict one.
        return _json_schema(spec["schema"], "response_format.json_schema.schema")
    raise UnsupportedField(f"response_format type {kind!r} is not supported (text, json_object, json_schema)")


# vLLM's structured_outputs keys -> grammar kinds.
_STRUCTURED_OUTPUTS = {"json": "json_schema", "regex": "regex", "choice": "choice", "grammar": "ebnf"}
# Request fields (vLLM's guided_*, SGLang's) -> grammar kinds.
_FIELDS = {"guided_json": "json_schema", "guided_regex": "regex", "guided_choice": "choice",
           "guided_grammar": "ebnf", "json_schema": "json_schema", "regex": "regex", "ebnf": "ebnf"}


def _one(found: list[tuple[str, Grammar]]) -> Optional[Grammar]:
    if len(found) > 1:
        raise UnsupportedField("give one output constraint, not " + " and ".join(f"'{name}'" for name, _ in found))
    return found[0][1] if found else None


def request_grammar(extra: dict[str, Any]) -> Optional[Grammar]:
    """The grammar of an OpenAI-style request (its fields beyond the schema's)."""
    found = []
    grammar = _response_format(extra.get("response_format"))
    if grammar is not None:
        found.append(("response_format", grammar))
    for field, kind in _FIELDS.items():
        if extra.get(field) is not None:
            found.append((field, _from(kind, extra[field], field)))
    outputs = extra.get("structured_outputs")
    if outputs is not None:
        if not isinstance(outputs, dict):
            raise UnsupportedField("'structured_outputs' must be an object")
        for key, value in outputs.items():
            if value is None:
                continue
            if key not in _STRUCTURED_OUTPUTS:
                raise UnsupportedField(f"structured_outputs.{key} is not supported by this server "
                                       f"({', '.join(_STRUCTURED_OUTPUTS)})")
            found.append((f"structured_outputs.{key}", _from(_STRUCTURED_OUTPUTS[key], value,
                                                              f"structured_outputs.{key}")))
    return _one(found)


SGLANG_SAMPLING_KEYS = ("json_schema", "regex", "ebnf")


def sampling_params_grammar(sampling_params: dict[str, Any]) -> Optional[Grammar]:
    """The grammar of SGLang's /generate sampling_params (json_schema as JSON text)."""
    found = []
    for key in SGLANG_SAMPLING_KEYS:
        value = sampling_params.get(key)
        if value is not None:
            found.append((f"sampling_params.{key}", _from(_FIELDS[key], value, f"sampling_params.{key}")))
    return _one(found)

