"""The verifier under audit: any callable with the `stochastic_acceptance_sampler` signature (SPEC §1),
or with the `tree_acceptance_sampler` signature (SPEC §8), a tree verifier.

The audit calls it as a user would: the leading arguments by position (eight for a chain verifier, seven
for a tree verifier), the optional ones by their SPEC names, and only those a scenario needs, so an
implementation that lacks an extension (`min_p`) is still audited on everything else (the scenarios that
need it are reported as skipped). A verifier is a tree verifier when its signature has a parameter named
`parents` (SPEC §8's second argument), or when the audit is told so (`specverify audit --tree`).
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

#: The keyword arguments past the eight positional ones that the audit may pass.
OPTIONAL_ARGUMENTS = (
    "in_thinking_phase",
    "relaxed_topk",
    "relaxed_delta",
    "token_bitmasks",
    "draft_proposal",
    "draft_probs_full",
    "min_p",
    "verification",
)
#: The same for a tree verifier (SPEC §8), past its seven positional arguments.
TREE_OPTIONAL_ARGUMENTS = ("min_p", "token_bitmasks", "draft_proposal", "draft_probs", "sibling_draws")
DEFAULT_VERIFIER = "specverify:stochastic_acceptance_sampler"
DEFAULT_TREE_VERIFIER = "specverify:tree_acceptance_sampler"
CHAIN_OUTPUTS = ("first_rejected_idx", "recovered_tokens", "bonus_tokens")
TREE_OUTPUTS = ("path", "path_length", "next_token")
#: The leading arguments, passed by position: of a chain verifier (SPEC §1) and of a tree verifier (SPEC §8).
POSITIONAL_ARGUMENTS = ("draft_tokens", "target_logits", "temperature", "top_k", "max_k", "top_p", "min_top_p", "seed")
TREE_POSITIONAL_ARGUMENTS = ("draft_tokens", "parents", "target_logits", "temperature", "top_k", "top_p", "seed")
NUMBER_WORDS = {7: "seven", 8: "eight"}


@dataclass(frozen=True)
class Verifier:
    """A verifier function, the name it was loaded by, the optional arguments it takes, and whether it
    verifies trees (SPEC §8) rather than chains."""

    function: Callable
    name: str
    accepts: frozenset[str]
    tree: bool = False

    def lacks(self, arguments: dict) -> list[str]:
        """The optional arguments of a call that this verifier does not take."""
        return sorted(set(arguments) - self.accepts)

    def __call__(self, *positional, **optional):
        """The positional arguments of SPEC §1 (or §8 for a tree verifier) and the optional ones by name ->
        its three outputs as int64 tensors on the CPU; TypeError unless it returned three integer tensors."""
        outputs = self.function(*positional, **optional)
        if not isinstance(outputs, (tuple, list)) or len(outputs) != 3:
            raise TypeError(f"{self.name} must return three tensors (got {type(outputs).__name__})")
        outputs = [torch.as_tensor(out) for out in outputs]
        for name, out in zip(TREE_OUTPUTS if self.tree else CHAIN_OUTPUTS, outputs):
            if out.is_floating_point() or out.is_complex() or out.dtype == torch.bool:
                raise TypeError(f"{self.name} must return integer tensors (got {out.dtype} for {name})")
        return tuple(out.detach().to("cpu", torch.int64) for out in outputs)


def as_verifier(function: Callable, name: str | None = None, tree: bool | None = None) -> Verifier:
    """Wrap a callable; the optional arguments it takes are read from its signature (all, if it has
    **kwargs or no readable signature). tree: whether it verifies trees; None reads it from the signature
    (a parameter named `parents`)."""
    if not callable(function):
        raise TypeError(f"verifier must be callable (got {type(function).__name__})")
    name = name or f"{getattr(function, '__module__', '?')}:{getattr(function, '__qualname__', repr(function))}"
    try:
        parameters = list(inspect.signature(function).parameters.values())
    except (TypeError, ValueError):
        parameters = None
    if tree is None:
        tree = parameters is not None and any(p.name == "parents" for p in parameters)
    optional = frozenset(TREE_OPTIONAL_ARGUMENTS if tree else OPTIONAL_ARGUMENTS)
    if parameters is None or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return Verifier(function, name, optional, tree)
    return Verifier(function, name, frozenset(p.name for p in parameters) & optional, tree)


def load_verifier(spec: str, tree: bool | None = None) -> Verifier:
    """'module:function' (the current directory is importable) or 'path/to/file.py:function'; tree as in
    as_verifier.

    ValueError, saying why, when the spec names nothing, something that is not callable, or a callable
    that cannot take the positional arguments of stochastic_acceptance_sampler (tree_acceptance_sampler
    for a tree verifier)."""
    module_name, sep, attribute = spec.rpartition(":")
    if not sep or not module_name or not attribute:
        raise ValueError(f"verifier must be 'module:function' or 'file.py:function' (got {spec!r})")
    module = _import_file(Path(module_name)) if module_name.endswith(".py") else _import_module(module_name)
    function = module
    for part in attribute.split("."):
        if not hasattr(function, part):
            raise ValueError(f"verifier {spec!r}: {module_name} has no attribute {attribute!r}")
        function = getattr(function, part)
    if tree is None:
        tree = _has_parameter(function, "parents")
    check_signature(function, spec, tree)
    return as_verifier(function, spec, tree)


def _has_parameter(function: object, name: str) -> bool:
    """Whether `function`'s readable signature has a parameter called `name`."""
    try:
        return name in inspect.signature(function).parameters
    except (TypeError, ValueError):
        return False


def check_signature(function: object, name: str, tree: bool = False) -> None:
    """ValueError unless `function` is callable with the positional arguments of stochastic_acceptance_sampler
    (tree: of tree_acceptance_sampler); a callable whose signature cannot be read is given the benefit."""
    reference, arguments = (
        ("tree_acceptance_sampler", TREE_POSITIONAL_ARGUMENTS)
        if tree
        else ("stochastic_acceptance_sampler", POSITIONAL_ARGUMENTS)
    )
    if not callable(function):
        raise ValueError(
            f"verifier {name!r} is a {type(function).__name__}, not a function: name a callable with the "
            f"{reference} signature"
        )
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):
        return
    try:
        signature.bind(*arguments)
    except TypeError as err:
        empty = inspect.Parameter.empty
        bare = signature.replace(
            parameters=[p.replace(annotation=empty) for p in signature.parameters.values()], return_annotation=empty
        )
        raise ValueError(
            f"verifier {name!r} takes {bare} ({err}), not the {NUMBER_WORDS[len(arguments)]} positional arguments of "
            f"{reference} ({', '.join(arguments)})"
        ) from None


def _import_module(name: str):
    if "" not in sys.path and str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as err:
        raise ValueError(f"verifier module {name!r} cannot be imported ({err})") from None


def _import_file(path: Path):
    if not path.is_file():
        raise ValueError(f"verifier file {str(path)!r} does not exist")
    name = f"specverify_audited_{path.stem}"  # registered (dataclasses need it) without shadowing a module
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
