"""Real speculative decoding: a target model, a drafter, and `specverify` deciding every step."""

from .drafters import Draft, Drafter, ModelDrafter, NgramDrafter
from .grammar import Grammar, GrammarCompiler
from .loop import plain_generate, speculative_generate
from .model import HFLanguageModel, LanguageModel, Session
from .params import SamplingParams
from .result import GenerationResult, StepEvent
from .thinking import ThinkingRegions

__all__ = [
    "Draft",
    "Drafter",
    "GenerationResult",
    "Grammar",
    "GrammarCompiler",
    "HFLanguageModel",
    "LanguageModel",
    "ModelDrafter",
    "NgramDrafter",
    "SamplingParams",
    "Session",
    "StepEvent",
    "ThinkingRegions",
    "plain_generate",
    "speculative_generate",
]
