"""`specverify generate`'s flags, or a JSONL line over them, turned into validated settings (the requests, the
models, the engine, the drafts) before anything is loaded: every mistake a user can fix is one `UsageError`
naming the flag, the rule and the value, and the run reads the settings, never the parsed flags."""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import dataclass

from ..contract import DRAFT_PROPOSALS, SIBLING_DRAWS, VERIFICATIONS
from ..usage import UsageError, require_modules
from .constraints.grammar import grammar_source
from .constraints.schema import read_schema
from .drafting.registry import DRAFTER_NAMES, NEEDS_DRAFT_MODEL
from .engines.loading import ENGINES
from .examples import EXAMPLES
from .params import SamplingParams
from .requests import Request, read_requests

#: What `generate` imports beyond the core package: the `demo` extra.
DEMO_MODULES = ("transformers", "gguf", "accelerate", "rich")
#: What `generate --json-schema/--regex/--choices` imports beyond that (also in the `demo` extra).
GRAMMAR_MODULES = ("llguidance", "jsonschema")


@dataclass(frozen=True)
class EngineSettings:
    """What runs the models: the engine (a name of `engines.loading.ENGINES`), its CPU threads, and whether
    llama.cpp runs F16 copies of GGUF files (--engine, --threads, --llamacpp-f16)."""

    name: str
    threads: int
    f16: bool


@dataclass(frozen=True)
class DraftSettings:
    """How drafts are made and verified: the drafter (a name of `drafting.registry.DRAFTER_NAMES`), the draft
    model named (None unless the drafter drafts with one), K per step (an int >= 0 or "auto"), the tree's
    nodes (None: chains of K), the proposal ("argmax" or "sampled"), the n-gram drafters' shortest suffix,
    a model tree's children per node and sibling draws, and how sampled drafts are verified ("token" or
    "block", SPEC §3.6)."""

    drafter: str
    draft_model: str | None
    k: int | str
    tree: int | None
    proposal: str
    min_ngram: int
    branching: int
    sibling_draws: str
    verification: str = "token"

    @property
    def verified(self) -> str:
        """What the live view adds about the rule: " · block verification", or nothing for token-wise."""
        return " · block verification" if self.verification == "block" else ""

    @property
    def shape(self) -> str:
        """ "chain" or "tree": what a step drafts and verifies."""
        return "chain" if self.tree is None else "tree"

    @property
    def described(self) -> str:
        """The draft length as the live view's first line shows it: "K=4", "K=auto" or "tree of 6 nodes"."""
        return f"K={self.k}" if self.tree is None else f"tree of {self.tree} nodes"


@dataclass(frozen=True)
class GenerateSettings:
    """A checked `generate` command, everything its run reads: the requests (one for PROMPT or --example,
    one per line of --requests) and the --requests file (None for that single prompt, which is streamed as
    it decodes), the target model named, the engine, the drafts, the thinking-region tokens as given
    (--think-begin, --think-end; None without them) and the relaxed rule (relaxed_topk, relaxed_delta) or
    None, whether plain decoding runs beside (--compare), the output (--json, --details), and `flags`: the
    parsed flags as given, less PROMPT, --json and the dispatcher's `run`, which the JSON report records."""

    requests: list[Request]
    requests_file: str | None
    model: str
    engine: EngineSettings
    drafts: DraftSettings
    thinking: tuple[str, str] | None
    relaxed: tuple[int, float] | None
    compare: bool
    json: bool
    details: bool
    flags: dict[str, object]

    @property
    def single(self) -> bool:
        """Whether the command decodes the one PROMPT or --example (streamed as it decodes)."""
        return self.requests_file is None


#: What the JSON report's record of the flags leaves out: PROMPT (the report shows it beside its request),
#: --json (the report is its output) and the dispatcher's `run`.
UNRECORDED_FLAGS = ("run", "json", "prompt")


def draft_length_argument(value: str) -> int | str:
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


def generate_settings(args: argparse.Namespace) -> GenerateSettings:
    """Check every generate argument that can be checked without a model -> GenerateSettings, the only thing
    the run reads."""
    prompt, params = _prompt_and_params(args)
    relaxed = _relaxed_setting(args)
    require_modules(DEMO_MODULES, "generate")
    engine = ENGINES[args.engine]
    require_modules(engine.modules, f"--engine {engine.name}", engine.extra)
    requests = _requests(args, prompt, params, _grammar_setting(args))
    return GenerateSettings(
        requests=requests,
        requests_file=args.requests,
        model=args.model,
        engine=EngineSettings(args.engine, args.threads, args.llamacpp_f16),
        drafts=_draft_settings(args),
        thinking=None if args.think_begin is None else (args.think_begin, args.think_end),
        relaxed=relaxed,
        compare=args.compare,
        json=args.json,
        details=args.details,
        flags={name: value for name, value in vars(args).items() if name not in UNRECORDED_FLAGS},
    )


def _draft_settings(args: argparse.Namespace) -> DraftSettings:
    """The checked drafter flags as DraftSettings (the draft model only where the drafter drafts with one)."""
    return DraftSettings(
        drafter=args.drafter,
        draft_model=args.draft_model if args.drafter in NEEDS_DRAFT_MODEL else None,
        k=args.draft_tokens,
        tree=args.tree,
        proposal=draft_proposal(args),
        min_ngram=args.min_ngram,
        branching=args.branching,
        sibling_draws=args.sibling_draws,
        verification=args.verify,
    )


def draft_proposal(args: argparse.Namespace) -> str:
    """--draft-proposal as given, else "sampled" with --verify block (the rule judges sampled drafts) and
    "argmax" otherwise."""
    if args.draft_proposal is not None:
        return args.draft_proposal
    return "sampled" if args.verify == "block" else "argmax"


def _prompt_and_params(args: argparse.Namespace) -> tuple[str | None, SamplingParams]:
    """The prompt (None for --requests) and the flags' SamplingParams, after the checks of every flag."""
    if sum(x is not None for x in (args.prompt, args.example, args.requests)) != 1:
        raise UsageError("give a PROMPT, --example NAME or --requests FILE.jsonl (one of them)")
    prompt = args.prompt if args.example is None else EXAMPLES[args.example]
    if prompt is not None and not prompt.strip():
        raise UsageError('PROMPT is empty: give the text to answer, e.g. specverify generate "Hello!"')
    _check_drafter_settings(args)
    if args.engine not in ENGINES:
        raise UsageError(f"--engine must be {_one_of(ENGINES)} (got {args.engine!r})")
    if args.llamacpp_f16 and not ENGINES[args.engine].converts_f16:
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


def _one_of(names) -> str:
    """'a' or 'b' (two names), 'a', 'b' or 'c' (more)."""
    quoted = [repr(n) for n in names]
    return quoted[0] if len(quoted) == 1 else f"{', '.join(quoted[:-1])} or {quoted[-1]}"


def _check_drafter_settings(args: argparse.Namespace) -> None:
    """--drafter, --draft-model, --min-ngram and --draft-proposal."""
    if args.drafter not in DRAFTER_NAMES:
        raise UsageError(f"--drafter must be {_one_of(DRAFTER_NAMES)} (got {args.drafter!r})")
    if args.drafter in NEEDS_DRAFT_MODEL and not args.draft_model:
        raise UsageError(f"--drafter {args.drafter} needs --draft-model: 'smollm2', a .gguf file or a model folder")
    if args.draft_model and args.drafter not in NEEDS_DRAFT_MODEL:
        raise UsageError(f"--draft-model is used only with --drafter model (got --drafter {args.drafter})")
    if not 1 <= args.min_ngram <= 3:
        raise UsageError(f"--min-ngram must be 1, 2 or 3 (got {args.min_ngram})")
    if args.draft_proposal not in (*DRAFT_PROPOSALS, None):
        raise UsageError(f"--draft-proposal must be 'argmax' or 'sampled' (got {args.draft_proposal!r})")
    _check_verification(args)


def _check_verification(args: argparse.Namespace) -> None:
    """--verify: 'token' or 'block'; block judges sampled chains of drafts only (SPEC §3.6)."""
    if args.verify not in VERIFICATIONS:
        raise UsageError(f"--verify must be 'token' or 'block' (got {args.verify!r})")
    if args.verify != "block":
        return
    if draft_proposal(args) != "sampled":
        raise UsageError("--verify block needs --draft-proposal sampled: argmax drafts are judged by SPEC §3.1")
    if args.tree is not None:
        raise UsageError("--verify block cannot take --tree: a tree is verified by its walk (SPEC §8)")


def _check_tree_settings(args: argparse.Namespace) -> None:
    """--tree and its companions: what a tree step cannot take is refused before anything is loaded."""
    if args.tree is None:
        return
    if args.tree < 1:
        raise UsageError(f"--tree must be >= 1 node (got {args.tree})")
    if args.draft_tokens != "auto":
        raise UsageError(f"--tree NODES replaces -k (got -k {args.draft_tokens} and --tree {args.tree}: give one)")
    if args.json_schema is not None or args.regex is not None or args.choices is not None:
        raise UsageError(
            "--tree cannot take --json-schema/--regex/--choices: tree steps are verified without grammar masks"
        )
    if args.relaxed is not None:
        raise UsageError("--tree cannot take --relaxed: relaxed acceptance is a chain rule")
    if not ENGINES[args.engine].scores_trees:
        raise UsageError(f"--tree needs --engine transformers: its sessions score trees (got --engine {args.engine})")
    if args.branching < 1:
        raise UsageError(f"--branching must be >= 1 (got {args.branching})")
    if args.sibling_draws not in SIBLING_DRAWS:
        raise UsageError(
            f"--sibling-draws must be 'with_replacement' or 'without_replacement' (got {args.sibling_draws!r})"
        )


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
    if draft_proposal(args) != "argmax":
        raise UsageError("--relaxed needs --draft-proposal argmax (the relaxed rule judges argmax drafts only)")
    return topk, delta


def _grammar_setting(args: argparse.Namespace):
    """Check the structured-output flags before anything is loaded -> ("json_schema", schema dict),
    ("regex", pattern), ("choice", [options]) or None."""
    if args.json_schema is None and args.regex is None and args.choices is None:
        return None
    require_modules(GRAMMAR_MODULES, "--json-schema/--regex/--choices")
    if args.json_schema is not None:
        try:
            schema = read_schema(args.json_schema)
            grammar_source("json_schema", json.dumps(schema))
        except ValueError as err:
            raise UsageError(f"--json-schema: {err}") from None
        return "json_schema", schema
    if args.regex is not None:
        if not args.regex:
            raise UsageError("--regex must not be empty")
        try:
            grammar_source("regex", args.regex)
        except ValueError as err:
            raise UsageError(f"--regex: {err}") from None
        return "regex", args.regex
    options = args.choices.split(",")
    if not all(options):
        raise UsageError(f"--choices must be non-empty strings separated by commas (got {args.choices!r})")
    return "choice", options


def _requests(args: argparse.Namespace, prompt: str | None, params, grammar_setting):
    """The flags as the batch's requests: the one PROMPT/--example, or each line of --requests over the
    flags' values. Checked before anything is loaded."""
    defaults = Request(prompt or "", params, args.seed, args.max_tokens, grammar_setting)
    if args.requests is None:
        return [defaults]
    try:
        requests = read_requests(args.requests, defaults)
    except ValueError as err:
        raise UsageError(f"--requests {args.requests}: {err}") from None
    if any(r.grammar is not None for r in requests) and args.tree is not None:
        raise UsageError(
            "--tree cannot take requests with json_schema/regex/choices: tree steps are verified without grammar masks"
        )
    if any(r.grammar is not None for r in requests):
        require_modules(GRAMMAR_MODULES, "a request with json_schema/regex/choices")
    return requests
