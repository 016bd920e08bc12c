"""JSON schemas as files: reading and checking one, and checking an answer against it (with `jsonschema`).

Errors are ValueErrors with one-line messages, ready for the command line.
"""

from __future__ import annotations

import json
from pathlib import Path


def read_schema(path: str | Path) -> dict:
    """The JSON schema in a file, checked against its own metaschema."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise ValueError(f"cannot read the schema file {str(path)!r}: {err}") from None
    try:
        schema = json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"the schema file {str(path)!r} is not JSON: {err}") from None
    return check_schema(schema, f"the schema file {str(path)!r}", "hold")


def check_schema(schema, what: str = "the schema", verb: str = "be") -> dict:
    """schema, checked to be a JSON object valid against its metaschema; errors begin with `what`
    ("{what} must {verb} a JSON object")."""
    import jsonschema

    if not isinstance(schema, dict):
        raise ValueError(f"{what} must {verb} a JSON object (got {type(schema).__name__})")
    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as err:
        where = "/".join(str(p) for p in err.absolute_path) or "the top level"
        raise ValueError(f"{what} is not a valid JSON schema ({where}): {err.message}") from None
    return schema


def schema_violation(schema: dict, text: str) -> str | None:
    """None when text is JSON valid against schema; else why not, in one line."""
    import jsonschema

    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        return f"not JSON: {err}"
    error = jsonschema.exceptions.best_match(jsonschema.validators.validator_for(schema)(schema).iter_errors(value))
    return None if error is None else error.message
