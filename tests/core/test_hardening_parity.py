"""Parity: identical results for torch thread counts 1 and 2, and on a CUDA device the CPU's (the CUDA test
skips cleanly without a device). The device check, specverify.check, is tests/check/test_device_check.py."""

from __future__ import annotations

import pytest
import torch

import specverify as sv
from tests.support.backends import HAS_CUDA, native_available
from tests.support.invariants import outputs_equal

# ---------------------------------------------------------------------------------------------------------
# Thread counts


def _call(batch: int, positions: int, vocab: int, mode: str, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)

    def pick(values, dtype):
        return torch.tensor(values, dtype=dtype)[torch.randint(0, len(values), (batch,), generator=g)]

    logits = torch.randn(batch, positions + 1, vocab, generator=g) * 2
    allowed = torch.rand(batch, positions + 1, vocab, generator=g) < 0.8
    allowed.scatter_(-1, logits.argmax(-1, keepdim=True), True)
    args = dict(
        draft_tokens=torch.where(
            torch.rand(batch, positions, generator=g) < 0.5,
            logits[:, :positions].argmax(-1),
            torch.randint(0, vocab, (batch, positions), generator=g),
        ),
        target_logits=logits,
        temperature=pick([0.0, 0.6, 1.0, 1.7], torch.float32),
        top_k=pick([-1, 1, 20, vocab // 3, vocab], torch.int64),
        max_k=None,
        top_p=pick([1.0, 0.9, 0.5, 0.01], torch.float32),
        min_top_p=None,
        seed=torch.randint(-(2**63), 2**63 - 1, (batch,), generator=g),
        token_bitmasks=sv.pack_bitmask(allowed),
        min_p=pick([0.0, 0.05, 0.5], torch.float32),
    )
    if mode in ("sampled", "block"):
        q = torch.softmax(torch.randn(batch, positions, vocab, generator=g) * 2, -1)
        q[::4] = 0.0
        args.update(draft_proposal="sampled", draft_probs_full=q, verification="token" if mode == "sampled" else mode)
    elif mode == "relaxed":
        args.update(in_thinking_phase=torch.rand(batch, generator=g) < 0.5, relaxed_topk=4, relaxed_delta=0.2)
    return args


def _everything(args: dict):
    """The verifier (validate True and False), truncated_probs and sample on the same rows."""
    batch, positions = args["draft_tokens"].shape
    vocab = args["target_logits"].shape[-1]

    def flat(t):
        return t.repeat_interleave(positions + 1)

    rows = (
        args["target_logits"].reshape(-1, vocab),
        flat(args["temperature"]),
        flat(args["top_k"]),
        flat(args["top_p"]),
    )
    mask = args["token_bitmasks"].reshape(batch * (positions + 1), -1)
    return (
        *sv.stochastic_acceptance_sampler(**args),
        *sv.stochastic_acceptance_sampler(**args, validate=False),
        sv.truncated_probs(*rows, flat(args["min_p"]), mask),
        sv.sample(*rows, torch.arange(rows[0].shape[0]), min_p=flat(args["min_p"]), token_bitmask=mask),
    )


def _with_threads(count: int, function, *args):
    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        return function(*args)
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("mode", ["argmax", "sampled", "relaxed", "block"])
@pytest.mark.parametrize("shape", [(64, 4, 50), (16, 3, 5000), (2, 1, 200_000)], ids=["V=50", "V=5000", "V=200000"])
def test_one_and_two_threads_give_identical_results(code_path, mode, shape):
    args = _call(*shape, mode)
    one = _with_threads(1, _everything, args)
    two = _with_threads(2, _everything, args)
    assert outputs_equal(one, two), f"thread count changed the results ({code_path}, {mode}, {shape})"
    assert torch.get_num_threads() >= 1


@pytest.mark.skipif(not native_available(), reason="the compiled CPU kernels are not available")
@pytest.mark.parametrize("mode", ["argmax", "sampled", "block"])
def test_kernels_built_without_openmp_give_identical_results(monkeypatch, tmp_path, mode):
    """Where torch does not run on GNU OpenMP the kernels are built without it and a Python thread pool
    splits the rows: the same results, bit for bit."""
    from specverify.kernels import native

    args = _call(16, 3, 5000, mode)
    threaded = _everything(args)
    assert native.load().specverify_threads_itself == (native.torch_openmp_runtime() is not None)
    monkeypatch.setenv("SPECVERIFY_CACHE", str(tmp_path))
    monkeypatch.setattr(native, "torch_openmp_runtime", lambda: None)
    native.load.cache_clear()
    try:
        assert not native.load().specverify_threads_itself
        assert outputs_equal(_with_threads(2, _everything, args), threaded)
    finally:
        native.load.cache_clear()


@pytest.mark.parametrize("mode", ["argmax", "sampled"])
def test_calls_from_several_threads_at_once_match_sequential_calls(code_path, mode):
    """Each Python thread has its own scratch buffer (and, with OpenMP, its own thread team)."""
    import threading

    calls = [_call(8, 3, 3000, mode, seed=seed) for seed in range(4)]
    expected = [sv.stochastic_acceptance_sampler(**args) for args in calls]
    mismatches = []

    def worker(index: int) -> None:
        for _ in range(10):
            if not outputs_equal(sv.stochastic_acceptance_sampler(**calls[index]), expected[index]):
                mismatches.append(index)

    threads = [threading.Thread(target=worker, args=(index,)) for index in range(len(calls))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not mismatches


def test_thread_count_is_restored():
    before = torch.get_num_threads()
    _with_threads(1, lambda: None)
    assert torch.get_num_threads() == before


# ---------------------------------------------------------------------------------------------------------
# CUDA against the CPU


@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")
@pytest.mark.parametrize("mode", ["argmax", "sampled", "relaxed"])
def test_cuda_matches_cpu_on_ordinary_inputs(mode):
    args = _call(32, 3, 3000, mode)
    cpu = sv.stochastic_acceptance_sampler(**args)
    cuda = sv.stochastic_acceptance_sampler(
        **{k: v.cuda() if isinstance(v, torch.Tensor) else v for k, v in args.items()}
    )
    assert outputs_equal(cpu, tuple(t.cpu() for t in cuda))
