"""Real speculative decoding: a target model, a drafter, and `specverify` deciding every step.

Rooms, imports running down this list: `command` (the `generate` command) -> `settings` (flags -> checked
requests) and `report` (what it shows) -> `batch` (a batch of requests through one loop) -> `loop/` (the
chain and tree loops and their shared state) -> `drafting/` (drafters, draft length) and `constraints/`
(grammar, thinking regions, schemas) -> `engines/` (the model protocol, transformers, llama.cpp, loading),
with `requests`, `params` and `examples` beside them. The names below are the public API of this package.
"""

from .batch import BatchRun, run_requests
from .constraints.grammar import Grammar, GrammarCompiler
from .constraints.thinking import ThinkingRegions
from .drafting.base import Draft, Drafter
from .drafting.draft_length import AdaptiveDraftLength, DraftLength, FixedDraftLength
from .drafting.model import ModelDrafter
from .drafting.ngram import NgramDrafter
from .drafting.tree import ModelTreeDrafter, NgramTrieDrafter, TreeDraft, TreeDrafter
from .engines.base import LanguageModel, Session, TreeSession
from .engines.hf import HFLanguageModel
from .loop.chain import plain_generate, speculative_generate
from .loop.result import GenerationResult, StepEvent
from .loop.tree import tree_generate
from .params import SamplingParams
from .requests import Request, read_requests

__all__ = [
    "AdaptiveDraftLength",
    "BatchRun",
    "Draft",
    "DraftLength",
    "Drafter",
    "FixedDraftLength",
    "GenerationResult",
    "Grammar",
    "GrammarCompiler",
    "HFLanguageModel",
    "LanguageModel",
    "ModelDrafter",
    "ModelTreeDrafter",
    "NgramDrafter",
    "NgramTrieDrafter",
    "Request",
    "SamplingParams",
    "Session",
    "StepEvent",
    "ThinkingRegions",
    "TreeDraft",
    "TreeDrafter",
    "TreeSession",
    "plain_generate",
    "read_requests",
    "run_requests",
    "speculative_generate",
    "tree_generate",
]
