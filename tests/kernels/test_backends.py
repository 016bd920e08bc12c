"""The backend dispatch (kernels/): chosen by device, forced by SPECVERIFY_BACKEND, clear errors, and a
one-time warning naming the cause and the fix when the compiled CPU kernels cannot be built."""

from __future__ import annotations

import json
import os
import warnings

import pytest
import torch

import specverify as sv
from specverify import kernels
from specverify.cli import main
from specverify.kernels import native
from specverify.kernels.backend import ROW_OPS, WHOLE_CALL_OPS
from tests.support.backends import backend_path, native_available, triton_available
from tests.support.invariants import check_output_invariants


def _call():
    g = torch.Generator().manual_seed(4)
    logits = torch.randn(3 * 4, 300, generator=g)
    return sv.stochastic_acceptance_sampler(
        torch.randint(0, 300, (3, 3), generator=g),
        logits,
        torch.tensor([0.7, 1.0, 0.0]),
        torch.tensor([20, -1, -1]),
        None,
        torch.tensor([0.9, 1.0, 1.0]),
        None,
        torch.tensor([1, 2, 3]),
    )


@pytest.mark.skipif(not native_available(), reason="the compiled CPU kernels are unavailable")
def test_cpu_tensors_run_the_compiled_kernels_by_default(monkeypatch):
    monkeypatch.delenv("SPECVERIFY_BACKEND", raising=False)
    assert kernels.backend_for(torch.zeros(1)) is native.BACKEND


def test_the_environment_forces_a_backend_for_every_op(monkeypatch):
    with backend_path("torch"):
        assert kernels.backend_for(torch.zeros(1)) is kernels.TORCH
        calls = []
        monkeypatch.setattr(native, "weigh_rows", lambda *args: calls.append(args))
        monkeypatch.setattr(native, "sample_rows", lambda *args: calls.append(args))
        monkeypatch.setattr(native, "argmax_rows", lambda *args: calls.append(args))
        _call()
        assert not calls, "a compiled kernel ran with SPECVERIFY_BACKEND=torch"


@pytest.mark.parametrize("value", ["cuda", "Torch", "c"])
def test_an_unknown_backend_is_a_clear_error(value):
    with (
        backend_path(value),
        pytest.raises(ValueError, match=f"SPECVERIFY_BACKEND must be one of torch, native, triton \\(got '{value}'\\)"),
    ):
        _call()


def test_a_forced_backend_that_cannot_run_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(native, "load", lambda: None)
    monkeypatch.setattr(native, "unavailable_because", "no C compiler found (neither $CC, cc nor gcc)")
    with (
        backend_path("native"),
        pytest.raises(
            RuntimeError,
            match="SPECVERIFY_BACKEND=native, but the compiled CPU kernels are unavailable: no C compiler found",
        ),
    ):
        _call()
    with (
        backend_path("native"),
        pytest.raises(RuntimeError, match="SPECVERIFY_BACKEND=native runs on CPU tensors only"),
    ):
        kernels.backend_for(torch.zeros(1, device="meta"))


def test_each_backend_declares_what_it_can_do(each_backend):
    """Every backend has every op of kernels/interface.py, whole-call and per-row."""
    declared = kernels.backend_for(torch.zeros(1))
    assert declared.name == each_backend
    assert all(callable(getattr(declared.ops, op)) for op in WHOLE_CALL_OPS + ROW_OPS)


def test_a_backend_missing_a_declared_op_fails_when_it_is_declared():
    from types import SimpleNamespace

    ops = SimpleNamespace(__name__="partial", **{op: print for op in ROW_OPS if op != "scan_rows"})
    with pytest.raises(
        TypeError,
        match="backend 'partial' lacks ops of kernels/interface.py in its module partial: verify_chain, verify_tree, scan_rows",
    ):
        kernels.Backend(name="partial", ops=ops)


def _fresh_load(monkeypatch, tmp_path):
    """native.load() as on a machine where nothing is cached yet (its cache cleared again afterwards)."""
    monkeypatch.setenv("SPECVERIFY_CACHE", str(tmp_path))
    monkeypatch.delenv("SPECVERIFY_NATIVE", raising=False)
    native.load.cache_clear()
    monkeypatch.setattr(native, "unavailable_because", None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        library = native.load()
        again = native.load()
    native.load.cache_clear()
    return library, again, [w for w in caught if "specverify" in str(w.message)]


def test_no_c_compiler_warns_once_naming_the_cause_and_the_fix(monkeypatch, tmp_path):
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.setattr(native.shutil, "which", lambda name: None)
    library, again, caught = _fresh_load(monkeypatch, tmp_path)
    assert library is None and again is None
    assert len(caught) == 1, [str(w.message) for w in caught]
    message = str(caught[0].message)
    assert (
        "no C compiler found" in message and "install a C compiler" in message and "SPECVERIFY_BACKEND=torch" in message
    )
    assert native.unavailable_because.startswith("no C compiler found")


def test_a_failing_compiler_is_named_with_its_error(monkeypatch, tmp_path):
    compiler = tmp_path / "broken-cc"
    compiler.write_text("#!/bin/sh\necho 'broken-cc: fatal error: cannot find kernels.h' >&2\nexit 3\n")
    compiler.chmod(0o755)
    monkeypatch.setenv("CC", str(compiler))
    library, _, caught = _fresh_load(monkeypatch, tmp_path / "cache")
    assert library is None and len(caught) == 1
    assert "broken-cc failed (exit 3): broken-cc: fatal error: cannot find kernels.h" in str(caught[0].message)


def test_the_torch_backend_never_builds_and_never_warns(monkeypatch, tmp_path):
    monkeypatch.setattr(native.shutil, "which", lambda name: None)
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.setenv("SPECVERIFY_CACHE", str(tmp_path))
    native.load.cache_clear()
    try:
        with backend_path("torch"), warnings.catch_warnings():
            warnings.simplefilter("error")
            _call()
    finally:
        native.load.cache_clear()


@pytest.mark.parametrize(
    "name", ["torch"] + (["native"] if native_available() else []) + (["triton"] if triton_available() else [])
)
def test_bench_says_which_backend_ran(name, capsys):
    with backend_path(name):
        assert (
            main(["bench", "--batch", "2", "--drafts", "1", "--vocab", "64", "--repeats", "1", "--modes", "greedy"])
            == 0
        )
    lines = capsys.readouterr().out.strip().splitlines()
    assert any(line.startswith(f"backend: {name}") for line in lines)
    with backend_path(name):
        assert main(["bench", "-B", "2", "-K", "1", "-V", "64", "--repeats", "1", "--modes", "greedy", "--json"]) == 0
    config = json.loads(capsys.readouterr().out)["config"]
    assert config["backend"] == name and config["kernels"].startswith(name)


def test_bench_refuses_a_device_it_cannot_use(capsys):
    assert main(["bench", "--device", "nope"]) == 2
    assert "--device 'nope' is not usable here" in capsys.readouterr().err
    if not torch.cuda.is_available():
        assert main(["bench", "--device", "cuda"]) == 2
        assert "--device 'cuda' is not usable here" in capsys.readouterr().err


def test_every_backend_keeps_the_output_invariants(each_backend):
    """One call with masks, padding and mixed rows on each backend: every SPEC §1 invariant holds (the
    committed tokens are checked against `sample` on the same backend)."""
    g = torch.Generator().manual_seed(9)
    args = dict(
        draft_tokens=torch.tensor([[3, -1, 7], [1, 2, 3], [0, 5, 9]]),
        target_logits=torch.randn(3, 4, 100, generator=g),
        temperature=torch.tensor([0.8, 0.0, 1.1]),
        top_k=torch.tensor([10, -1, -1]),
        max_k=None,
        top_p=torch.tensor([0.9, 1.0, 0.7]),
        min_top_p=None,
        seed=torch.tensor([5, 6, 7]),
        token_bitmasks=sv.pack_bitmask(torch.rand(3, 4, 100, generator=g) < 0.8),
    )
    check_output_invariants(args, sv.stochastic_acceptance_sampler(**args))


def test_truncated_weights_read_source_rows_in_place_and_skip_negative_ones(each_backend):
    """source picks the logits row of each output row (read in place by the compiled backends): the same
    weights and sums as weighing the gathered rows; a row with a negative source has zero sums."""
    from specverify.kernels.stages.weights import truncated_weights

    g = torch.Generator().manual_seed(10)
    logits = torch.randn(7, 300, generator=g)
    source = torch.tensor([4, -1, 0, 6, 4, -1])
    params = dict(
        temperature=torch.tensor([0.8, 1.0, 0.0, 1.2, 0.5, 1.0]),
        top_k=torch.tensor([10, -1, -1, 0, 3, 5]),
        top_p=torch.tensor([0.9, 1.0, 1.0, 0.7, 1.0, 0.5]),
        min_p=torch.tensor([0.0, 0.0, 0.0, 0.05, 0.0, 0.0]),
    )
    weights, sums = (t.clone() for t in truncated_weights(kernels.ops_for(logits), logits, **params, source=source))
    kept = source >= 0
    gathered = {name: value[kept] for name, value in params.items()}
    expected_weights, expected_sums = truncated_weights(kernels.ops_for(logits), logits[source[kept]], **gathered)
    assert torch.equal(weights[kept], expected_weights) and torch.equal(sums[kept], expected_sums)
    assert (sums[~kept] == 0).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_scan_rows_flags_nan_inf_and_rows_without_a_value_above_minus_inf(each_backend, dtype):
    """scan_rows (the one-pass logits check of every backend) against flags found entry by entry in
    float64; rows not in use are not reported."""
    g = torch.Generator().manual_seed(11)
    values = torch.randn(9, 1000, generator=g).to(dtype)
    values[1, 999] = float("nan")
    values[2, 0] = float("inf")
    values[3] = float("-inf")
    values[4] = float("-inf")
    values[4, 500] = -1e4
    values[5, 7] = -float("nan")  # NaN with the sign bit set
    values[6, :] = float("-inf")
    values[6, 3] = float("inf")
    values[7, 1:] = float("-inf")
    x = values.double()
    expected = (torch.isnan(x) | (x == float("inf"))).any(-1).to(torch.uint8) | (
        2 * (x != float("-inf")).any(-1).to(torch.uint8)
    )
    ops = kernels.ops_for(values)
    assert torch.equal(ops.scan_rows(values), expected)
    in_use = torch.arange(9) % 2 == 0
    assert torch.equal(ops.scan_rows(values, in_use), torch.where(in_use, expected, 0))


def test_a_new_build_keeps_only_the_most_recently_used_builds(tmp_path):
    """Builds of other versions do not pile up in the cache: the new one and the KEPT_BUILDS - 1 most
    recently used others stay; other files of the cache are not touched."""
    builds = [tmp_path / f"kernels-{i:016x}.so" for i in range(7)]
    for age, path in enumerate(builds):  # builds[0] the most recent
        path.write_bytes(b"")
        os.utime(path, (1_000_000 - age, 1_000_000 - age))
    other = tmp_path / "SmolLM2-transformers"
    other.mkdir()
    new = builds[-1]  # the oldest file by its time stamp: kept whatever its age
    native._remove_old_builds(new)
    kept = sorted(tmp_path.glob("kernels-*.so"))
    assert kept == sorted([*builds[: native.KEPT_BUILDS - 1], new]) and other.is_dir()


def _block_call(
    positions: int, dtype: torch.dtype, seed: int, batch: int = 16, vocab: int = 96, close: bool = False
) -> dict:
    """A block-verification call (SPEC §3.6) with every kind of row: greedy rows among sampled ones,
    temperatures, top-k, top-p and min-p, grammar masks on half the rows, ragged drafts (some rows drafting
    nothing), and at each position a q of one kind: a softmax, all zero (no distribution), one-hot, the
    target's own p~ (P stays 1) or p~ mixed with a softmax (P falls slowly); drafts drawn from q; logits and
    q in `dtype`. close: every q the mixture, where block verification most often commits more than
    token-wise (with a small vocabulary)."""
    g = torch.Generator().manual_seed(seed)

    def pick(values, dt):
        return torch.tensor(values, dtype=dt)[torch.randint(0, len(values), (batch,), generator=g)]

    logits = torch.randn(batch, positions + 1, vocab, generator=g) * 2
    allowed = torch.rand(batch, positions + 1, vocab, generator=g) < 0.8
    allowed.scatter_(-1, logits.argmax(-1, keepdim=True), True)
    bitmask = sv.pack_bitmask(allowed)
    bitmask[::2] = -1
    params = dict(
        temperature=pick([0.0, 0.7, 1.0, 1.3], torch.float32),
        top_k=pick([-1, -1, 5, 40], torch.int64),
        top_p=pick([1.0, 0.9, 0.6], torch.float32),
        min_p=pick([0.0, 0.0, 0.05], torch.float32),
    )
    each = {name: value.repeat_interleave(positions + 1) for name, value in params.items()}
    target = sv.truncated_probs(
        logits.view(-1, vocab).to(dtype), **each, token_bitmask=bitmask.view(batch * (positions + 1), -1)
    ).view(batch, positions + 1, vocab)[:, :positions]
    softmax = torch.softmax(torch.randn(batch, positions, vocab, generator=g) * 2, -1)
    one_hot = torch.nn.functional.one_hot(torch.randint(0, vocab, (batch, positions), generator=g), vocab).float()
    kinds = torch.stack([softmax, torch.zeros_like(softmax), one_hot, target, (target + softmax) / 2])
    choice = torch.randint(0, len(kinds), (batch, positions), generator=g)
    choice = torch.full_like(choice, len(kinds) - 1) if close else choice
    q = kinds.gather(0, choice[None, ..., None].expand(1, batch, positions, vocab))[0]
    empty = (q.sum(-1, keepdim=True) == 0).float()  # no distribution: any draft
    draft = torch.multinomial((q + empty).view(-1, vocab), 1, generator=g).view(batch, positions)
    ends = torch.randint(0, positions + 1, (batch,), generator=g)
    ragged = torch.rand(batch, generator=g) < 0.3
    draft = torch.where(ragged[:, None] & (torch.arange(positions) >= ends[:, None]), -1, draft)
    return dict(
        draft_tokens=draft,
        target_logits=logits.to(dtype),
        **{name: value for name, value in params.items() if name != "min_p"},
        max_k=None,
        min_top_p=None,
        seed=torch.randint(-(2**63), 2**63 - 1, (batch,), generator=g),
        token_bitmasks=bitmask,
        min_p=params["min_p"],
        draft_proposal="sampled",
        draft_probs_full=q.to(dtype),
        verification="block",
        validate=dtype == torch.float32,  # (16-bit q rows need not sum to 1 within the check's 1e-3)
    )


def _assert_block_tokens_equal(args: dict) -> None:
    """The Triton kernel's block verification (in the whole-call kernel) against the stages on the torch
    reference: the same first rejection and committed tokens in every row; the SPEC §1 invariants hold."""
    outputs = {}
    for name in ("torch", "triton"):
        with backend_path(name):
            outputs[name] = sv.stochastic_acceptance_sampler(**args)
    reference, candidate = (sv.committed_tokens(*outputs[name]) for name in ("torch", "triton"))
    assert torch.equal(outputs["torch"][0], outputs["triton"][0]), (outputs["torch"][0], outputs["triton"][0])
    assert torch.equal(reference[0], candidate[0]), (reference[0], candidate[0])
    with backend_path("torch"):
        check_output_invariants({k: v for k, v in args.items() if k != "validate"}, outputs["triton"])


@pytest.mark.skipif(not triton_available(), reason="needs triton and its interpreter")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("positions", [0, 1, 2, 3, 4])
def test_triton_block_verification_commits_what_the_stages_commit(positions, dtype):
    """verification="block" in the Triton whole-call kernel: ragged drafts, greedy rows mixed in,
    top-k/top-p/min-p, grammar masks, all-zero and one-hot q rows, 16-bit logits and q, K = 0..4: every
    row's first rejection and committed tokens equal the stages' on the torch reference (at V = 96, and at
    V = 4 with q close to p~, where block and token-wise verdicts differ most)."""
    _assert_block_tokens_equal(_block_call(positions, dtype, seed=100 * positions))
    _assert_block_tokens_equal(_block_call(positions, dtype, seed=100 * positions + 1, batch=64, vocab=4, close=True))


@pytest.mark.skipif(not triton_available(), reason="needs triton and its interpreter")
def test_the_block_cases_tell_block_from_token_wise():
    """The comparisons above mean something: on a close case of 256 rows the Triton kernel's block verdicts
    commit a number of tokens other than token-wise's in many rows (more on the whole), the stages' exactly
    (P_tau < 1 at tau >= 1 in enough rows that the residual's q / P shows)."""
    args = _block_call(4, torch.float32, seed=401, batch=256, vocab=4, close=True)
    _assert_block_tokens_equal(args)
    with backend_path("triton"):
        block = sv.committed_tokens(*sv.stochastic_acceptance_sampler(**args))[1]
        token = sv.committed_tokens(*sv.stochastic_acceptance_sampler(**{**args, "verification": "token"}))[1]
    assert int((block != token).sum()) >= 10 and int((block - token).sum()) > 0, (block, token)


@pytest.mark.skipif(not triton_available(), reason="needs triton and its interpreter")
def test_triton_block_verification_over_many_tiles_and_wide_nuclei(monkeypatch):
    """The same where rows are walked by tiles: interpreted tiles of 16 columns (19 per row, the row's max
    growing from tile to tile, so each lazily computed residual is a pass of its own), 32 candidates a row
    (as a GPU's block programs keep fewer: top-k 40 rows searched, top-p rows cut into regions), and top-p
    rows whose nucleus is too large for the candidates (V = 3000, flat logits)."""
    from specverify.kernels import triton as launchers

    _assert_block_tokens_equal(_block_call(4, torch.float32, seed=7, vocab=300))
    monkeypatch.setattr(launchers, "INTERPRETED_MAX_TILE", 16)
    _assert_block_tokens_equal(_block_call(4, torch.float32, seed=8, vocab=300))
    monkeypatch.setattr(launchers, "MAX_CANDIDATES", 32)
    _assert_block_tokens_equal(_block_call(3, torch.float32, seed=10, vocab=300))
    monkeypatch.undo()
    args = _block_call(2, torch.float32, seed=9, batch=6, vocab=3000)
    args["target_logits"] = args["target_logits"] * 0.05
    args["top_k"] = torch.full((6,), -1)
    _assert_block_tokens_equal(args)


#: Block verification cases (SPEC §3.6): (B, K, V, logits dtype, q dtype, truncation, with masks), each
#: with ragged drafts, greedy rows, all-zero q rows and rows whose q is p~ itself mixed in (_block_arguments).
BLOCK_CASES = {
    "top-k, top-p, min-p, masks": (12, 4, 300, torch.float32, torch.float32, "mixed", True),
    "K = 0": (5, 0, 300, torch.float32, torch.float32, "mixed", False),
    "K = 1": (12, 1, 300, torch.float32, torch.float32, "mixed", True),
    "K = 2": (12, 2, 300, torch.float32, torch.float32, "mixed", False),
    "K = 3": (12, 3, 300, torch.float32, torch.float32, "mixed", False),
    "bfloat16 logits and q": (12, 4, 300, torch.bfloat16, torch.bfloat16, "mixed", True),
    "float16 logits and q": (12, 4, 300, torch.float16, torch.float16, "mixed", False),
    "float64 q": (12, 4, 300, torch.float32, torch.float64, "mixed", False),
    "large V, sparse kept sets (top-k 50)": (9, 4, 20000, torch.float32, torch.float32, "top-k", False),
    "large V, dense kept sets (temperature only)": (9, 4, 20000, torch.bfloat16, torch.float32, "temperature", True),
}


def _block_arguments(case: tuple, g: torch.Generator) -> dict:
    """A block call of `case`: drafts drawn from q, which is p~ of noisier logits (noise 0, 0.3, 1 by row:
    q = p~ exactly, close, far), the noisy ones mixed with a little of a flat law so that q covers tokens
    p~ drops; row 1 ragged after one draft, row 2 without drafts, every fifth row greedy, row 3's q all
    zero."""
    batch, positions, vocab, dtype, q_dtype, truncation, masked = case
    logits = torch.randn(batch, positions + 1, vocab, generator=g) * 2
    pick = lambda values: torch.tensor(values)[torch.randint(0, len(values), (batch,), generator=g)]  # noqa: E731
    temperature = pick([0.5, 0.8, 1.0, 1.3])
    temperature[::5] = 0.0
    top_k, top_p, min_p = torch.full((batch,), -1), torch.ones(batch), torch.zeros(batch)
    if truncation in ("mixed", "top-k"):
        top_k = pick([-1, 5, 50]) if truncation == "mixed" else torch.full((batch,), 50)
    if truncation == "mixed":
        top_p, min_p = pick([1.0, 0.9, 0.6]), pick([0.0, 0.0, 0.05])
    bits = torch.rand(batch, positions + 1, vocab, generator=g) < 0.8 if masked else None
    if bits is not None:
        bits[..., 0] = True
    mask = None if bits is None else sv.pack_bitmask(bits)
    noise = torch.tensor([0.0, 0.3, 1.0])[torch.arange(batch) % 3].view(-1, 1, 1)
    noisy = (logits + noise * torch.randn(logits.shape, generator=g)).to(dtype)
    per_row = lambda t: t.repeat_interleave(positions + 1)  # noqa: E731
    words = None if mask is None else mask.view(-1, mask.shape[-1])
    q = sv.truncated_probs(noisy.view(-1, vocab), *map(per_row, (temperature, top_k, top_p, min_p)), words)
    q = q.view(batch, positions + 1, vocab)[:, :positions]
    q = 0.98 * q + 0.02 / vocab * (noise > 0)
    q = q / q.sum(-1, keepdim=True)
    draft = torch.zeros(batch, positions, dtype=torch.int64)
    if positions:
        draft = torch.multinomial(q.reshape(-1, vocab).float(), 1, generator=g).view(batch, positions)
        draft[min(1, batch - 1), 1:] = -1
        draft[min(2, batch - 1), 0] = -1
    if batch > 3:
        q[3] = 0.0  # no distribution: each draft judged as its point mass
    return dict(
        draft_tokens=draft, target_logits=logits.to(dtype), temperature=temperature, top_k=top_k, max_k=None,
        top_p=top_p, min_top_p=None, seed=torch.randint(0, 2**62, (batch,), generator=g),
        token_bitmasks=mask, draft_proposal="sampled", draft_probs_full=q.to(q_dtype), min_p=min_p,
        verification="block", validate=False,
    )  # fmt: skip


@pytest.mark.skipif(not native_available(), reason="the compiled CPU kernels are unavailable")
@pytest.mark.parametrize("case", BLOCK_CASES.values(), ids=BLOCK_CASES.keys())
def test_block_verdicts_in_one_kernel_call_match_the_stages(monkeypatch, case):
    """verification="block" on the C kernels (draw_block_verdicts: one kernel call, the residual masses
    computed lazily from the longest prefix down) gives every output of the stages over the C row ops bit
    for bit (the first rejection, the recovered tokens: the drafts before it, the stages' draws from it on,
    and the bonus), and the torch reference's stages' first rejections and bonus tokens, and (V = 300)
    committed tokens. (Not every recovered token of torch's: after the first rejection §1 leaves them free,
    and torch's recovery differs where p~ without the draft is empty, which is never committed; at large V
    torch's recovery walk, on p~ divided by its mass in float32, may land on the next token, as in
    token-wise mode.)"""
    from specverify.kernels.stages import chain
    from tests.support.backends import torch_path

    g = torch.Generator().manual_seed(sum(map(ord, str(case))))
    outputs, kept = [], []
    for repeat in range(3):
        args = {**_block_arguments(case, g), "validate": repeat == 1 and case[4] != torch.bfloat16}
        with torch_path():
            expected = sv.stochastic_acceptance_sampler(**args)
        with backend_path("native"):
            got = sv.stochastic_acceptance_sampler(**args)
            with monkeypatch.context() as patch:
                patch.setattr(native, "verify_chain", lambda call: chain.verify_chain(call, native))
                staged = sv.stochastic_acceptance_sampler(**args)
        for name, s, o in zip(("first", "recovered", "bonus"), staged, got):
            assert o.shape == s.shape and o.dtype == torch.int64, name
            assert torch.equal(o, s), f"{name}: {o.tolist()} != stages on the C ops {s.tolist()}"
        for name, e, o in zip(("first", "bonus"), expected[::2], got[::2]):
            assert torch.equal(o, e), f"{name}: {o.tolist()} != torch's {e.tolist()}"
        if case[2] <= 300:
            for e, o in zip(sv.committed_tokens(*expected), sv.committed_tokens(*got)):
                assert torch.equal(o, e), f"committed: {o.tolist()} != torch's {e.tolist()}"
        outputs.append(got[0])
        drafted = (args["draft_tokens"] >= 0).sum(-1)
        kept.append(torch.stack([got[0] == drafted, (got[0] > 0) & (got[0] < drafted), got[0] == 0]))
    if case[1] >= 2:  # whole blocks, inner prefixes and nothing are each kept somewhere
        assert torch.cat(kept, 1).any(1).all(), torch.cat(outputs).tolist()


@pytest.mark.skipif(not native_available(), reason="the compiled CPU kernels are unavailable")
def test_block_verdicts_of_a_lone_request_match_the_batch():
    """A request alone (fewer requests than threads: draw_block_verdicts draws two positions a round, one
    per thread) gets the outputs it gets in a batch (where each request is judged by one thread, one
    position at a time), on dense and sparse kept sets."""
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        for name in ("large V, sparse kept sets (top-k 50)", "large V, dense kept sets (temperature only)"):
            args = _block_arguments(BLOCK_CASES[name], torch.Generator().manual_seed(7))
            with backend_path("native"):
                batch = sv.stochastic_acceptance_sampler(**args)
                for row in range(args["draft_tokens"].shape[0]):
                    alone = {k: v[row : row + 1] if isinstance(v, torch.Tensor) else v for k, v in args.items()}
                    for whole, own in zip(batch, sv.stochastic_acceptance_sampler(**alone)):
                        assert torch.equal(own[0], whole[row]), f"{name}, row {row}"
    finally:
        torch.set_num_threads(threads)
