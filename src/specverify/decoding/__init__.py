"""Real speculative decoding: a target model, a drafter, and `specverify` deciding every step."""

from .drafters import Draft, Drafter, ModelDrafter, NgramDrafter
from .loop import plain_generate, speculative_generate
from .model import HFLanguageModel, LanguageModel, Session
from .params import SamplingParams
from .result import GenerationResult, StepEvent

__all__ = [
    "Draft",
    "Drafter",
    "GenerationResult",
    "HFLanguageModel",
    "LanguageModel",
    "ModelDrafter",
    "NgramDrafter",
    "SamplingParams",
    "Session",
    "StepEvent",
    "plain_generate",
    "speculative_generate",
]
