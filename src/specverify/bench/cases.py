"""What the benchmark times, as typed cases: the groups `--modes` names (`Mode`), each case's role beside the
others (`Role`: what is measured of it beyond its time) and the cases themselves, in the order they are shown."""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass
from enum import Enum

import torch

from .. import kernels, stochastic_acceptance_sampler, tree_acceptance_sampler
from .inputs import TREE_WIDTH, Batch, make_batch, make_tree
from .peers import flashinfer_calls, max_verifier, sort_based_baseline


class Mode(Enum):
    """A group of cases `--modes` names; its value is the word the flag takes."""

    ARGMAX = "argmax"
    SAMPLED = "sampled"
    RELAXED = "relaxed"
    GREEDY = "greedy"
    SORT = "sort"
    TREE = "tree"


class Role(Enum):
    """What a case is beside the others; it decides what is measured of the case beyond its time."""

    FLOOR = "one read of the logits: the unit of the x amax column"
    SOFTMAX = "one torch.softmax: the unit of the x softmax column"
    VERIFIER = "the verifier on the benchmark's batch: its peak memory, and its passes where metered"
    TORCH_PATH = "the verifier forced onto the torch reference ops: its peak memory"
    TREE = "a tree verification, or the chain of as many nodes, on the tree's batch"
    PEER = "what others run in the verifier's place"

    @property
    def measures_memory(self) -> bool:
        """Whether the peak memory of one call is measured (the verifier's chain calls at the batch's shape)."""
        return self in (Role.VERIFIER, Role.TORCH_PATH)

    @property
    def meters_traffic(self) -> bool:
        """Whether --traffic meters the call's passes over the logits on the Triton kernels."""
        return self is Role.VERIFIER


@dataclass(frozen=True)
class Case:
    """One timed case: its name (a row of the table, a key of the JSON), the call and its role."""

    name: str
    run: Callable[[], object]
    role: Role


#: The chain cases of each verifier mode at the batch's shape: (name, validate) each.
CHAIN_CASES = {
    Mode.ARGMAX: (("argmax, validate=False", False), ("argmax, validate=True", True)),
    Mode.SAMPLED: (("sampled, validate=False", False),),
    Mode.RELAXED: (("relaxed, every row thinking", False),),
    Mode.GREEDY: (("all greedy, validate=False", False), ("all greedy, validate=True", True)),
}
#: The modes also timed on the torch reference ops, where the device's own backend is another.
TORCH_PATH_MODES = (Mode.ARGMAX, Mode.SAMPLED)


def _mode_arguments(batch: Batch, mode: Mode) -> dict:
    """The verifier's keyword arguments that make a chain call of `mode`."""
    if mode is Mode.SAMPLED:
        return {"draft_proposal": "sampled", "draft_probs_full": batch.draft_probs}
    if mode is Mode.RELAXED:  # every request in its thinking phase: top-3, delta 0.3
        return {
            "in_thinking_phase": torch.ones_like(batch.temperature, dtype=torch.bool),
            "relaxed_topk": 3,
            "relaxed_delta": 0.3,
        }
    return {}


def verifier_call(batch: Batch, mode: Mode, validate: bool, backend: str | None = None) -> Callable[[], object]:
    """One chain verifier call of `mode` on the batch (GREEDY: every row at temperature 0); backend: force one
    (SPECVERIFY_BACKEND) for the call, else the device's."""
    temperature = torch.zeros_like(batch.temperature) if mode is Mode.GREEDY else batch.temperature
    extra = _mode_arguments(batch, mode)

    def run() -> object:
        with kernels.forced(backend):
            return stochastic_acceptance_sampler(
                batch.draft_tokens,
                batch.target_logits,
                temperature,
                batch.top_k,
                None,
                batch.top_p,
                None,
                batch.seed,
                validate=validate,
                **extra,
            )

    return run


def _tree_call(batch: Batch, draft_tokens: torch.Tensor, parents: torch.Tensor, validate: bool) -> Callable[[], object]:
    """Argmax-mode tree verification of a Batch made with K = N positions."""
    return lambda: tree_acceptance_sampler(
        draft_tokens,
        parents,
        batch.target_logits,
        batch.temperature,
        batch.top_k,
        batch.top_p,
        batch.seed,
        validate=validate,
    )


def chain_cases(batch: Batch, modes: Collection[Mode]) -> list[Case]:
    """The verifier's chain cases of the modes asked, in CHAIN_CASES' order."""
    return [
        Case(name, verifier_call(batch, mode, validate), Role.VERIFIER)
        for mode, named in CHAIN_CASES.items()
        if mode in modes
        for name, validate in named
    ]


def torch_path_cases(batch: Batch, modes: Collection[Mode]) -> list[Case]:
    """The verifier on the torch reference ops, beside the device's own backend."""
    return [
        Case(f"{mode.value}, torch reference path", verifier_call(batch, mode, False, backend="torch"), Role.TORCH_PATH)
        for mode in TORCH_PATH_MODES
        if mode in modes
    ]


def tree_cases(batch: Batch) -> tuple[list[Case], dict]:
    """A tree of N = TREE_WIDTH * K nodes and depth K, on a batch of the same B and V made with K = N, beside
    the chain of K = N (the chains of depth K are the batch's own) -> (cases, the tree's config entries)."""
    requests, depth = batch.draft_tokens.shape
    logits = batch.target_logits
    nodes = TREE_WIDTH * depth
    wide = make_batch(requests, nodes, logits.shape[-1], logits.dtype, seed=1).to(logits.device)
    draft_tokens, parents = make_tree(wide, depth)
    _, path_length, _ = tree_acceptance_sampler(
        draft_tokens, parents, wide.target_logits, wide.temperature, wide.top_k, wide.top_p, wide.seed
    )
    config = {"tree_nodes": nodes, "tree_depth": depth, "tree_mean_path_length": float(path_length.float().mean())}
    cases = []
    for validate in (False, True):
        tree, chain = _tree_call(wide, draft_tokens, parents, validate), verifier_call(wide, Mode.ARGMAX, validate)
        cases.append(Case(f"tree N={nodes} depth {depth}, validate={validate}", tree, Role.TREE))
        cases.append(Case(f"chain K={nodes}, validate={validate}", chain, Role.TREE))
    return cases, config


def peer_cases(batch: Batch) -> tuple[list[Case], dict]:
    """MAX's verifier (CPU) and FlashInfer's samplers (CUDA), where they import -> (cases, a config entry
    saying why FlashInfer is not timed on CUDA, if it is not)."""
    device = batch.target_logits.device
    max_run = max_verifier(batch) if device.type == "cpu" else None
    calls = {} if max_run is None else {"MAX stochastic_acceptance_sampler": max_run}
    flashinfer, missing = flashinfer_calls(batch)
    calls.update(flashinfer)
    note = {"flashinfer": missing} if missing and device.type == "cuda" else {}
    return [Case(name, run, Role.PEER) for name, run in calls.items()], note


def benchmark_cases(
    batch: Batch, modes: Collection[Mode], backend: str, say: Callable[[str, bool], None]
) -> tuple[list[Case], dict]:
    """Every case of the modes asked on the batch, in the order they are timed and shown, where `backend` (its
    name) runs the verifier -> (cases, config entries about them: why FlashInfer is not timed, the tree's
    shape). say(text, True) as the tree's logits are made."""
    logits = batch.target_logits
    cases = [
        Case("read floor (amax)", lambda: logits.amax(-1), Role.FLOOR),
        Case("torch.softmax", lambda: torch.softmax(logits, dim=-1), Role.SOFTMAX),
        *chain_cases(batch, modes),
    ]
    if backend != "torch" and logits.device.type != "cpu":  # on the CPU the torch path is too slow to time here
        cases += torch_path_cases(batch, modes)
    if Mode.SORT in modes:
        cases.append(Case("sort-based baseline", lambda: sort_based_baseline(batch), Role.PEER))
    tree = {}
    if Mode.TREE in modes and batch.draft_tokens.shape[1] > 0:
        say(f"making the logits of a tree of {TREE_WIDTH * batch.draft_tokens.shape[1]} nodes", True)
        more, tree = tree_cases(batch)
        cases += more
    peers, note = peer_cases(batch)
    return cases + peers, {**note, **tree}


def memory_estimate(batch: int, positions: int, vocab: int, modes: Collection[Mode]) -> int:
    """Bytes the benchmark holds at its peak, roughly: about 4 float32 copies of the logits (the logits,
    the draft distributions, softmax's output, the verifier's scratch), 12 with the sort-based baseline
    (its sorted values, int64 order, cumulative sums and masks)."""
    copies = 12 if Mode.SORT in modes else 4
    rows = positions + 1 + (TREE_WIDTH * positions + 1 if Mode.TREE in modes else 0)  # the tree's batch beside
    return batch * rows * vocab * 4 * copies
