"""`specverify generate --json-schema/--regex/--choices` and the thinking-region flags, end to end on a
tiny model folder that shares the tiny JSON tokenizer (tests/support/tiny_json.py), and their one-line errors."""

from __future__ import annotations

import json

import pytest

from specverify.decoding import settings
from tests.support.command_line import run
from tests.support.tiny_json import SCHEMA

pytest.importorskip("llguidance")
jsonschema = pytest.importorskip("jsonschema")


@pytest.fixture(scope="module")
def schema_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("schemas") / "schema.json"
    path.write_text(json.dumps(SCHEMA))
    return path


def generate_json(capsys, model_folder, *options: str) -> dict:
    code, out, err = run(capsys, "generate", "name ok", "--model", str(model_folder), "--json", *options)
    assert code == 0, err
    return json.loads(out)


@pytest.mark.parametrize(
    "options",
    [
        ["--temperature", "0.9", "--seed", "4", "-k", "3"],
        ["--seed", "1", "-k", "2", "--drafter", "model", "--draft-model", "SELF"],
        [
            "--temperature",
            "1.2",
            "--top-k",
            "12",
            "--seed",
            "7",
            "--draft-proposal",
            "sampled",
            "--drafter",
            "model",
            "--draft-model",
            "SELF",
        ],
    ],
    ids=["t0.9-ngram", "greedy-model", "sampled-proposals"],
)
def test_json_schema_output_is_valid(capsys, model_folder, schema_file, options):
    options = [str(model_folder) if o == "SELF" else o for o in options]
    options = ["--json-schema", str(schema_file), "--compare", "--max-tokens", "60", *options]
    report = generate_json(capsys, model_folder, *options)
    assert report["grammar"] == {"kind": "json_schema", "complete": True, "schema_error": None}
    jsonschema.validate(json.loads(report["text"]), SCHEMA)
    if "sampled" not in options:
        assert report["identical"] is True
    assert report["speculative"]["grammar_complete"] == [True]


def test_choices_and_regex(capsys, model_folder):
    report = generate_json(capsys, model_folder, "--choices", "yes,no,maybe", "--temperature", "1", "--seed", "3")
    assert report["text"] in ("yes", "no", "maybe") and report["grammar"] == {"kind": "choice", "complete": True}
    code, out, err = run(capsys, "generate", "x", "--model", str(model_folder), "--regex", "[0-9]{3}", "--compare")
    assert code == 0, err
    assert "the answer satisfies the grammar" in out and "identical text" in out


def test_thinking_flags_with_relaxed_acceptance(capsys, model_folder):
    report = generate_json(
        capsys,
        model_folder,
        "--think-begin",
        "[",
        "--think-end",
        "]",
        "--relaxed",
        "8,0.5",
        "--compare",
        "--temperature",
        "1",
        "--max-tokens",
        "12",
        "--drafter",
        "model",
        "--draft-model",
        str(model_folder),
    )
    assert report["speculative"]["tokens"] == 12
    assert report["settings"]["relaxed"] == "8,0.5"


def test_an_incomplete_answer_is_reported(capsys, model_folder, schema_file):
    options = ["--json-schema", str(schema_file), "--max-tokens", "3"]
    code, out, err = run(capsys, "generate", "x", "--model", str(model_folder), *options)
    assert code == 0, err
    assert "the answer is incomplete: --max-tokens ended it before the grammar did" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--json-schema", "/nowhere/schema.json"], "--json-schema: cannot read the schema file '/nowhere/sch"),
        (["--json-schema", "NOT_JSON"], "is not JSON: Expecting property name enclosed in double quotes: line 1"),
        (["--json-schema", "BAD_SCHEMA"], "is not a valid JSON schema (properties/a/type): 'strin' is not valid"),
        (["--json-schema", "LIST"], "must hold a JSON object (got list)"),
        (["--json-schema", "x.json", "--regex", "a"], "argument --regex: not allowed with argument --json-schema"),
        (["--choices", "a,,b"], "--choices must be non-empty strings separated by commas (got 'a,,b')"),
        (["--regex", ""], "--regex must not be empty"),
        (["--regex", "a(b"], "--regex: invalid regex: "),
        (["--regex", "([a-z"], "unclosed character class"),
        (["--relaxed", "10,0.6"], "--relaxed needs --think-begin and --think-end"),
        (["--relaxed", "ten", "--think-begin", "a", "--think-end", "b"], "--relaxed must be TOPK,DELTA with TOPK >= 1"),
        (["--relaxed", "0,0.6", "--think-begin", "a", "--think-end", "b"], "--relaxed must be TOPK,DELTA"),
        (["--relaxed", "3,0.1,2", "--think-begin", "a", "--think-end", "b"], "--relaxed must be TOPK,DELTA"),
        (
            ["--relaxed", "3,0.5", "--think-begin", "a", "--think-end", "b", "--draft-proposal", "sampled"],
            "--relaxed needs --draft-proposal argmax",
        ),
        (["--think-begin", "a"], "--think-begin and --think-end go together"),
    ],
)
def test_bad_flags_are_one_line_errors_before_loading(capsys, tmp_path, argv, message):
    files = {"NOT_JSON": "{name", "BAD_SCHEMA": '{"properties": {"a": {"type": "strin"}}}', "LIST": "[1]"}
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    argv = [str(tmp_path / a) if a in files else a for a in argv]
    code, out, err = run(capsys, "generate", "hi", "--model", "/nowhere/model.gguf", *argv)
    assert code == 2
    assert message in err, err
    assert err.count("\n") == 1 and "Traceback" not in err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--regex", "a(b"], "--regex: invalid regex: "),
        (["--regex", "a[A-Z]+"], "request 0: the grammar cannot be continued with this tokenizer"),
        (["--think-begin", "hello", "--think-end", "]"], "--think-begin/--think-end: 'hello' is not one token"),
        (["--think-begin", "99", "--think-end", "]"], "--think-begin/--think-end: token id 99 is past the tokenizer"),
        (["--think-begin", "]", "--think-end", "]"], "thinking begin and end must be different tokens"),
    ],
)
def test_bad_grammars_and_tokens_are_one_line_errors(capsys, model_folder, argv, message):
    code, out, err = run(capsys, "generate", "x", "--model", str(model_folder), "--json", *argv)
    assert code == 2
    assert message in err, err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_missing_grammar_packages_say_the_pip_command(capsys, monkeypatch):
    monkeypatch.setattr(settings, "GRAMMAR_MODULES", ("llguidance", "no_such_module_for_specverify"))
    code, out, err = run(capsys, "generate", "hi", "--choices", "a,b")
    assert code == 2 and err.count("\n") == 1
    assert "--json-schema/--regex/--choices needs the demo extra (no_such_module_for_specverify not installed)" in err
