"""The Triton backend (kernels/triton/), on the CPU: its kernels under Triton's interpreter (TRITON_INTERPRET=1,
set by tests/conftest.py before triton is imported), and every kernel compiled for real GPU targets (sm_90, sm_80)
in a subprocess without the interpreter.

Against the torch reference on the same uniforms: kept sets identical, tokens identical except where a
uniform lies within rounding of a CDF boundary (classified as the device check, specverify.check.parity, does); against the
float64 laws: chi-square with power; keyed uniforms bit-identical to rng.py; a whole call is two launches,
with no read back to the host.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import specverify as sv
from specverify import kernels
from specverify.audit.exact import truncated_distribution
from specverify.check.parity import parity_cases, parity_check
from specverify.check.statistics import statistics_check
from specverify.check.targets import Target
from specverify.rng import keyed_uniform
from tests.support.backends import backend_path, triton_available
from tests.support.invariants import check_output_invariants, forbid_host_reads
from tests.support.paths import COMPILE_TRITON, ROOT, SRC
from tests.support.recovery import DRAWS, grid_counts, random_weights, recovery_law

pytestmark = pytest.mark.skipif(
    not triton_available(),
    reason="needs triton (pip install -e '.[test]') and its interpreter (no CUDA here; on a GPU run python -m specverify.check)",
)
triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")
jit = pytest.importorskip("specverify.kernels.triton.jit")
launchers = pytest.importorskip("specverify.kernels.triton")


def _compile(capabilities: list[str], *flags: str, tmp_path: Path) -> str:
    environment = {**os.environ, "PYTHONPATH": str(SRC), "TRITON_CACHE_DIR": str(tmp_path / "cache")}
    environment.pop("TRITON_INTERPRET", None)
    result = subprocess.run(
        [sys.executable, str(COMPILE_TRITON), *capabilities, *flags],
        capture_output=True,
        text=True,
        env=environment,
        timeout=1800,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
    return result.stdout


def test_every_kernel_compiles_for_sm90_and_sm80(tmp_path):
    """Each kernel at the launch shape of a large vocabulary, with every code path of the whole-call kernel
    switched on, compiled to a cubin for Hopper and Ampere (code the interpreter runs but the compiler
    rejects fails here)."""
    output = _compile(["90", "80"], "--representative", tmp_path=tmp_path)
    for kernel in ("weigh", "argmax", "scan", "relaxed", "draw", "verify"):
        for capability in ("90", "80"):
            assert any(
                line.startswith(f"compiled {kernel} ") and line.endswith(f"sm_{capability}")
                for line in output.splitlines()
            ), kernel


@pytest.mark.slow
def test_every_kernel_variant_compiles_for_sm90(tmp_path):
    """Every dtype, both launch-shape families and the whole-call kernel's flags in pairs (compile_triton's
    verify_flags), for Hopper: every variant but the representative ones, which the test above compiles for
    sm_90 and sm_80 (a variant of the whole-call kernel takes about 20 s)."""
    output = _compile(["90"], "--rest", tmp_path=tmp_path)
    compiled = {line for line in output.splitlines() if line.startswith("compiled ")}
    assert f"\n{len(compiled)} kernel variants compiled" in output and len(compiled) > 50, output[-3000:]
    representative = _representative_variants()
    assert len(representative) == 9 and not {f"compiled {name} for sm_90" for name in representative} & compiled


def _representative_variants() -> tuple[str, ...]:
    """compile_triton.REPRESENTATIVE, read from its source (importing it here would switch the interpreter off)."""
    import ast

    tree = ast.parse(COMPILE_TRITON.read_text())
    value = next(
        node.value for node in tree.body if isinstance(node, ast.Assign) and node.targets[0].id == "REPRESENTATIVE"
    )
    return ast.literal_eval(value)


def _jit_functions() -> dict:
    """The @triton.jit functions of kernels/triton/jit.py by name, as ast.FunctionDef."""
    import ast

    tree = ast.parse(Path(jit.__file__).read_text())
    return {node.name: node for node in tree.body if isinstance(node, ast.FunctionDef)}


def test_kernels_are_stages_of_one_job_called_with_few_arguments():
    """Issue 35's kernels in stages: no @triton.jit function over 120 lines, verify_kernel's arguments in
    groups (kernels/triton/groups.py), and no stage called with more than 8 arguments."""
    import ast

    functions = _jit_functions()
    lengths = {name: node.end_lineno - node.lineno + 1 for name, node in functions.items()}
    assert max(lengths.values()) <= 120, sorted(lengths.items(), key=lambda item: -item[1])[:3]
    assert len(functions["verify_kernel"].args.args) <= 10
    calls = [
        (len(call.args) + len(call.keywords), call.func.id, name)
        for name, node in functions.items()
        for call in ast.walk(node)
        if isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id in functions
    ]
    assert max(calls)[0] <= 8, max(calls)


@triton.jit
def _uniforms(key_ptr, out_ptr, n, STREAM: tl.constexpr, BLOCK: tl.constexpr):
    at = tl.arange(0, BLOCK)
    key = tl.load(key_ptr + at, mask=at < n, other=0).to(tl.uint64, bitcast=True)
    tl.store(out_ptr + at, jit.keyed_uniform(key, STREAM), mask=at < n)


def test_in_kernel_uniforms_are_bit_identical_to_rng():
    edge = [0, 1, -1, 2**63 - 1, -(2**63), 0x9E3779B97F4A7C15 - 2**64]
    keys = torch.tensor(
        edge + torch.randint(-(2**63), 2**63 - 1, (1000,), generator=torch.Generator().manual_seed(1)).tolist()
    )
    for stream in (0, 1, 2, 7):
        out = torch.empty(len(keys), dtype=torch.float64)
        _uniforms[(1,)](keys, out, len(keys), STREAM=stream, BLOCK=1024 * 2)
        assert torch.equal(out.view(torch.int64), keyed_uniform(keys, stream).view(torch.int64)), stream


def _truncation_grid(vocab: int, ties: bool, dtype: torch.dtype, seed: int):
    g = torch.Generator().manual_seed(seed)
    grid = list(itertools.product([0.0, 0.3, 1.0, 2.5], [-1, 1, 3, 17, vocab], [1.0, 0.9, 0.5, 0.05], [0.0, 0.1]))
    temperature, top_k, top_p, min_p = (torch.tensor(column) for column in zip(*grid))
    logits = torch.randn(len(grid), vocab, generator=g) * 2
    logits = logits.round() if ties else logits
    allowed = torch.rand(len(grid), vocab, generator=g) < 0.7
    allowed[:, 0] = True
    return logits.to(dtype), temperature.float(), top_k.long(), top_p.float(), min_p.float(), sv.pack_bitmask(allowed)


@pytest.mark.parametrize(
    "vocab, ties, dtype",
    [(40, True, torch.float32), (300, True, torch.float32), (300, False, torch.bfloat16), (3000, True, torch.float16)],
)
def test_kept_sets_equal_the_torch_reference_and_the_float64_law(vocab, ties, dtype):
    """Ties at the top-k / top-p boundaries (rounded logits), masks, min-p, 16-bit inputs, the radix
    search above V = 64: the same kept set as the torch path, and probabilities within float32 rounding of
    the float64 oracle."""
    args = _truncation_grid(vocab, ties, dtype, seed=vocab)
    with backend_path("triton"):
        got = sv.truncated_probs(*args)
    with backend_path("torch"):
        reference = sv.truncated_probs(*args)
    assert torch.equal(got > 0, reference > 0)
    logits, temperature, top_k, top_p, min_p, bitmask = args
    allowed = sv.unpack_bitmask(bitmask, vocab).numpy()
    exact_logits = logits.float().double().numpy()
    for row in range(0, len(logits), 7):
        law = truncated_distribution(
            exact_logits[row],
            float(temperature[row]),
            int(top_k[row]),
            float(top_p[row]),
            float(min_p[row]),
            allowed[row],
        )
        assert np.array_equal(got[row].numpy() > 0, law > 0), row
        assert np.allclose(got[row].double().numpy(), law, rtol=1e-4, atol=2e-6), row


def test_per_op_kernels_match_the_torch_reference():
    """argmax (ties, NaN), sample, recovery and relaxed ops through the dispatch: the same tokens as torch."""
    from specverify.kernels.stages.rules import relaxed_verdict
    from specverify.kernels.stages.weights import greedy_tokens

    g = torch.Generator().manual_seed(5)
    x = torch.randn(48, 700, generator=g).round()
    x[::5, 3] = float("nan")
    x[1] = float("-inf")
    with backend_path("triton"):
        argmax = greedy_tokens(kernels.ops_for(x), x)
    with backend_path("torch"):
        assert torch.equal(argmax, greedy_tokens(kernels.ops_for(x), x))
    logits = torch.randn(8, 4, 300, generator=g)
    draft = torch.where(torch.rand(8, 3, generator=g) < 0.8, logits[:, :3].argsort(-1, descending=True)[..., 1], -1)
    with backend_path("triton"):
        relaxed = relaxed_verdict(kernels.ops_for(logits), draft, logits, 3, 0.2)
    with backend_path("torch"):
        assert all(
            torch.equal(a, b) for a, b in zip(relaxed, relaxed_verdict(kernels.ops_for(logits), draft, logits, 3, 0.2))
        )
    sample = (
        torch.randn(64, 2500, generator=g) * 3,
        torch.rand(64, generator=g) + 0.3,
        torch.tensor([-1, 5, 60, 900] * 16),
        torch.tensor([1.0, 0.9, 0.5, 0.99] * 16),
        torch.arange(64),
    )
    with backend_path("triton"):
        drawn = sv.sample(*sample)
    with backend_path("torch"):
        assert torch.equal(drawn, sv.sample(*sample))


def test_recovery_draws_follow_their_float64_laws():
    """The recovery op (residual, without the draft, from the target) at a grid of uniforms, through Triton."""
    rng = np.random.default_rng(3)
    weights = random_weights(rng, 3, 200)
    q = rng.dirichlet(np.ones(200) * 0.3, size=3).astype(np.float32)
    draft = np.array([4, int(np.argmax(weights[1])), 9])
    q[2, 9] = 0.0
    modes = np.array([1, 1, 2])
    with backend_path("triton"):
        counts = grid_counts(weights, q, draft, modes)
    for j in range(3):
        law = recovery_law(weights[j], q[j], int(draft[j]), int(modes[j]))
        assert np.all(np.abs(counts[j] - DRAWS * law) <= 2), j


def _parity_cases():
    cases = [
        case
        for case in parity_cases(quick=True, include_flat_256k=False)
        if case.name in ("argmax V=1000", "argmax V=50 fp16", "sampled V=64", "relaxed V=300")
        or case.name.startswith("on-boundary")
    ]
    for case in cases:  # <= 64 rows x positions each
        batch, positions = case.args["draft_tokens"].shape
        keep = max(1, 64 // (positions + 1))
        case.args = {
            name: value[:keep] if isinstance(value, torch.Tensor) and value.dim() and value.shape[0] == batch else value
            for name, value in case.args.items()
        }
    return cases


def _assert_parity_with_torch():
    report = parity_check(Target("cpu", backend="torch"), Target("cpu", backend="triton"), cases=_parity_cases())
    assert report["passed"], report["failures"]
    natural = [r for r in report["cases"] if not r["case"].startswith("on-boundary")]
    assert sum(r["mismatches"] for r in natural) == 0, natural
    assert report["total"]["unexplained"] == 0


def test_whole_calls_match_the_torch_reference_up_to_rounding():
    """Every rule, masks, padding, fp16, sampled drafts with q = 0 / one-hot / p~ itself, and draws placed
    on CDF boundaries on purpose: tokens identical to the torch path, except on rounding boundaries."""
    _assert_parity_with_torch()


def test_whole_calls_over_many_tiles_match_the_torch_reference_up_to_rounding(monkeypatch):
    """The same with interpreted tiles of 16 columns (up to 63 per row, as a large vocabulary has on a GPU):
    the row's max grows from tile to tile, so rows without truncation draw from first_pass's rescaled tile
    sums, and the walk skips tiles."""
    monkeypatch.setattr(launchers, "INTERPRETED_MAX_TILE", 16)
    _assert_parity_with_torch()


def _wide_nucleus_cases() -> list:
    """Top-p rows without top-k whose nucleus holds more than the 1024 candidates (V = 5000): flat logits and
    a few heavy tokens over a Gaussian tail, top_p from 0.5 to 0.999, masks, -inf logits, bf16, min-p (0.7
    on flat rows: a floor above the nucleus with thousands of tokens over it), argmax and sampled drafts;
    integer logits (more than 1024 tokens tied at the threshold: a cut of one value pins it)."""
    from specverify.check.parity import Case

    g = torch.Generator().manual_seed(24)
    batch, positions, vocab = 12, 2, 5000
    cases = []
    for name, dtype, sampled in (
        ("fp32", torch.float32, False),
        ("bf16", torch.bfloat16, False),
        ("sampled", torch.float32, True),
        ("ties", torch.float32, False),
    ):
        logits = torch.randn(batch, positions + 1, vocab, generator=g) * 2.0
        logits.scatter_add_(
            -1,
            torch.randint(0, vocab, (batch, positions + 1, 8), generator=g),
            torch.rand(batch, positions + 1, 8, generator=g) * 8 + 4,
        )
        flat = torch.arange(batch) % 2 == 0
        logits[flat] = torch.randn(int(flat.sum()), positions + 1, vocab, generator=g) * 0.1
        if name == "ties":
            logits = torch.randn(batch, positions + 1, vocab, generator=g).round()
        logits[torch.rand(logits.shape, generator=g) < 0.05] = float("-inf")
        allowed = torch.rand(batch, positions + 1, vocab, generator=g) < 0.9
        allowed.scatter_(-1, logits.argmax(-1, keepdim=True), True)
        bitmask = sv.pack_bitmask(allowed)
        bitmask[::3] = -1
        args = dict(
            draft_tokens=torch.randint(0, vocab, (batch, positions), generator=g),
            target_logits=logits.to(dtype),
            temperature=torch.tensor([1.0, 0.7, 1.3, 1.0] * 3),
            top_k=torch.full((batch,), -1),
            max_k=None,
            top_p=torch.tensor([0.5, 0.9, 0.95, 0.99, 0.999, 0.8] * 2),
            min_top_p=None,
            seed=torch.randint(-(2**63), 2**63 - 1, (batch,), generator=g),
            token_bitmasks=bitmask,
            min_p=torch.where(flat & (torch.arange(batch) % 4 == 2), 0.7, 0.0),
        )
        if sampled:
            q = torch.softmax(torch.randn(batch, positions, vocab, generator=g) * 2, -1)
            args.update(
                draft_proposal="sampled",
                draft_probs_full=q,
                draft_tokens=torch.multinomial(q.view(-1, vocab), 1, generator=g).view(batch, positions),
            )
        cases.append(Case(f"wide nucleus V=5000 {name}", args))
    return cases


@pytest.mark.parametrize("tile", [None, 256])
def test_top_p_rows_with_wide_nuclei_match_the_torch_reference(monkeypatch, tile):
    """Rows whose kept set is too large for the candidates: what lies above the boundary region is summed per
    tile as surely kept, the region cut until the threshold's part fits (up to LEVELS passes), the draw a
    tile walk; in tiles of 256 columns too (20 per row). Tokens identical to the torch path."""
    if tile is not None:
        monkeypatch.setattr(launchers, "INTERPRETED_MAX_TILE", tile)
    report = parity_check(Target("cpu", backend="torch"), Target("cpu", backend="triton"), cases=_wide_nucleus_cases())
    assert report["passed"], report["failures"]
    assert sum(r["mismatches"] for r in report["cases"]) == 0, report["cases"]


def test_whole_calls_follow_the_float64_laws():
    """The device check's statistics section through Triton: chi-square of every committed position and of the
    first rejection against exact laws, argmax and sampled drafts, masks, min-p; power shown."""
    report = statistics_check(Target("cpu", backend="triton"), rows_per_group=3000)
    assert report["passed"], report["failures"]
    assert report["tests"] == 40 and report["power_p_value"] < 1e-6


@pytest.mark.slow
def test_the_statistical_test_suite_passes_through_triton():
    """tests/core/test_statistics.py (every float64-law test of the verifier, with its power checks), run
    whole with SPECVERIFY_BACKEND=triton."""
    environment = {**os.environ, "PYTHONPATH": str(SRC), "SPECVERIFY_BACKEND": "triton", "TRITON_INTERPRET": "1"}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            str(ROOT / "tests" / "core" / "test_statistics.py"),
        ],
        capture_output=True,
        text=True,
        env=environment,
        cwd=ROOT,
        timeout=1800,
    )
    assert result.returncode == 0, result.stdout[-4000:]


def _count_launches(run) -> tuple[int, list[str]]:
    """Kernel launches a call would make on a GPU: Triton kernel launches plus torch ops that run a kernel
    (everything but views and allocations)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from specverify.kernels.triton.traffic import FREE_OPS

    free = FREE_OPS | {"_to_copy_noop"}  # the views and allocations the traffic meter leaves out, and a no-op copy
    seen: list[str] = []
    inside_a_kernel = []  # the interpreter's own tensor copies are not launches

    class Ops(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = func.overloadpacket.__name__
            if name not in free and not inside_a_kernel:
                seen.append(name)
            return func(*args, **(kwargs or {}))

    def counted(original, name):
        def run(*args, **kwargs):
            seen.append(f"triton:{name}")
            inside_a_kernel.append(name)
            try:
                return original(*args, **kwargs)
            finally:
                inside_a_kernel.pop()

        return run

    kernels = [jit.verify_kernel, jit.weigh_kernel, jit.draw_kernel, jit.argmax_kernel, jit.relaxed_kernel]
    originals = [kernel.run for kernel in kernels]
    for kernel, original in zip(kernels, originals):
        kernel.run = counted(original, kernel.fn.__name__)
    try:
        with Ops():
            out = run()
    finally:
        for kernel, original in zip(kernels, originals):
            kernel.run = original
    return out, seen


@pytest.mark.parametrize("mode", ["argmax", "sampled", "block", "relaxed"])
def test_a_whole_call_is_two_launches_without_host_reads(mode):
    """validate=False: the fill of first_rejected_idx and one Triton kernel; nothing read back to the host
    (so the call can be captured in a CUDA graph), and outputs that keep every SPEC §1 invariant."""
    g = torch.Generator().manual_seed(11)
    batch, positions, vocab = 4, 3, 200
    args = dict(
        draft_tokens=torch.randint(0, vocab, (batch, positions), generator=g),
        target_logits=torch.randn(batch * (positions + 1), vocab, generator=g),
        temperature=torch.tensor([0.7, 1.0, 0.0, 1.2]),
        top_k=torch.tensor([5, -1, -1, 40]),
        max_k=None,
        top_p=torch.tensor([0.9, 1.0, 1.0, 0.8]),
        min_top_p=None,
        seed=torch.tensor([3, 1, 4, 1]),
        token_bitmasks=sv.pack_bitmask(torch.rand(batch, positions + 1, vocab, generator=g) < 0.9),
        min_p=torch.tensor([0.0, 0.1, 0.0, 0.0]),
    )
    if mode in ("sampled", "block"):
        args.update(
            draft_proposal="sampled",
            draft_probs_full=torch.softmax(torch.randn(batch, positions, vocab, generator=g), -1),
            verification="block" if mode == "block" else "token",
        )
    if mode == "relaxed":
        args.update(in_thinking_phase=torch.tensor([True, False, True, True]), relaxed_topk=3, relaxed_delta=0.3)
    with backend_path("triton"), forbid_host_reads():
        out, launches = _count_launches(lambda: sv.stochastic_acceptance_sampler(**args, validate=False))
    assert launches == ["full", "triton:verify_kernel"], launches
    with backend_path("torch"):
        check_output_invariants(args, out)
