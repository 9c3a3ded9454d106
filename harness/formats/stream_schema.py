"""Shapes and bounds of a stream: its JSON Schema (``harness/formats/schemas/stream.schema.json``)
and the errors it finds, one line each, naming the field and the rule in the stream's
own terms.  Rules across fields are code, in :mod:`harness.formats.stream`."""

from __future__ import annotations

import functools
import json
import math
from typing import Any

from harness.formats.paths import STREAM_SCHEMA


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


@functools.cache
def schema() -> dict[str, Any]:
    return json.loads(STREAM_SCHEMA.read_text())


@functools.cache
def _validator():
    import jsonschema
    base = jsonschema.Draft202012Validator
    # JSON Schema's "integer" takes 16.0; a stream must say 16.
    checker = base.TYPE_CHECKER.redefine("integer", lambda _checker, value: _is_int(value))
    standard_items = base.VALIDATORS["items"]

    def items(validator, subschema, instance, owner):
        # A list of bounded integers (a token list) is checked in one pass; only a
        # list with a bad item goes through the item-by-item validation that names it.
        if isinstance(instance, list) and _int_range_only(subschema):
            lo, hi = subschema.get("minimum", -math.inf), subschema.get("maximum", math.inf)
            if all(type(x) is int and lo <= x <= hi for x in instance):
                return
        yield from standard_items(validator, subschema, instance, owner)

    cls = jsonschema.validators.extend(base, validators={"items": items}, type_checker=checker)
    return cls(schema())


def _int_range_only(subschema: Any) -> bool:
    if not isinstance(subschema, dict) or subschema.get("type") != "integer":
        return False
    return all(k in ("type", "minimum", "maximum", "description") or k.startswith("x-")
               for k in subschema)


_TYPE_WORDS = {"integer": "an integer", "boolean": "true or false", "string": "a string",
               "object": "a JSON object", "array": "a list", "null": "null"}


def shape_errors(data: Any) -> list[str]:
    """One line per field that breaks a schema rule (field path, then the rule).

    A field that breaks several rules reports the first: its type if that is wrong.
    """
    found = sorted(_validator().iter_errors(data), key=lambda e: e.validator != "type")
    lines: dict[str, str] = {}
    for error in found:
        for line in _describe(error, data):
            lines.setdefault(line.split(": ", 1)[0], line)
    return sorted(lines.values(), key=_document_order(data))


def _document_order(data: Any):
    """Sort key: top-level fields, then config, then requests by index, as a reader meets them."""
    order = {"name": 0, "description": 1, "config": 2, "reset_prefix_cache_steps": 3, "requests": 4}

    def key(line: str):
        head = line.split(": ", 1)[0]
        field = head.split(".", 1)[0].split("[", 1)[0]
        index = head[len("requests["):].split("]", 1)[0] if head.startswith("requests[") else ""
        return (order.get(field, -1), int(index) if index.isdigit() else -1, head)
    return key


def _describe(error, data: Any) -> list[str]:
    path = list(error.absolute_path)
    node = error.schema if isinstance(error.schema, dict) else {}
    if node.get("x-report-at-parent") and path:
        path = path[:-1]
    keyword, value = error.validator, error.validator_value
    custom = node.get("x-messages", {}).get(keyword)
    if keyword == "additionalProperties":
        allowed = node.get("properties", {})
        extra = sorted(set(error.instance) - set(allowed))
        return [f"{_where(path + [k], data)}: unknown field (allowed: {', '.join(sorted(allowed))})"
                for k in extra]
    if keyword == "required":
        missing = [k for k in value if k not in error.instance]
        return [f"{_where(path + [k], data)}: required field is missing" for k in missing]
    if custom:
        rule = custom
    elif keyword == "type":
        kinds = value if isinstance(value, list) else [value]
        rule = "must be " + " or ".join(_TYPE_WORDS[k] for k in kinds)
    elif keyword == "enum":
        rule = "must be " + " or ".join(json.dumps(v) for v in value)
    elif keyword == "minimum":
        rule = f"must be >= {value}"
    elif keyword == "maximum":
        rule = f"must be <= {value:,}"
    elif keyword == "minItems":
        rule = f"must hold at least {value} item(s)"
    elif keyword == "maxItems":
        rule = f"must hold at most {value:,} item(s)"
    elif keyword == "maxLength":
        rule = f"must be at most {value:,} characters"
    else:
        rule = error.message
    return [f"{_where(path, data)}: {rule}"]


def _where(path: list, data: Any) -> str:
    """``requests[0] (a).prompt``: the field path, with the request's id when it has one."""
    if not path:
        return "stream"
    out = ""
    for i, part in enumerate(path):
        if isinstance(part, int):
            out += f"[{part}]"
            if i == 1 and path[0] == "requests" and len(path) > 2:
                rid = _request_id(data, part)
                if rid is not None:
                    out += f" ({rid})"
        else:
            out += f".{part}" if out else str(part)
    return out


def _request_id(data: Any, index: int) -> str | None:
    try:
        rid = data["requests"][index]["id"]
    except (KeyError, IndexError, TypeError):
        return None
    return rid if isinstance(rid, str) and rid else None
