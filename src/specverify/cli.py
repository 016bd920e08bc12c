"""The `specverify` command. One function adds each subcommand's arguments, one runs it.

Errors a user can fix (bad arguments, a missing model package) end the command with one line on
stderr that says what to do, and exit status 2.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import sys
from collections.abc import Sequence
from contextlib import nullcontext

#: What `generate` imports beyond the core package: the `demo` extra.
DEMO_MODULES = ("transformers", "gguf", "accelerate", "rich")
#: What `generate --json-schema/--regex/--choices` imports beyond that (also in the `demo` extra).
GRAMMAR_MODULES = ("llguidance", "jsonschema")
#: What `generate --engine llamacpp` imports beyond the demo extra: the `llamacpp` extra.
LLAMACPP_MODULES = ("llama_cpp",)


class UsageError(Exception):
    """Bad input from the command line; the message is shown as is."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:
        self.exit(2, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


def add_generate(commands: argparse._SubParsersAction) -> None:
    from .decoding.examples import EXAMPLES

    p = commands.add_parser(
        "generate",
        help="speculative decoding on a real model (default: the embedded SmolLM2-135M-Instruct)",
        description="Answer PROMPT with speculative decoding, every draft verified by specverify.",
    )
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
    p.add_argument("--seed", type=int, default=0, help="base seed: token n is drawn with key seed + n")
    p.add_argument(
        "-k",
        "--draft-tokens",
        type=_draft_length,
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
    p.add_argument("--branching", type=int, default=2, help="for --tree with --drafter model: children per node (default 2)")
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
    p.add_argument("--draft-proposal", default="argmax", help="'argmax' (default) or 'sampled' (the drafter samples)")
    p.add_argument("--max-tokens", type=int, default=128, help="tokens to generate at most (default 128)")
    p.add_argument("--compare", action="store_true", help="also decode without speculation, same seed")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the live view")
    p.add_argument(
        "--threads", type=int, default=1, help="CPU threads (default 1): torch's, or llama.cpp's with --engine llamacpp "
        "(torch then runs the verifier on one)"
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
    p.set_defaults(run=run_generate)


def _draft_length(value: str) -> int | str:
    """-k/--draft-tokens: 'auto' or an int >= 0."""
    if value == "auto":
        return value
    try:
        k = int(value)
    except ValueError:
        k = -1
    if k < 0:
        raise argparse.ArgumentTypeError(f"must be 'auto' or an int >= 0 (got {value!r})")
    return k


def _generate_settings(args: argparse.Namespace):
    """Check the generate arguments before anything is loaded -> (prompt text, SamplingParams)."""
    from .decoding.examples import EXAMPLES
    from .decoding.params import SamplingParams

    if sum(x is not None for x in (args.prompt, args.example, args.requests)) != 1:
        raise UsageError("give a PROMPT, --example NAME or --requests FILE.jsonl (one of them)")
    prompt = args.prompt if args.example is None else EXAMPLES[args.example]
    if prompt is not None and not prompt.strip():
        raise UsageError('PROMPT is empty: give the text to answer, e.g. specverify generate "Hello!"')
    if args.drafter not in ("ngram", "model"):
        raise UsageError(f"--drafter must be 'ngram' or 'model' (got {args.drafter!r})")
    if args.drafter == "model" and not args.draft_model:
        raise UsageError("--drafter model needs --draft-model: 'smollm2', a .gguf file or a model folder")
    if args.draft_model and args.drafter != "model":
        raise UsageError(f"--draft-model is used only with --drafter model (got --drafter {args.drafter})")
    if not 1 <= args.min_ngram <= 3:
        raise UsageError(f"--min-ngram must be 1, 2 or 3 (got {args.min_ngram})")
    if args.draft_proposal not in ("argmax", "sampled"):
        raise UsageError(f"--draft-proposal must be 'argmax' or 'sampled' (got {args.draft_proposal!r})")
    if args.engine not in ("transformers", "llamacpp"):
        raise UsageError(f"--engine must be 'transformers' or 'llamacpp' (got {args.engine!r})")
    if args.llamacpp_f16 and args.engine != "llamacpp":
        raise UsageError(f"--llamacpp-f16 needs --engine llamacpp (got --engine {args.engine})")
    _check_tree_settings(args)
    if not -(2**63) <= args.seed < 2**64:
        raise UsageError(f"--seed must fit in 64 bits, in [-2**63, 2**64) (got {args.seed})")
    for flag, value, low in (
        ("--max-tokens", args.max_tokens, 1),
        ("--threads", args.threads, 1),
    ):
        if value < low:
            raise UsageError(f"{flag} must be >= {low} (got {value})")
    try:
        params = SamplingParams(args.temperature, args.top_k, args.top_p, args.min_p)
    except ValueError as err:
        raise UsageError(f"--{str(err).replace('_', '-')}") from None
    return prompt, params


def _check_tree_settings(args: argparse.Namespace) -> None:
    """--tree and its companions: what a tree step cannot take is refused before anything is loaded."""
    if args.tree is None:
        return
    if args.tree < 1:
        raise UsageError(f"--tree must be >= 1 node (got {args.tree})")
    if args.draft_tokens != "auto":
        raise UsageError(f"--tree NODES replaces -k (got -k {args.draft_tokens} and --tree {args.tree}: give one)")
    if args.json_schema is not None or args.regex is not None or args.choices is not None:
        raise UsageError("--tree cannot take --json-schema/--regex/--choices: tree steps are verified without grammar masks")
    if args.relaxed is not None:
        raise UsageError("--tree cannot take --relaxed: relaxed acceptance is a chain rule")
    if args.engine != "transformers":
        raise UsageError(f"--tree needs --engine transformers: its sessions score trees (got --engine {args.engine})")
    if args.branching < 1:
        raise UsageError(f"--branching must be >= 1 (got {args.branching})")
    if args.sibling_draws not in ("with_replacement", "without_replacement"):
        raise UsageError(f"--sibling-draws must be 'with_replacement' or 'without_replacement' (got {args.sibling_draws!r})")


def _relaxed_setting(args: argparse.Namespace) -> tuple[int, float] | None:
    """Check the thinking-region flags before anything is loaded -> (relaxed_topk, relaxed_delta) or None."""
    if (args.think_begin is None) != (args.think_end is None):
        raise UsageError("--think-begin and --think-end go together (got only one)")
    if args.relaxed is None:
        return None
    parts = args.relaxed.split(",")
    try:
        topk, delta = int(parts[0]), float(parts[-1])
    except ValueError:
        topk, delta = 0, math.nan
    if len(parts) != 2 or topk < 1 or not delta >= 0:
        raise UsageError(
            f"--relaxed must be TOPK,DELTA with TOPK >= 1 and DELTA >= 0, e.g. 10,0.6 (got {args.relaxed!r})"
        )
    if args.think_begin is None:
        raise UsageError("--relaxed needs --think-begin and --think-end (it applies inside thinking regions only)")
    if args.draft_proposal != "argmax":
        raise UsageError("--relaxed needs --draft-proposal argmax (the relaxed rule judges argmax drafts only)")
    return topk, delta


def _grammar_setting(args: argparse.Namespace):
    """Check the structured-output flags before anything is loaded -> ("json_schema", schema dict),
    ("regex", pattern), ("choice", [options]) or None."""
    if args.json_schema is None and args.regex is None and args.choices is None:
        return None
    _check_modules(GRAMMAR_MODULES, "--json-schema/--regex/--choices")
    if args.json_schema is not None:
        from .decoding.schema import read_schema

        try:
            return "json_schema", read_schema(args.json_schema)
        except ValueError as err:
            raise UsageError(f"--json-schema: {err}") from None
    if args.regex is not None:
        if not args.regex:
            raise UsageError("--regex must not be empty")
        return "regex", args.regex
    options = args.choices.split(",")
    if not all(options):
        raise UsageError(f"--choices must be non-empty strings separated by commas (got {args.choices!r})")
    return "choice", options


def _check_modules(modules: Sequence[str], what: str, extra: str = "demo") -> None:
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        extras = "demo" if extra == "demo" else f"demo,{extra}"
        raise UsageError(
            f"{what} needs the {extra} extra ({', '.join(missing)} not installed); from the repository root run: "
            f"{sys.executable} -m pip install torch==2.13.0 -e '.[{extras}]'"
        )


def _thinking_regions(args: argparse.Namespace, target):
    """The ThinkingRegions of --think-begin/--think-end in the target's tokenizer (None without them)."""
    if args.think_begin is None:
        return None
    from .decoding import ThinkingRegions

    try:
        begin = target.tokenizer.token_id(args.think_begin)
        end = target.tokenizer.token_id(args.think_end)
        return ThinkingRegions(begin, end)
    except ValueError as err:
        raise UsageError(f"--think-begin/--think-end: {err}") from None


def _load_models(args: argparse.Namespace, console):
    """The target and the drafter the arguments name -> (LoadedModel, Drafter)."""
    from .decoding import ModelDrafter, ModelTreeDrafter, NgramDrafter, NgramTrieDrafter
    from .decoding.loading import MissingModel, check_engine, load_model, locate_model

    names = {"--model": args.model, "--draft-model": args.draft_model if args.drafter == "model" else None}
    for flag, name in names.items():  # both checked before either is loaded
        if name is None:
            continue
        try:
            check_engine(locate_model(name), args.engine, f16=args.llamacpp_f16)
        except (MissingModel, ValueError) as err:
            raise UsageError(f"{flag}: {err}") from None
    engine = {"engine": args.engine, "threads": args.threads, "f16": args.llamacpp_f16}
    with _status(console, f"loading {args.model} (the first run converts and caches it)"):
        try:
            target = load_model(args.model, **engine)
            draft = load_model(args.draft_model, **engine) if args.drafter == "model" else None
        except MissingModel as err:
            raise UsageError(str(err)) from None
    if draft is None and args.tree is not None:
        return target, NgramTrieDrafter(min_ngram=args.min_ngram)
    if draft is None:
        return target, NgramDrafter(min_ngram=args.min_ngram)
    if draft.model.vocab_size != target.model.vocab_size:
        raise UsageError(
            "--draft-model must share the target's tokenizer "
            f"(vocabulary {draft.model.vocab_size} != {target.model.vocab_size})"
        )
    if args.tree is not None:
        return target, ModelTreeDrafter(draft.model, args.branching, args.sibling_draws)
    return target, ModelDrafter(draft.model)


def _requests(args: argparse.Namespace, prompt: str | None, params, grammar_setting):
    """The flags as the batch's requests: the one PROMPT/--example, or each line of --requests over the
    flags' values. Checked before anything is loaded."""
    from .decoding.requests import Request, read_requests

    defaults = Request(prompt or "", params, args.seed, args.max_tokens, grammar_setting)
    if args.requests is None:
        return [defaults]
    try:
        requests = read_requests(args.requests, defaults)
    except ValueError as err:
        raise UsageError(f"--requests {args.requests}: {err}") from None
    if any(r.grammar is not None for r in requests) and args.tree is not None:
        raise UsageError("--tree cannot take requests with json_schema/regex/choices: tree steps are verified without grammar masks")
    if any(r.grammar is not None for r in requests):
        _check_modules(GRAMMAR_MODULES, "a request with json_schema/regex/choices")
    return requests


def run_generate(args: argparse.Namespace) -> int:
    prompt, params = _generate_settings(args)
    relaxed = _relaxed_setting(args)
    _check_modules(DEMO_MODULES, "generate")
    if args.engine == "llamacpp":
        _check_modules(LLAMACPP_MODULES, "--engine llamacpp", "llamacpp")
    requests = _requests(args, prompt, params, _grammar_setting(args))
    import torch

    from .decoding.loading import torch_threads

    torch.set_num_threads(torch_threads(args.engine, args.threads))
    console = None
    if not args.json:
        from rich.console import Console

        console = Console(highlight=False)
    target, drafter = _load_models(args, console)
    single = args.requests is None
    printer = None
    if console is not None:
        from .decoding.report import LEGEND, StreamPrinter

        what = f"prompt {len(target.tokenizer.encode_chat(prompt))} tokens" if single else f"{len(requests)} requests"
        console.print(
            f"[dim]{target.source} loaded in {target.seconds:.1f} s · {what} · "
            f"{'K=' + str(args.draft_tokens) if args.tree is None else f'tree of {args.tree} nodes'} · "
            f"drafter {args.drafter} · {args.draft_proposal} proposals[/dim]"
        )
        if single:
            console.print(LEGEND)
            printer = StreamPrinter(target.tokenizer, console)
    run = _decode(args, target, drafter, requests, relaxed, printer, console)
    if console is None:
        _print_json(args, target, run)
    else:
        _print_table(console, run, relaxed is not None, single)
    return 0


def _decode(args: argparse.Namespace, target, drafter, requests, relaxed, printer, console):
    """Speculative decoding of the requests, then plain decoding with --compare -> decoding.batch.BatchRun."""
    from .decoding.batch import GrammarError, run_requests
    from .decoding.grammar import GrammarDeadEnd
    from .decoding.model import ContextOverflow

    try:
        return run_requests(
            target,
            drafter,
            requests,
            k=args.draft_tokens,
            tree=args.tree,
            draft_proposal=args.draft_proposal,
            thinking=_thinking_regions(args, target),
            relaxed=relaxed,
            on_step=printer,
            compare=args.compare,
            around_plain=lambda: _status(console, "decoding again without speculation"),
        )
    except (GrammarError, GrammarDeadEnd, ContextOverflow) as err:
        raise UsageError(str(err)) from None


def _print_json(args: argparse.Namespace, target, run) -> None:
    """Everything as one JSON object on one line: a single request's fields at the top level, a batch's
    under "requests"."""
    from .decoding.result import speedup

    spec, plain = run.speculative, run.plain
    each = [
        {
            "prompt": r.prompt,
            "prompt_tokens": len(ids),
            "seed": r.seed,
            "text": text,
            "grammar": check,
            "tokens": tokens,
            "identical": None if run.identical is None else run.identical[b],
        }
        for b, (r, ids, text, check, tokens) in enumerate(
            zip(run.requests, run.prompt_ids, run.texts, run.checks, spec.tokens)
        )
    ]
    report = {
        "model": target.source,
        "load_seconds": round(target.seconds, 3),
        "settings": {k: v for k, v in vars(args).items() if k not in ("run", "json", "prompt")},
        **(each[0] if args.requests is None else {"requests": each}),
        "speculative": spec.summary(),
        "plain": plain.summary() if plain is not None else None,
        "identical": None if plain is None else all(run.identical),
        "speedup": round(speedup(spec, plain), 4) if plain is not None else None,
    }
    print(json.dumps(report))


def _print_table(console, run, relaxed: bool, single: bool) -> None:
    from .decoding.report import results_table

    spec, plain = run.speculative, run.plain
    identical = None if plain is None else all(run.identical)
    if not single:
        for b, (request, text) in enumerate(zip(run.requests, run.texts)):
            console.print(f"[bold]request {b + 1}[/bold] [dim]({request.origin} · seed {request.seed} · "
                          f"{len(spec.tokens[b])} tokens)[/dim]")
            console.print(text, highlight=False, soft_wrap=True)
            _print_check(console, run.checks[b])
    console.print()
    console.print(results_table(spec, plain, identical))
    if identical is False and relaxed:
        console.print("[yellow]the texts differ: expected with --relaxed (lossy inside thinking regions)[/yellow]")
    elif identical is False:
        console.print(
            "[yellow]the texts differ: expected with --draft-proposal sampled (same distribution, other draws); "
            "in argmax mode it means the target's logits differed between the runs at a near-tie[/yellow]"
        )
    if single:
        _print_check(console, run.checks[0])


def _print_check(console, check: dict | None) -> None:
    if check is not None and not check["complete"]:
        console.print("[yellow]the answer is incomplete: --max-tokens ended it before the grammar did[/yellow]")
    elif check is not None and check.get("schema_error"):
        console.print(f"[red]the answer does not satisfy the schema: {check['schema_error']}[/red]")
    elif check is not None:
        checked = " (checked with jsonschema)" if "schema_error" in check else ""
        console.print(f"[green]the answer satisfies the grammar{checked}[/green]")


def _status(console, message: str):
    """A rich spinner while something slow runs (nothing when output is JSON)."""
    return console.status(message) if console is not None else nullcontext()


def add_audit(commands: argparse._SubParsersAction) -> None:
    from .audit import add_audit_arguments

    add_audit_arguments(commands.add_parser("audit", help="prove a verifier lossless against exact float64 laws"))


def add_bench(commands: argparse._SubParsersAction) -> None:
    from .bench import add_bench_arguments, run_bench_command

    p = commands.add_parser(
        "bench",
        help="time the verifier side by side with the read floor, softmax and a sort-based baseline",
        description="Time the verifier against one amax pass, torch.softmax and a sort-based baseline on "
        "the same logits; the last line printed is one JSON object.",
    )
    add_bench_arguments(p)
    p.set_defaults(run=run_bench_command)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="specverify", description="Lossless verification of speculative-decoding drafts.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    add_generate(commands)
    add_audit(commands)
    add_bench(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except UsageError as err:
        print(f"specverify {args.command}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
