"""`specverify generate`: the arguments and the run.

The flags are checked before anything loads (`settings`) and the prompts' fit in the model's context before its
weights load (`engines.loading.check_prompts_fit`), then the models named are loaded (`engines.loading`) with the
drafter named (`drafting.registry`), the requests decoded as one batch (`batch`) and the result shown (`report`)."""

from __future__ import annotations

import argparse
import sys

import torch

from ..usage import UsageError
from .batch import GrammarError, run_requests
from .constraints.grammar import GrammarDeadEnd
from .constraints.thinking import ThinkingRegions
from .drafting.registry import DrafterSettings, make_drafter
from .engines.base import ContextOverflow
from .engines.loading import (
    MissingModel,
    check_engine,
    check_prompts_fit,
    converts_on_load,
    load_model,
    locate_model,
    torch_threads,
)
from .examples import EXAMPLES
from .settings import GenerateSettings, draft_length_argument, generate_settings

DESCRIPTION = "Answer PROMPT with speculative decoding, every draft verified by specverify."
HELP = "speculative decoding on a real model (default: the embedded SmolLM2-135M-Instruct)"


def add_generate_arguments(p: argparse.ArgumentParser) -> None:
    """Add generate's options to `p` (its description too, if it has none) and set
    `run=run_generate_command` as a default, so a subcommand dispatcher can call `args.run(args)`."""
    p.description = p.description or DESCRIPTION
    p.add_argument("prompt", nargs="?", help="the user message (the model's chat template is applied)")
    p.add_argument("--example", choices=sorted(EXAMPLES), help="use a built-in prompt instead of PROMPT")
    p.add_argument(
        "--requests",
        metavar="FILE.jsonl",
        help="a batch instead of PROMPT: one JSON object per line with prompt and optionally temperature, "
        "top_k, top_p, min_p, seed, max_tokens, json_schema, regex or choices (omitted fields take the flags' "
        "values); decoded together, each request's output identical to decoding it alone with its seed",
    )
    p.add_argument(
        "--model", default="smollm2", help="'smollm2' (default), a .gguf file or a transformers model folder"
    )
    p.add_argument("--temperature", type=float, default=0.0, help="0 (default) is greedy")
    p.add_argument("--top-k", type=int, default=0, help="keep the k most likely tokens; 0 (default) is off")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus mass in (0, 1]; 1 (default) is off")
    p.add_argument("--min-p", type=float, default=0.0, help="drop tokens below min_p * max prob; 0 (default) is off")
    p.add_argument("--seed", type=int, default=0, help="base seed: token n is drawn with key request_seed(seed, n)")
    p.add_argument(
        "-k",
        "--draft-tokens",
        type=draft_length_argument,
        default="auto",
        help="K, draft tokens per verify step: an int >= 0, or 'auto' (default): chosen every step from the "
        "running acceptance and the measured cost of each K, 0 (a plain step) included",
    )
    p.add_argument(
        "--drafter", default="ngram", help="'ngram' (prompt lookup, default) or 'model' (needs --draft-model)"
    )
    p.add_argument(
        "--tree",
        type=int,
        metavar="NODES",
        help="verify a draft tree of up to NODES nodes per step instead of a chain of K (--drafter ngram: the "
        "trie of every earlier continuation of the suffix; model: the draft model's top/sampled children)",
    )
    p.add_argument(
        "--branching", type=int, default=2, help="for --tree with --drafter model: children per node (default 2)"
    )
    p.add_argument(
        "--sibling-draws",
        default="with_replacement",
        help="for --tree with --drafter model and --draft-proposal sampled: 'with_replacement' (default) or "
        "'without_replacement'",
    )
    p.add_argument(
        "--min-ngram", type=int, default=1, help="for --drafter ngram: shortest suffix to match, 1-3 (default 1)"
    )
    p.add_argument(
        "--draft-model", help="for --drafter model: 'smollm2', a .gguf file or a model folder, same tokenizer"
    )
    p.add_argument(
        "--draft-proposal",
        help="'argmax' (the default) or 'sampled' (the drafter samples; the default with --verify block)",
    )
    p.add_argument(
        "--verify",
        default="token",
        help="how sampled drafts are judged: 'token' (default, one by one) or 'block' (jointly: more accepted)",
    )
    p.add_argument("--max-tokens", type=int, default=128, help="tokens to generate at most (default 128)")
    p.add_argument("--compare", action="store_true", help="also decode without speculation, same seed")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the live view")
    p.add_argument(
        "--details", action="store_true", help="show the acceptance at every draft position (default: the first 4)"
    )
    p.add_argument(
        "--threads",
        type=int,
        default=1,
        help="CPU threads (default 1): torch's, or llama.cpp's with --engine llamacpp "
        "(torch then runs the verifier on one)",
    )
    engine = p.add_argument_group("engine")
    engine.add_argument(
        "--engine",
        default="transformers",
        help="what runs the target and draft models: 'transformers' (default) or 'llamacpp' (GGUF files as "
        "shipped, through llama-cpp-python: pip install -e '.[llamacpp]')",
    )
    engine.add_argument(
        "--llamacpp-f16",
        action="store_true",
        help="with --engine llamacpp: run an F16 copy of the GGUF models (converted once by llama.cpp and "
        "cached; verifying K drafts costs far less there than on 4-bit weights)",
    )
    grammar = p.add_argument_group("structured output (one of)").add_mutually_exclusive_group()
    grammar.add_argument("--json-schema", metavar="FILE", help="answer with JSON valid against the schema in FILE")
    grammar.add_argument("--regex", metavar="PATTERN", help="answer with text matching PATTERN (Rust regex syntax)")
    grammar.add_argument("--choices", metavar="A,B,...", help="answer with exactly one of these (comma-separated)")
    thinking = p.add_argument_group("thinking regions")
    thinking.add_argument("--think-begin", metavar="TOKEN", help="the token (text or id) that opens a thinking region")
    thinking.add_argument("--think-end", metavar="TOKEN", help="the token (text or id) that closes it")
    thinking.add_argument(
        "--relaxed",
        metavar="TOPK,DELTA",
        help="lossy relaxed acceptance inside thinking regions: accept a draft among the TOPK most likely "
        "tokens with probability >= top1 - DELTA (e.g. 10,0.6); needs --think-begin/--think-end",
    )
    p.set_defaults(run=run_generate_command)


def run_generate_command(args: argparse.Namespace) -> int:
    """Run a parsed `generate` command -> exit status 0 (a UsageError for a mistake the user can fix)."""
    return run_generate(generate_settings(args))


def run_generate(settings: GenerateSettings) -> int:
    """Run a checked `generate` command: load the models, decode the requests, show the result -> 0."""
    torch.set_num_threads(torch_threads(settings.engine.name, settings.engine.threads))
    from rich.console import Console

    from .report import Progress, json_report, print_results

    console = None if settings.json else Console(highlight=False)
    with Progress(console or _json_progress_console()) as progress:
        target, drafter = _load_models(settings, progress)
        on_step = _step_display(settings, target, console, progress)
        progress.show(WARMING_UP)
        run = _decode(settings, target, drafter, on_step, progress)
        progress.done()
        if console is None:
            print(json_report(settings, target, run))
        else:
            print_results(console, run, settings.relaxed is not None, settings.single, settings.details)
    return 0


def _step_display(settings: GenerateSettings, target, console, progress):
    """What shows each step: with the live view (console), a first line saying what runs, then the single
    prompt's text streamed (with the legend of its colours) or a batch's progress; with --json (console
    None) the tokens committed so far, on stderr."""
    from .report import LEGEND, BatchProgress, StreamPrinter

    requests = settings.requests
    if console is None:
        return BatchProgress(len(requests), progress)
    what = (
        f"prompt {len(target.tokenizer.encode_chat(requests[0].prompt))} tokens"
        if settings.single
        else f"{len(requests)} requests"
    )
    drafts = settings.drafts
    console.print(
        f"[dim]{target.source} loaded in {target.seconds:.1f} s · {what} · {drafts.described} · "
        f"drafter {drafts.drafter} · {drafts.proposal} proposals{drafts.verified}[/dim]"
    )
    if not settings.single:
        return BatchProgress(len(requests), progress)
    console.print(LEGEND)
    return StreamPrinter(target.tokenizer, console, progress)


def _json_progress_console():
    """Where --json shows its steps (loading, warming up, decoding) while stdout waits for the one JSON object:
    stderr, when a person watches it (a terminal); a piped stderr stays quiet."""
    from rich.console import Console

    return Console(stderr=True, highlight=False) if sys.stderr.isatty() else None


#: What a person sees between loading and the first token (the first run of a machine builds the kernels and
#: measures each draft length's cost, seconds on a CPU; later runs read both back).
WARMING_UP = "warming up: the kernels, then the cost of each draft length (measured once per machine and model)"


def _decode(settings: GenerateSettings, target, drafter, on_step, progress):
    """Speculative decoding of the requests, then plain decoding with --compare -> batch.BatchRun."""
    requests, drafts = settings.requests, settings.drafts
    try:
        return run_requests(
            target,
            drafter,
            requests,
            k=drafts.k,
            tree=drafts.tree,
            draft_proposal=drafts.proposal,
            thinking=_thinking_regions(settings.thinking, target),
            relaxed=settings.relaxed,
            verification=drafts.verification,
            on_step=on_step,
            compare=settings.compare,
            around_plain=lambda: progress.step("decoding again without speculation"),
        )
    except GrammarDeadEnd as err:
        origin = requests[err.row].origin if err.row is not None else ""
        raise _request_error(settings, f"{origin}: {err.reason}" if origin else err) from None
    except (GrammarError, ContextOverflow) as err:
        raise _request_error(settings, err) from None


def _request_error(settings: GenerateSettings, err: Exception | str) -> UsageError:
    """An error about a request as the command shows it: with --requests, every request is a line of the
    file and the message (which names it by its `Request.origin`, "line 3: ...") begins with the flag and
    file, as the file's own errors do (`settings`): one way of naming a line everywhere."""
    return UsageError(str(err) if settings.single else f"--requests {settings.requests_file}: {err}")


def _thinking_regions(tokens: tuple[str, str] | None, target):
    """The ThinkingRegions of the (--think-begin, --think-end) tokens in the target's tokenizer (None
    without them)."""
    if tokens is None:
        return None
    try:
        begin, end = (target.tokenizer.token_id(token) for token in tokens)
        return ThinkingRegions(begin, end)
    except ValueError as err:
        raise UsageError(f"--think-begin/--think-end: {err}") from None


def _check_models(settings: GenerateSettings) -> None:
    """The models named on the engine, and the requests' fit in the target's context, checked before any
    weights load."""
    engine = settings.engine
    names = {"--model": settings.model, "--draft-model": settings.drafts.draft_model}
    for flag, name in names.items():  # both checked before either is loaded
        if name is None:
            continue
        try:
            check_engine(locate_model(name), engine.name, f16=engine.f16)
        except (MissingModel, ValueError) as err:
            raise UsageError(f"{flag}: {err}") from None
    requests = settings.requests
    try:
        check_prompts_fit(
            locate_model(settings.model),
            engine.name,
            [r.prompt for r in requests],
            [r.max_tokens for r in requests],
            [r.origin for r in requests],
        )
    except ContextOverflow as err:
        raise _request_error(settings, err) from None
    except ValueError as err:  # a .gguf file that is not GGUF, or ends inside its header
        raise UsageError(f"--model: {err}") from None


def _load_models(settings: GenerateSettings, progress):
    """The target and the drafter the settings name, for their draft shape (chains or trees) ->
    (LoadedModel, drafter). The models named and the requests' fit in the target's context are checked
    before any weights load."""
    _check_models(settings)
    engine, drafts = settings.engine, settings.drafts
    loading = {"engine": engine.name, "threads": engine.threads, "f16": engine.f16}
    first = converts_on_load(settings.model, engine.name, engine.f16)
    with progress.step(f"loading {settings.model}" + (" (the first run converts and caches it)" if first else "")):
        try:
            target = load_model(settings.model, **loading)
            draft = load_model(drafts.draft_model, **loading) if drafts.draft_model is not None else None
        except MissingModel as err:
            raise UsageError(str(err)) from None
    if draft is not None and draft.model.vocab_size != target.model.vocab_size:
        raise UsageError(
            "--draft-model must share the target's tokenizer "
            f"(vocabulary {draft.model.vocab_size} != {target.model.vocab_size})"
        )
    drafter_settings = DrafterSettings(
        None if draft is None else draft.model, drafts.min_ngram, drafts.branching, drafts.sibling_draws
    )
    return target, make_drafter(drafts.drafter, drafts.shape, drafter_settings)
