"""`specverify generate --requests FILE.jsonl`: a batch of requests, each with its own parameters, seed,
budget and grammar, decoded together; each output identical to decoding that request alone; bad lines
are one-line errors (line, field, rule, value) before any work."""

from __future__ import annotations

import json

import pytest

from specverify.decoding.params import SamplingParams
from specverify.decoding.requests import Request, read_requests
from tests.support.command_line import run
from tests.support.tiny_json import SCHEMA

pytest.importorskip("llguidance")

DEFAULTS = Request("", SamplingParams(temperature=0.5), seed=9, max_tokens=20)


def write(tmp_path, *lines) -> str:
    path = tmp_path / "requests.jsonl"
    path.write_text("\n".join(line if isinstance(line, str) else json.dumps(line) for line in lines) + "\n")
    return str(path)


def test_lines_fall_back_to_the_flags(tmp_path):
    path = write(tmp_path, {"prompt": "a"}, "", {"prompt": "b", "top_p": 0.9, "seed": 2, "choices": ["x", "y"]})
    first, second = read_requests(path, DEFAULTS)
    assert first == Request("a", SamplingParams(temperature=0.5), 9, 20, None, "line 1")
    assert second == Request("b", SamplingParams(temperature=0.5, top_p=0.9), 2, 20, ("choice", ["x", "y"]), "line 3")


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ({"prompt": "a", "top_p": 1.5}, "line 2: top_p must be in (0, 1] (got 1.5)"),
        ({"prompt": "a", "temperature": -1}, "line 2: temperature must be finite and >= 0 (got -1)"),
        ({"prompt": "a", "top_k": 2.5}, "line 2: top_k must be an int (got 2.5)"),
        ({"prompt": "a", "max_tokens": 0}, "line 2: max_tokens must be an int >= 1 (got 0)"),
        ({"prompt": "a", "seed": "7"}, "line 2: seed must be an int (got '7')"),
        (
            {"prompt": "a", "seed": 2**64},
            "line 2: seed must fit in 64 bits, in [-2**63, 2**64) (got 18446744073709551616)",
        ),
        ({"prompt": "  "}, "line 2: prompt must be a non-empty string (got '  ')"),
        ({"temperature": 0}, 'line 2: "prompt" is required'),
        ({"prompt": "a", "temp": 0}, "line 2: unknown field 'temp'"),
        ({"prompt": "a", "regex": "a", "choices": ["b"]}, "line 2: give at most one of json_schema, regex and choices"),
        ({"prompt": "a", "choices": ["b", ""]}, "line 2: choices must be a list of non-empty strings (got ['b', ''])"),
        ({"prompt": "a", "json_schema": {"type": 3}}, "line 2: json_schema is not a valid JSON schema"),
        ({"prompt": "a", "json_schema": [1]}, "line 2: json_schema must be a JSON object (got list)"),
        ("[1, 2]", "line 2: a request must be a JSON object (got list)"),
        ("{prompt: 1}", "line 2: not JSON: "),
    ],
)
def test_a_bad_line_names_its_number_field_rule_and_value(tmp_path, capsys, line, message):
    path = write(tmp_path, {"prompt": "fine"}, line)
    with pytest.raises(ValueError) as caught:
        read_requests(path, DEFAULTS)
    assert message in str(caught.value)
    # from the command line: exit 2, one line, before the (missing) model is even looked for
    code, out, err = run(capsys, "generate", "--requests", path, "--model", "/nowhere/model.gguf")
    assert code == 2 and err.count("\n") == 1 and message in err and "Traceback" not in err


def test_an_empty_or_missing_file_is_one_line(tmp_path, capsys):
    empty = write(tmp_path, "")
    code, _, err = run(capsys, "generate", "--requests", empty)
    assert code == 2 and "holds no request" in err
    code, _, err = run(capsys, "generate", "--requests", str(tmp_path / "none.jsonl"))
    assert code == 2 and "cannot read the requests file" in err
    code, _, err = run(capsys, "generate", "hi", "--requests", empty)
    assert code == 2 and "give a PROMPT, --example NAME or --requests FILE.jsonl (one of them)" in err


def test_a_grammar_that_does_not_compile_names_its_line(tmp_path, capsys, model_folder):
    path = write(tmp_path, {"prompt": "x"}, {"prompt": "y", "regex": "a(b"})
    code, _, err = run(capsys, "generate", "--requests", path, "--model", str(model_folder))
    assert code == 2 and f"--requests {path}: line 2: regex: invalid regex: " in err and err.count("\n") == 1


def test_a_grammar_that_cannot_be_continued_names_its_line(tmp_path, capsys, model_folder):
    """Found while decoding (the tokenizer has no token for what the grammar allows next): named by its line
    of the file, as every other error of a request, not by its row in the batch."""
    path = write(tmp_path, {"prompt": "x"}, {"prompt": "y", "regex": "a[A-Z]+"})
    code, _, err = run(capsys, "generate", "--requests", path, "--model", str(model_folder), "--max-tokens", "4")
    assert code == 2 and err.count("\n") == 1, err
    assert err.startswith(f"specverify generate: error: --requests {path}: line 2: the grammar cannot be continued")


REQUESTS = [
    {"prompt": "name ok", "json_schema": SCHEMA, "temperature": 0.9, "seed": 4, "max_tokens": 40},
    {"prompt": '{"x": 1', "temperature": 1.2, "top_k": 12, "seed": 7},
    {"prompt": "age", "regex": "[0-9]{1,3}", "seed": 1},
    {"prompt": "null", "choices": ["true", "false"], "temperature": 1.0, "min_p": 0.05, "seed": 2},
]


def alone_flags(fields: dict) -> list[str]:
    """The generate flags that ask for one request alone."""
    flags = [fields["prompt"]]
    for name in ("temperature", "top_k", "top_p", "min_p", "seed", "max_tokens"):
        if name in fields:
            flags += [f"--{name.replace('_', '-')}", str(fields[name])]
    if "regex" in fields:
        flags += ["--regex", fields["regex"]]
    if "choices" in fields:
        flags += ["--choices", ",".join(fields["choices"])]
    return flags


def test_each_request_decodes_as_it_does_alone(tmp_path, capsys, model_folder):
    schema = tmp_path / "schema.json"
    schema.write_text(json.dumps(SCHEMA))
    path = write(tmp_path, *REQUESTS)
    common = ["--model", str(model_folder), "--json", "--max-tokens", "16", "-k", "auto"]
    code, out, err = run(capsys, "generate", "--requests", path, "--compare", *common)
    assert code == 0, err
    batch = json.loads(out)
    assert batch["identical"] is True and [r["identical"] for r in batch["requests"]] == [True] * 4
    assert [len(r["tokens"]) <= (40 if b == 0 else 16) for b, r in enumerate(batch["requests"])] == [True] * 4
    assert batch["requests"][0]["grammar"] == {"kind": "json_schema", "complete": True, "schema_error": None}
    assert batch["speculative"]["tokens"] == sum(len(r["tokens"]) for r in batch["requests"])
    for fields, got in zip(REQUESTS, batch["requests"]):
        extra = ["--json-schema", str(schema)] if "json_schema" in fields else []
        code, out, err = run(capsys, "generate", *common, *alone_flags(fields), *extra)
        assert code == 0, err
        assert json.loads(out)["tokens"] == got["tokens"], fields
