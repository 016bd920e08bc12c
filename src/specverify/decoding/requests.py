"""Requests as a user writes them: a prompt, its sampling parameters, seed, budget and optional grammar.

`specverify generate` turns its flags into one `Request` and each line of `--requests FILE.jsonl` into
one more, through `request_from_fields`, so that a single prompt and a batch take one path. Every value
is checked before anything is loaded; an error says where (`line 3`), the field, the rule and the value.

A JSONL line is an object with the fields of `FIELDS`; "prompt" is required and the others default to
the command's flags (--temperature, --seed, --max-tokens, ...), as a serving engine's request falls back
to its server's defaults. At most one of json_schema (an inline schema object, or the path of a file
holding one), regex (a non-empty pattern) and choices (a list of non-empty strings). Blank lines are
skipped.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

from .params import SamplingParams

#: JSONL fields and what each must be.
FIELDS = {
    "prompt": "a non-empty string",
    "temperature": "a number",
    "top_k": "an int",
    "top_p": "a number",
    "min_p": "a number",
    "seed": "an int",
    "max_tokens": "an int >= 1",
    "json_schema": "a JSON schema object or the path of a file holding one",
    "regex": "a non-empty string",
    "choices": "a list of non-empty strings",
}
GRAMMAR_FIELDS = {"json_schema": "json_schema", "regex": "regex", "choices": "choice"}


@dataclass(frozen=True)
class Request:
    """One request. grammar: None, ("json_schema", schema dict), ("regex", pattern) or ("choice", [options]);
    origin: where it came from, to begin its error messages ("line 3"; "" for the command's flags)."""

    prompt: str
    params: SamplingParams = SamplingParams()
    seed: int = 0
    max_tokens: int = 128
    grammar: tuple[str, object] | None = None
    origin: str = ""


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _grammar(field: str, value) -> tuple[str, object]:
    """The grammar setting of a json_schema / regex / choices field value."""
    from .constraints.schema import check_schema, read_schema

    kind = GRAMMAR_FIELDS[field]
    if field == "json_schema":
        if isinstance(value, str) and value:
            return kind, read_schema(value)
        return kind, check_schema(value, "json_schema")
    if field == "regex" and isinstance(value, str) and value:
        return kind, value
    if field == "choices" and isinstance(value, list) and value and all(isinstance(v, str) and v for v in value):
        return kind, list(value)
    raise ValueError(f"{field} must be {FIELDS[field]} (got {value!r:.80})")


def request_from_fields(fields: dict, defaults: Request) -> Request:
    """A Request from JSON fields over defaults (the command's flags). Raises ValueError naming the field,
    the rule and the value (without the origin; `read_requests` adds it)."""
    if not isinstance(fields, dict):
        raise ValueError(f"a request must be a JSON object (got {type(fields).__name__})")
    unknown = sorted(set(fields) - set(FIELDS))
    if unknown:
        raise ValueError(f"unknown field {unknown[0]!r} (fields: {', '.join(FIELDS)})")
    if "prompt" not in fields:
        raise ValueError('"prompt" is required')
    checks = {"temperature": _is_number, "top_p": _is_number, "min_p": _is_number, "top_k": _is_int, "seed": _is_int}
    checks |= {
        "prompt": lambda v: isinstance(v, str) and bool(v.strip()),
        "max_tokens": lambda v: _is_int(v) and v >= 1,
    }
    for name, ok in checks.items():
        if name in fields and not ok(fields[name]):
            raise ValueError(f"{name} must be {FIELDS[name]} (got {fields[name]!r:.80})")
    if "seed" in fields and not -(2**63) <= fields["seed"] < 2**64:  # a 64-bit key, as --seed
        raise ValueError(f"seed must fit in 64 bits, in [-2**63, 2**64) (got {fields['seed']})")
    grammars = [f for f in GRAMMAR_FIELDS if f in fields]
    if len(grammars) > 1:
        raise ValueError(f"give at most one of json_schema, regex and choices (got {' and '.join(grammars)})")
    sampling = {name: fields[name] for name in ("temperature", "top_k", "top_p", "min_p") if name in fields}
    return replace(
        defaults,
        prompt=fields["prompt"],
        params=replace(defaults.params, **sampling),  # SamplingParams checks the values
        seed=fields.get("seed", defaults.seed),
        max_tokens=fields.get("max_tokens", defaults.max_tokens),
        grammar=_grammar(grammars[0], fields[grammars[0]]) if grammars else defaults.grammar,
    )


def read_requests(path: str | Path, defaults: Request) -> list[Request]:
    """One Request per non-blank line of a JSONL file, every line checked before any is used.

    Raises ValueError: "line N: <field> must be <rule> (got <value>)", or why the file cannot be read."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as err:
        raise ValueError(f"cannot read the requests file {str(path)!r}: {err}") from None
    requests = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            fields = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f"line {number}: not JSON: {err}") from None
        try:
            requests.append(replace(request_from_fields(fields, defaults), origin=f"line {number}"))
        except ValueError as err:
            raise ValueError(f"line {number}: {err}") from None
    if not requests:
        raise ValueError(f"the requests file {str(path)!r} holds no request (one JSON object per line)")
    return requests
