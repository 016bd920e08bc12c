"""Real speculative decoding: a target model, a drafter, and `specverify` deciding every step."""

from .batch import BatchRun, run_requests
from .draft_length import AdaptiveDraftLength, DraftLength, FixedDraftLength
from .drafters import Draft, Drafter, ModelDrafter, NgramDrafter
from .grammar import Grammar, GrammarCompiler
from .loop import plain_generate, speculative_generate
from .model import HFLanguageModel, LanguageModel, Session, TreeSession
from .params import SamplingParams
from .requests import Request, read_requests
from .result import GenerationResult, StepEvent
from .thinking import ThinkingRegions
from .tree_drafters import ModelTreeDrafter, NgramTrieDrafter, TreeDraft, TreeDrafter
from .tree_loop import tree_generate

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
