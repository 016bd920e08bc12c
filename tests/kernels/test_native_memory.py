"""An allocation the C kernels cannot make is a Python MemoryError naming the kernel and the bytes asked,
never a crash: kernels.c refuses every allocation above a limit a test sets
(specverify_refuse_allocations_above), and each entry point hands the refusal back through its result.

At V = 1000 the largest buffer a row of weigh_rows or draw_rows asks for is its scratch buffer,
scratch_size(1000) = 1000 + 64 x (1 + 4) floats (the stripe maxima of a block and of its four parts, more
than the 1000 / 4 + 1 of gather_between's flags) = 5280 bytes; the next largest holds 1000 floats (4000
bytes), so a limit of 4500 refuses the scratch buffer alone, whichever threads ask.
"""

from __future__ import annotations

import pytest
import torch

import specverify
from specverify.contract import BOUNDARY_RTOL, GREEDY_TEMPERATURE
from specverify.kernels import block_size, native
from tests.support.backends import native_available
from tests.support.native_hooks import hook_set

pytestmark = pytest.mark.skipif(not native_available(), reason="the compiled CPU kernels are unavailable")

VOCAB = 1000
#: scratch_size(VOCAB) floats, the one buffer above LIMIT.
SCRATCH_BYTES = 5280
LIMIT = 4500


def allocations_refused_above(limit: int):
    """kernels.c refuses every allocation above `limit` bytes inside the block."""
    return hook_set("specverify_refuse_allocations_above", limit, 2**64 - 1)


def _params(requests: int):
    return (
        torch.full((requests,), 0.8),
        torch.full((requests,), 50, dtype=torch.int64),
        torch.full((requests,), 0.9),
    )


def test_weigh_rows_raises_memory_error_naming_the_bytes():
    rows = 4
    logits = torch.randn(rows, VOCAB)
    temperature, top_k, top_p = _params(rows)
    out = torch.empty(rows, VOCAB)
    arguments = (logits, temperature, GREEDY_TEMPERATURE, top_k, top_p, None, BOUNDARY_RTOL, block_size(VOCAB), out)
    with allocations_refused_above(LIMIT), pytest.raises(MemoryError) as raised:
        native.weigh_rows(*arguments)
    assert str(raised.value) == f"specverify: the C kernel weigh_rows could not allocate {SCRATCH_BYTES} bytes"
    native.weigh_rows(*arguments)  # the limit lifted, the same call runs


@pytest.fixture(params=["openmp", "thread pool"])
def threading(request, monkeypatch, tmp_path):
    """The kernels as loaded (OpenMP on torch's runtime where torch has one), or a build without OpenMP,
    whose calls a Python thread pool splits (a refusal then comes back from a pool thread)."""
    if request.param == "thread pool":
        monkeypatch.setenv("SPECVERIFY_CACHE", str(tmp_path))
        monkeypatch.setattr(native, "torch_openmp_runtime", lambda: None)
        native.load.cache_clear()
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        yield request.param
    finally:
        torch.set_num_threads(threads)
        native.load.cache_clear()


@pytest.mark.parametrize("batch", [1, 16])
def test_a_verifier_call_raises_memory_error_and_the_process_goes_on(batch, threading):
    drafted = 3
    generator = torch.Generator().manual_seed(batch)
    logits = torch.randn(batch, drafted + 1, VOCAB, generator=generator)
    draft = torch.randint(0, VOCAB, (batch, drafted), generator=generator)
    temperature, top_k, top_p = _params(batch)
    arguments = (draft, logits, temperature, top_k, None, top_p, None, 7)
    with allocations_refused_above(LIMIT), pytest.raises(MemoryError) as raised:
        specverify.stochastic_acceptance_sampler(*arguments)
    assert str(raised.value) == f"specverify: the C kernel draw_rows could not allocate {SCRATCH_BYTES} bytes"
    first, recovered, bonus = specverify.stochastic_acceptance_sampler(*arguments)
    assert first.shape == (batch,) and recovered.shape == (batch, drafted) and bonus.shape == (batch, 1)


@pytest.mark.parametrize("verification", ["token", "block"])
def test_sampled_verdicts_raise_memory_error_for_their_own_buffers(verification):
    """draw_sampled_verdicts' (and block verification's draw_block_verdicts') kept lists ([rows,
    KEPT_CAPACITY] int32 and float32: 4 rows * 1024 * 4 bytes) are the largest it asks for itself; the
    same call runs once the limit is lifted."""
    batch, drafted = 1, 3
    generator = torch.Generator().manual_seed(3)
    logits = torch.randn(batch, drafted + 1, VOCAB, generator=generator)
    draft = torch.randint(0, VOCAB, (batch, drafted), generator=generator)
    draft_probs = torch.softmax(torch.randn(batch, drafted, VOCAB, generator=generator), -1)
    temperature, top_k, top_p = _params(batch)
    kept_bytes = (drafted + 1) * native.KEPT_CAPACITY * 4
    arguments = (draft, logits, temperature, top_k, None, top_p, None, 7)
    options = dict(draft_proposal="sampled", draft_probs_full=draft_probs, verification=verification)
    with allocations_refused_above(kept_bytes - 1), pytest.raises(MemoryError) as raised:
        specverify.stochastic_acceptance_sampler(*arguments, **options)
    kernel = "draw_block_verdicts" if verification == "block" else "draw_sampled_verdicts"
    assert str(raised.value) == f"specverify: the C kernel {kernel} could not allocate {kept_bytes} bytes"
    assert specverify.stochastic_acceptance_sampler(*arguments, **options)[1].shape == (batch, drafted)
