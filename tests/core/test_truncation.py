"""truncated_probs (SPEC §2) against the float64 oracle written from first principles."""

import itertools

import numpy as np
import pytest
import torch

import specverify as sv
from specverify.audit.exact import truncated_distribution
from tests.support.backends import backend_path, native_available


@pytest.fixture(params=["native", "torch"])
def backend(request):
    """Run a test with the compiled CPU kernels and with the torch reference path."""
    if request.param == "native" and not native_available():
        pytest.skip("no C compiler here: the compiled kernels are not available")
    with backend_path(request.param):
        yield request.param


def _case_logits(rng: np.random.Generator, vocab: int, ties: bool) -> np.ndarray:
    logits = rng.normal(0, 2, size=vocab)
    return np.round(logits) if ties else logits  # rounding makes many exact ties


def _check_rows(logits, temperature, top_k, top_p, min_p=None, allowed=None):
    """truncated_probs equals the oracle row by row: same kept set, same probabilities (float32)."""
    n, vocab = logits.shape
    bitmask = None if allowed is None else sv.pack_bitmask(torch.as_tensor(allowed))
    got = (
        sv.truncated_probs(
            torch.as_tensor(logits, dtype=torch.float32),
            torch.as_tensor(temperature, dtype=torch.float32),
            torch.as_tensor(top_k),
            torch.as_tensor(top_p, dtype=torch.float32),
            None if min_p is None else torch.as_tensor(min_p, dtype=torch.float32),
            bitmask,
        )
        .double()
        .numpy()
    )
    for row in range(n):
        want = truncated_distribution(
            logits[row].astype(np.float32),
            float(np.float32(temperature[row])),
            int(top_k[row]),
            float(np.float32(top_p[row])),
            0.0 if min_p is None else float(np.float32(min_p[row])),
            None if allowed is None else allowed[row],
        )
        params = (temperature[row], top_k[row], top_p[row], None if min_p is None else min_p[row])
        np.testing.assert_array_equal(got[row] > 0, want > 0, err_msg=f"kept set differs, row {row} {params}")
        np.testing.assert_allclose(got[row], want, atol=2e-6, rtol=1e-4, err_msg=f"row {row} {params}")


@pytest.mark.parametrize("ties", [False, True])
def test_matches_oracle_over_a_grid_of_parameters(ties, backend):
    rng = np.random.default_rng(1 + ties)
    vocab = 40
    grid = list(
        itertools.product([0.3, 1.0, 2.5], [-1, 0, 1, 3, 10, vocab, vocab + 5], [1.0, 0.9, 0.5, 0.05], [0.0, 0.1, 0.6])
    )
    logits = np.stack([_case_logits(rng, vocab, ties) for _ in grid])
    temperature, top_k, top_p, min_p = (np.array(column) for column in zip(*grid))
    _check_rows(logits, temperature, top_k, top_p, min_p)


def test_matches_oracle_with_masks_and_a_large_vocabulary(backend):
    rng = np.random.default_rng(3)
    n, vocab = 24, 5000  # large enough that radix selection works on several buckets per level
    logits = rng.normal(0, 3, size=(n, vocab))
    allowed = rng.random((n, vocab)) < 0.7
    temperature = rng.choice([0.5, 1.0, 1.7], size=n)
    top_k = rng.choice([-1, 1, 7, 100, 4000], size=n)
    top_p = rng.choice([1.0, 0.95, 0.7, 0.2], size=n)
    min_p = rng.choice([0.0, 0.01, 0.3], size=n)
    _check_rows(logits, temperature, top_k, top_p, min_p, allowed)


def test_top_k_keeps_every_token_tied_with_the_kth(backend):
    logits = torch.tensor([[2.0, 1.0, 1.0, 1.0, 0.0]])
    probs = sv.truncated_probs(logits, torch.tensor([1.0]), torch.tensor([2]), torch.tensor([1.0]))
    assert (probs[0] > 0).tolist() == [True, True, True, True, False]


def test_top_p_is_applied_after_renormalising_the_top_k(backend):
    # p = [.4, .3, .2, .1]; after top-2: [.571, .429]; top_p .5 is reached by the first token alone.
    # (On the un-renormalised p it would take two tokens: .4 < .5.)
    logits = torch.log(torch.tensor([[0.4, 0.3, 0.2, 0.1]]))
    probs = sv.truncated_probs(logits, torch.tensor([1.0]), torch.tensor([2]), torch.tensor([0.5]))
    assert probs[0].tolist() == [1.0, 0.0, 0.0, 0.0]


def test_top_p_keeps_the_token_that_reaches_the_mass_exactly(backend):
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.2]]))
    probs = sv.truncated_probs(logits, torch.tensor([1.0]), torch.tensor([-1]), torch.tensor([0.8]))
    assert (probs[0] > 0).tolist() == [True, True, False]
    torch.testing.assert_close(probs[0, :2], torch.tensor([0.625, 0.375]))


def test_top_p_keeps_ties_with_the_crossing_token(backend):
    logits = torch.log(torch.tensor([[0.4, 0.2, 0.2, 0.2]]))
    probs = sv.truncated_probs(logits, torch.tensor([1.0]), torch.tensor([-1]), torch.tensor([0.5]))
    assert (probs[0] > 0).all()


def test_min_p_keeps_tokens_at_least_min_p_times_the_max(backend):
    logits = torch.log(torch.tensor([[0.5, 0.25, 0.15, 0.1]]))
    probs = sv.truncated_probs(
        logits, torch.tensor([1.0]), torch.tensor([-1]), torch.tensor([1.0]), torch.tensor([0.3])
    )
    assert (probs[0] > 0).tolist() == [True, True, True, False]  # .15 >= .3 * .5 = .15 is kept


def test_untruncated_weights_are_exp_to_an_ulp_down_to_the_subnormals(backend):
    # the largest weight is 1 and the others add < 1e-37, so p~ is float32(exp(x - max)) itself
    gaps = [0.0, -30.0, -50.0, -87.0, -87.5, -95.0, -100.0, -103.9, -104.5, -120.0, float("-inf")]
    logits = torch.tensor([gaps]) + 3.0
    probs = sv.truncated_probs(logits, 1.0, -1, 1.0)[0].numpy()
    exact = np.exp(np.array(gaps, dtype=np.float64)).astype(np.float32)
    assert probs[0] == 1.0
    assert np.all(np.abs(probs - exact) <= np.spacing(exact)), (probs, exact)
    assert (probs > 0).tolist() == [True] * 8 + [False] * 3


def test_greedy_rows_are_one_hot_at_the_first_argmax():
    logits = torch.tensor([[0.0, 3.0, 3.0, 1.0], [5.0, 1.0, 1.0, 5.0]])
    allowed = torch.tensor([[True] * 4, [False, True, True, True]])
    probs = sv.truncated_probs(logits, torch.tensor([0.0, 1e-6]), -1, 1.0, token_bitmask=sv.pack_bitmask(allowed))
    assert probs.tolist() == [[0.0, 1.0, 0.0, 0.0], [0.0, 0.0, 0.0, 1.0]]


def test_the_most_likely_token_always_survives():
    logits = torch.tensor([[10.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
    probs = sv.truncated_probs(logits, 1.0, torch.tensor([1, 1]), torch.tensor([1e-9, 1e-9]), torch.tensor([1.0, 1.0]))
    assert probs[0, 0] == 1.0 and probs[1].sum() == pytest.approx(1.0) and probs[1, 0] > 0


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_logits_equal_their_float32_upcast(dtype):
    rng = np.random.default_rng(4)
    logits = torch.as_tensor(rng.normal(0, 2, size=(16, 300)), dtype=dtype)
    params = (torch.full((16,), 0.8), torch.full((16,), 50), torch.full((16,), 0.9))
    torch.testing.assert_close(
        sv.truncated_probs(logits, *params), sv.truncated_probs(logits.float(), *params), rtol=0, atol=0
    )


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_every_half_precision_value_reads_as_its_float32_upcast(backend, dtype):
    # one row [h, 0] per bit pattern h, at a temperature of the row's own scale, so that reading h wrongly
    # by one ulp moves p~ visibly; the compiled kernels read half precision themselves
    patterns = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16).view(dtype)
    logits = torch.stack([patterns, torch.zeros_like(patterns)], dim=-1)
    temperature = logits[:, 0].float().abs().nan_to_num(1.0, posinf=1.0).clamp(min=1e-3, max=1e4)
    half = sv.truncated_probs(logits, temperature, -1, 1.0, validate=False)
    upcast = sv.truncated_probs(logits.float(), temperature, -1, 1.0, validate=False)
    assert torch.equal(half.nan_to_num(-1.0), upcast.nan_to_num(-1.0))
    greedy = sv.sample(logits, 0.0, -1, 1.0, seed=0, validate=False)
    assert torch.equal(greedy, sv.sample(logits.float(), 0.0, -1, 1.0, seed=0, validate=False))


def test_no_full_vocabulary_sort_is_used(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("truncation must not sort the vocabulary")

    monkeypatch.setattr(torch, "sort", refuse)
    monkeypatch.setattr(torch, "argsort", refuse)
    monkeypatch.setattr(torch.Tensor, "sort", refuse)
    monkeypatch.setattr(torch.Tensor, "argsort", refuse)
    logits = torch.randn(4, 1000, generator=torch.Generator().manual_seed(0))
    probs = sv.truncated_probs(logits, 1.0, torch.tensor([0, 5, 0, 900]), torch.tensor([0.9, 1.0, 0.5, 0.99]))
    assert torch.allclose(probs.sum(-1), torch.ones(4))


def test_both_backends_sample_the_same_tokens():
    g = torch.Generator().manual_seed(8)
    logits = torch.randn(64, 3000, generator=g) * 3
    params = (
        torch.rand(64, generator=g) + 0.2,
        torch.tensor([0, 5, 60, 5000] * 16),
        torch.tensor([1.0, 0.9, 0.5, 0.99] * 16),
    )
    compiled = sv.sample(logits, *params, torch.arange(64))
    with backend_path("torch"):
        assert torch.equal(sv.sample(logits, *params, torch.arange(64)), compiled)


def test_calls_in_and_out_of_inference_mode_and_on_logits_that_require_grad():
    logits = torch.randn(3, 2000, generator=torch.Generator().manual_seed(9))
    with torch.inference_mode():
        inside = sv.truncated_probs(logits, 1.0, 5, 0.9)
    assert torch.equal(sv.truncated_probs(logits, 1.0, 5, 0.9), inside)
    assert torch.equal(sv.sample(logits.clone().requires_grad_(), 1.0, 5, 0.9, 1), sv.sample(logits, 1.0, 5, 0.9, 1))
