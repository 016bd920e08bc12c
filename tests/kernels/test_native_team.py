"""The last rows of a CPU verifier call with few rows, weighed by the whole team (kernels.c's team_rows), give
the tokens one thread gives, bit for bit.

A B = 1, K = 4 call has five rows; on two threads one thread would weigh three. Instead each thread weighs
two and the team weighs the fifth together: each thread a share of its blocks, met at barriers for the row's
max, weight, nucleus search and block sums. Here every call runs with the team on and off (the test hook
specverify_team) and the outputs are compared bit for bit, while the hook specverify_team_rows says how many
rows the team weighed (none off, the left-over rows on: the mechanism ran). The rows: top-p alone (a wide
nucleus, a flat row, ties, the largest float32 below 1), temperature only, min-p alone and with top-p, -inf
masks, NaN, a row whose max is tied across the parts, and rows whose nucleus search must fall back to
nucleus_threshold; argmax, sampled and block modes; two and three threads.
"""

from __future__ import annotations

import pytest
import torch

import specverify as sv
from tests.support.backends import native_available
from tests.support.native_hooks import hook_set, read_count, torch_threads
from tests.support.nucleus_rows import two_level_rows

pytestmark = pytest.mark.skipif(not native_available(), reason="the compiled CPU kernels are unavailable")


def team(on: bool):
    """A call's last rows may be weighed by the whole team (on, the default) or each by one thread."""
    return hook_set("specverify_team", int(on), 1)


def team_rows() -> int:
    """How many rows the team weighed since the last call."""
    return read_count("specverify_team_rows")


def fallbacks() -> int:
    """How many sifted rows took nucleus_threshold's threshold since the last call."""
    return read_count("specverify_sift_fallbacks")


def _logits(kind: str, rows: int, vocab: int, g: torch.Generator) -> torch.Tensor:
    x = torch.randn(rows, vocab, generator=g) * 2
    if kind == "heavy":  # the benchmark's rows: a few heavy tokens over a Gaussian tail
        head = torch.randint(0, vocab, (rows, 8), generator=g)
        x.scatter_add_(1, head, torch.rand(rows, 8, generator=g) * 8 + 4)
    elif kind == "flat":  # the nucleus is most of the vocabulary
        x *= 0.05
    elif kind == "ties":  # integer logits, the max tied across every part
        x = torch.randint(-6, 3, (rows, vocab), generator=g).float()
    elif kind == "masked":  # -inf over most tokens; the last row's max in its last block only
        x[torch.rand(rows, vocab, generator=g) < 0.7] = float("-inf")
        x[-1, : vocab - 100] = float("-inf")
    elif kind == "nan":  # NaN logits (validate=False lets them through): never the max, never kept
        x[torch.rand(rows, vocab, generator=g) < 0.01] = float("nan")
    elif kind == "all -inf":  # no finite max: the rows weigh nothing but the draw's fallback
        x[-1] = float("-inf")
    return x


def _call(logits, requests, drafted, rules, mode, g, seed=5):
    vocab = logits.shape[-1]
    arguments = dict(
        draft_tokens=torch.randint(0, vocab, (requests, drafted), generator=g),
        target_logits=logits.view(requests, drafted + 1, vocab),
        temperature=torch.full((requests,), rules["temperature"]),
        top_k=torch.full((requests,), rules.get("top_k", -1)),
        max_k=None,
        top_p=torch.full((requests,), rules.get("top_p", 1.0)),
        min_top_p=None,
        seed=seed,
        validate=False,
    )
    if "min_p" in rules:
        arguments["min_p"] = torch.full((requests,), rules["min_p"])
    if mode != "argmax":
        draft = torch.softmax(torch.randn(requests, drafted, vocab, generator=g) * 2, -1)
        arguments.update(draft_proposal="sampled", draft_probs_full=draft)
        if mode == "block":
            arguments["verification"] = "block"
    return sv.stochastic_acceptance_sampler(**arguments)


def _compare(logits, requests, drafted, rules, mode, count, g) -> int:
    """The call with the team on and off: the same outputs bit for bit, `count` rows weighed by the team, and
    as many rows whose nucleus search fell back (its estimates, summed over the parts, steer it as well);
    returns how many."""
    state = g.get_state()
    team_rows()
    fallbacks()
    with torch_threads(count["threads"]):
        together = _call(logits, requests, drafted, rules, mode, g)
        weighed, fell_back = team_rows(), fallbacks()
        g.set_state(state)
        with team(False):
            alone = _call(logits, requests, drafted, rules, mode, g)
        assert team_rows() == 0
    assert weighed == count["rows"], f"the team weighed {weighed} rows, expected {count['rows']}"
    assert fell_back == fallbacks(), "the team's nucleus search certified other rows than one thread's"
    for name, a, b in zip(("first_rejected_idx", "recovered_tokens", "bonus_tokens"), together, alone):
        assert torch.equal(a, b), f"{name}: {a.tolist()} with the team, {b.tolist()} without"
    return fell_back


#: (requests, drafted positions, V, threads, rows the team weighs): 5 rows on 2 threads (the fifth), 3 rows (the
#: third), 5 rows on 3 threads (the last two, in three parts each), 7 rows of a V that ends in a partial block.
SHAPES = [(1, 4, 128256, 2, 1), (1, 2, 32000, 2, 1), (3, 0, 24000, 2, 1), (1, 4, 50000, 3, 2), (1, 6, 10000, 2, 1)]
RULES = {
    "top-p 0.95": dict(temperature=1.0, top_p=0.95),
    "top-p 1e-3, T 0.7": dict(temperature=0.7, top_p=1e-3),
    "top-p below 1": dict(temperature=1.3, top_p=0.99999994),
    "temperature only": dict(temperature=0.8),
    "min-p alone": dict(temperature=1.0, min_p=0.05),
    "min-p and top-p": dict(temperature=1.0, top_p=0.9, min_p=0.1),
    "top-k of V": dict(temperature=1.0, top_p=0.9, top_k=10**6),
}


#: Each shape in each mode that can judge it (sampled and block modes need drafts).
SHAPES_AND_MODES = [
    (shape, mode) for shape in SHAPES for mode in ("argmax", "sampled", "block") if shape[1] or mode == "argmax"
]


@pytest.mark.parametrize(
    ("shape", "mode"),
    SHAPES_AND_MODES,
    ids=[f"B{s[0]} K{s[1]} V{s[2]} threads {s[3]}-{m}" for s, m in SHAPES_AND_MODES],
)
def test_team_rows_give_the_tokens_of_one_thread_bit_for_bit(shape, mode):
    requests, drafted, vocab, count, weighed = shape
    g = torch.Generator().manual_seed(vocab + drafted)
    rows = requests * (drafted + 1)
    for kind in ("heavy", "flat", "ties", "masked", "nan", "all -inf"):
        logits = _logits(kind, rows, vocab, g)
        for name, rules in RULES.items():
            try:
                _compare(logits, requests, drafted, rules, mode, {"threads": count, "rows": weighed}, g)
            except AssertionError as error:
                raise AssertionError(f"{kind} logits, {name}: {error}") from None


def test_rows_with_top_k_greedy_rows_and_many_rows_are_not_weighed_by_the_team():
    """The team weighs only dense rows (no top-k, not greedy) of calls of few rows; the rest as before."""
    g = torch.Generator().manual_seed(3)
    logits = _logits("heavy", 5, 32000, g)
    cases = [
        (1, 4, dict(temperature=1.0, top_p=0.9, top_k=50)),  # top-k: weighed sparsely
        (1, 4, dict(temperature=0.0)),  # greedy rows: their argmax is split instead
    ]
    for requests, drafted, rules in cases:
        _compare(logits, requests, drafted, rules, "argmax", {"threads": 2, "rows": 0}, g)
    many = _logits("heavy", 9, 32000, g)  # 9 rows: more than 4 a thread
    _compare(many, 1, 8, dict(temperature=1.0, top_p=0.9), "argmax", {"threads": 2, "rows": 0}, g)


def test_a_team_row_whose_search_is_not_certified_takes_nucleus_thresholds_threshold():
    """Rows whose crossing lies within the search's margin fall back to nucleus_threshold (test_native_sift's
    two-level rows, padded with -inf to a width the team splits); the team's row falls back too, with the
    same tokens."""
    g = torch.Generator().manual_seed(11)
    for name, row, top_p, d in two_level_rows(inside=True):
        width = max(row.shape[1], 16384)
        padded = torch.full((1, width), float("-inf"))
        padded[0, : row.shape[1]] = row[0]
        logits = padded.repeat(3, 1)[:, torch.randperm(width, generator=g)]
        rules = dict(temperature=1.0, top_p=top_p)
        fell_back = _compare(logits, 1, 2, rules, "argmax", {"threads": 2, "rows": 1}, g)
        assert fell_back == 3, f"{name} (d {d:.3g}): {fell_back} of 3 rows fell back"
