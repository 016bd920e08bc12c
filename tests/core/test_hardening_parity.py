"""Parity: identical results for torch thread counts 1 and 2, and the device check (specverify.check) kept alive.

The device check compares a device against a reference and classifies every differing token. Without CUDA
its logic runs here on the CPU: the compiled kernels against the torch path (the code CUDA runs), a
candidate whose logits are nudged by a few ulps (to make the rounding differences a GPU would make), and
a candidate that is simply wrong (which must be flagged). The CUDA tests skip cleanly without a device.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

import specverify as sv
from specverify.check import parity
from specverify.check.__main__ import main as check_main
from specverify.check.parity import boundary_cases, parity_cases, parity_check
from specverify.check.targets import Target
from tests.support.backends import native_available
from tests.support.invariants import outputs_equal
from tests.support.paths import SRC

HAS_CUDA = torch.cuda.is_available()


# ---------------------------------------------------------------------------------------------------------
# Thread counts


def _call(batch: int, positions: int, vocab: int, mode: str, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    pick = lambda values, dtype: torch.tensor(values, dtype=dtype)[torch.randint(0, len(values), (batch,), generator=g)]  # noqa: E731
    logits = torch.randn(batch, positions + 1, vocab, generator=g) * 2
    allowed = torch.rand(batch, positions + 1, vocab, generator=g) < 0.8
    allowed.scatter_(-1, logits.argmax(-1, keepdim=True), True)
    args = dict(
        draft_tokens=torch.where(torch.rand(batch, positions, generator=g) < 0.5, logits[:, :positions].argmax(-1),
                                 torch.randint(0, vocab, (batch, positions), generator=g)),
        target_logits=logits, temperature=pick([0.0, 0.6, 1.0, 1.7], torch.float32),
        top_k=pick([-1, 1, 20, vocab // 3, vocab], torch.int64), max_k=None, top_p=pick([1.0, 0.9, 0.5, 0.01], torch.float32),
        min_top_p=None, seed=torch.randint(-(2**63), 2**63 - 1, (batch,), generator=g),
        token_bitmasks=sv.pack_bitmask(allowed), min_p=pick([0.0, 0.05, 0.5], torch.float32),
    )
    if mode == "sampled":
        q = torch.softmax(torch.randn(batch, positions, vocab, generator=g) * 2, -1)
        q[::4] = 0.0
        args.update(draft_proposal="sampled", draft_probs_full=q)
    elif mode == "relaxed":
        args.update(in_thinking_phase=torch.rand(batch, generator=g) < 0.5, relaxed_topk=4, relaxed_delta=0.2)
    return args


def _everything(args: dict):
    """The verifier (validate True and False), truncated_probs and sample on the same rows."""
    batch, positions = args["draft_tokens"].shape
    vocab = args["target_logits"].shape[-1]
    flat = lambda t: t.repeat_interleave(positions + 1)  # noqa: E731
    rows = (args["target_logits"].reshape(-1, vocab), flat(args["temperature"]), flat(args["top_k"]), flat(args["top_p"]))
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


@pytest.mark.parametrize("mode", ["argmax", "sampled", "relaxed"])
@pytest.mark.parametrize("shape", [(64, 4, 50), (16, 3, 5000), (2, 1, 200_000)], ids=["V=50", "V=5000", "V=200000"])
def test_one_and_two_threads_give_identical_results(code_path, mode, shape):
    args = _call(*shape, mode)
    one = _with_threads(1, _everything, args)
    two = _with_threads(2, _everything, args)
    assert outputs_equal(one, two), f"thread count changed the results ({code_path}, {mode}, {shape})"
    assert torch.get_num_threads() >= 1


@pytest.mark.skipif(not native_available(), reason="the compiled CPU kernels are not available")
@pytest.mark.parametrize("mode", ["argmax", "sampled"])
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
# The device check (python -m specverify.check)


@pytest.mark.skipif(HAS_CUDA, reason="a CUDA device exists: the check runs for real (see the CUDA tests)")
def test_check_exits_cleanly_without_cuda():
    environment = {**os.environ, "PYTHONPATH": str(SRC)}
    result = subprocess.run([sys.executable, "-m", "specverify.check", "--device", "cuda"], capture_output=True, text=True, env=environment,
                            timeout=300)
    assert result.returncode == 0, result.stderr
    assert "no CUDA device" in result.stdout
    assert json.loads(result.stdout.strip().splitlines()[-1]) == {"skipped": True, "reason": "no CUDA device", "passed": True}


def test_check_rejects_unknown_sections(capsys):
    with pytest.raises(SystemExit) as exit_:
        check_main(["--device", "cpu", "--sections", "parity,speed"])
    assert exit_.value.code == 2


def test_check_cpu_run_of_every_section(capsys):
    """The whole check on the CPU (reference and candidate both the default CPU path): every section passes."""
    # without the compiled kernels the CPU runs the torch path, whose exactness fails on the known float32
    # histogram bug (see test_hardening_numerics.py): then only the other sections are run
    sections = "exactness,statistics,parity" if native_available() else "statistics,parity"
    code = check_main(["--device", "cpu", "--quick", "--rows", "2000", "--sections", sections])
    output = capsys.readouterr().out
    report = json.loads(output.strip().splitlines()[-1])
    assert code == 0, output
    assert report["passed"] and report["parity"]["total"]["mismatches"] == 0
    assert report["statistics"]["tests"] == 40 and report["statistics"]["power_p_value"] < 1e-6
    for section in sections.split(","):
        assert f"  {section}" in output


def test_classifier_explains_rounding_at_cdf_boundaries():
    """Draws placed exactly on a CDF boundary, with the candidate's logits nudged by 2 ulps: tokens differ
    in many rows, and every difference is classified as a rounding boundary."""
    cases = boundary_cases(200, seed=3)
    report = parity_check(Target("cpu"), Target("cpu", perturb_ulps=2), cases=cases)
    by_case = {r["case"]: r for r in report["cases"]}
    for name in ("on-boundary argmax", "on-boundary sampled"):
        assert by_case[name]["mismatches"] >= 10, by_case[name]
        assert by_case[name]["boundary"] == by_case[name]["mismatches"], by_case[name]
    assert report["passed"] and report["total"]["unexplained"] == 0
    assert all(d["measure"] <= 1e-6 for r in report["cases"] for d in r["details"])


def test_classifier_flags_a_wrong_candidate(monkeypatch):
    """A candidate that commits other tokens (here: token + 1) is reported as unexplained, and fails."""
    original = parity.run_verifier

    def wrong(args, target):
        out = original(args, target)
        if target.perturb_ulps == 0 and target.native is False:
            vocab = args["target_logits"].shape[-1]
            return out[0], (out[1] + 1) % vocab, (out[2] + 1) % vocab
        return out

    monkeypatch.setattr(parity, "run_verifier", wrong)
    cases = parity_cases(quick=True, include_flat_256k=False)[:4]
    report = parity_check(Target("cpu"), Target("cpu", native=False), cases=cases)
    assert not report["passed"]
    assert report["total"]["unexplained"] > 0.5 * report["total"]["mismatches"] > 0


@pytest.mark.skipif(not native_available(), reason="the compiled CPU kernels are not available: one CPU path only")
def test_compiled_kernels_and_torch_path_agree_up_to_rounding():
    """The CPU stand-in for CPU vs CUDA: the torch path (what CUDA runs) against the compiled kernels.
    Tokens may differ only on rounding boundaries, which the on-boundary cases provoke on purpose."""
    cases = parity_cases(quick=True, include_flat_256k=False)
    report = parity_check(Target("cpu"), Target("cpu", native=False), cases=cases)
    assert report["passed"], report["failures"]
    natural = [r for r in report["cases"] if not r["case"].startswith("on-boundary")]
    assert sum(r["mismatches"] for r in natural) == 0, natural


@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")
def test_check_on_cuda_quick(capsys):
    code = check_main(["--quick"])
    output = capsys.readouterr().out
    assert code == 0, output


@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")
@pytest.mark.parametrize("mode", ["argmax", "sampled", "relaxed"])
def test_cuda_matches_cpu_on_ordinary_inputs(mode):
    args = _call(32, 3, 3000, mode)
    cpu = sv.stochastic_acceptance_sampler(**args)
    cuda = sv.stochastic_acceptance_sampler(**{k: v.cuda() if isinstance(v, torch.Tensor) else v for k, v in args.items()})
    assert outputs_equal(cpu, tuple(t.cpu() for t in cuda))


@pytest.mark.skipif(HAS_CUDA, reason="a CUDA device exists: auto picks it")
def test_specverify_check_runs_on_the_device_at_hand(capsys):
    """`specverify check` without --device on a machine without CUDA: the CPU's default backend against its
    torch reference path, parity and a timing beside one amax read, exit 0."""
    from specverify import cli

    code = cli.main(["check", "--quick", "--sections", "parity,timing"])
    output = capsys.readouterr().out
    report = json.loads(output.strip().splitlines()[-1])
    assert code == 0, output
    assert report["candidate"] == "cpu" and report["reference"] == "cpu (torch path)"
    assert report["parity"]["total"]["unexplained"] == 0
    cases = report["timing"]["cases"]
    assert cases["read floor (amax)"]["x_read_floor"] == 1.0
    assert {"argmax, validate=False", "sampled, validate=False", "all greedy, validate=False"} <= set(cases)
    assert "  timing " in output and "x one torch.amax read" in output
