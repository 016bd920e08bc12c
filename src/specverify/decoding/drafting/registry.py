"""The drafters by name: one line per (drafter, draft shape), so that the command line builds any of them
from its settings without an if-chain. A new drafter is one module in this package plus its lines here."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..engines.base import LanguageModel
from .base import Drafter
from .model import ModelDrafter
from .ngram import NgramDrafter
from .tree import ModelTreeDrafter, NgramTrieDrafter, TreeDrafter


@dataclass(frozen=True)
class DrafterSettings:
    """What a drafter may be built from: the draft model (None for a drafter without one), the n-gram
    drafters' shortest suffix, and a model tree's children per node and sibling scheme."""

    draft_model: LanguageModel | None = None
    min_ngram: int = 1
    branching: int = 2
    sibling_draws: str = "with_replacement"


#: (drafter name, "chain" or "tree") -> a factory from its settings.
DRAFTERS: dict[tuple[str, str], Callable[[DrafterSettings], Drafter | TreeDrafter]] = {
    ("ngram", "chain"): lambda s: NgramDrafter(min_ngram=s.min_ngram),
    ("ngram", "tree"): lambda s: NgramTrieDrafter(min_ngram=s.min_ngram),
    ("model", "chain"): lambda s: ModelDrafter(s.draft_model),
    ("model", "tree"): lambda s: ModelTreeDrafter(s.draft_model, s.branching, s.sibling_draws),
}
#: The drafter names, in the order the command line lists them.
DRAFTER_NAMES = tuple(dict.fromkeys(name for name, _ in DRAFTERS))
#: The drafters that draft with a second model (the command line then loads one).
NEEDS_DRAFT_MODEL = frozenset({"model"})


def make_drafter(name: str, shape: str, settings: DrafterSettings) -> Drafter | TreeDrafter:
    """The drafter `name` for chains or trees (shape "chain" or "tree"), built from settings. Raises
    ValueError for an unknown name or shape."""
    if (name, shape) not in DRAFTERS:
        raise ValueError(f"drafter must be one of {', '.join(map(repr, DRAFTER_NAMES))} for {shape}s (got {name!r})")
    return DRAFTERS[name, shape](settings)
