"""Run in the vLLM venv by the vLLM tests: one real LLM engine built from a JSON job, its batches generated
in order, one JSON result written (a batch vLLM refuses is recorded as {"error": message}). Usage: python vllm_driver.py JOB.json RESULT.json

JOB: {"engine": {LLM keyword arguments, "model" included}, "batches": {name: [{"prompt": str,
"params": {SamplingParams keyword arguments}}, ...]}}. Each batch is one `LLM.generate` call.
RESULT: {"batches": {name: [{"token_ids": [...], "text": str, "logprobs": [[[id, logprob], ...], ...] | null,
"sequences": [the same for each of the request's n sequences]}]},
"hooked": whether specverify's hooks are installed in this process, "start_seconds", "generate_seconds"}.
The engine is shut down before the script exits, so at most one engine runs per job.
"""

from __future__ import annotations

import json
import sys
import time


def _sequence(completion) -> dict:
    """One generated sequence: its ids, text, and per token the returned logprobs as [id, value]."""
    logprobs = None
    if completion.logprobs is not None:
        logprobs = [
            [[int(token), float(entry.logprob)] for token, entry in step.items()] for step in completion.logprobs
        ]
    return {"token_ids": list(completion.token_ids), "text": completion.text, "logprobs": logprobs}


def _completion(output) -> dict:
    """One request's result: its first sequence, and every sequence in vLLM's order ("sequences", n of them)."""
    sequences = [_sequence(completion) for completion in output.outputs]
    return {**sequences[0], "sequences": sequences}


def _params(params: dict) -> dict:
    """SamplingParams keywords from JSON: logit_bias keys as int ids (JSON keys are strings), and
    structured_outputs as vLLM's StructuredOutputsParams."""
    from vllm.sampling_params import StructuredOutputsParams

    if "logit_bias" in params:
        params = {**params, "logit_bias": {int(token): bias for token, bias in params["logit_bias"].items()}}
    if "structured_outputs" in params:
        params = {**params, "structured_outputs": StructuredOutputsParams(**params["structured_outputs"])}
    return params


def main(job_path: str, result_path: str) -> None:
    from vllm import LLM, SamplingParams
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    with open(job_path) as file:
        job = json.load(file)
    started = time.perf_counter()
    llm = LLM(**job["engine"])
    start_seconds = time.perf_counter() - started
    batches, seconds = {}, {}
    for name, requests in job["batches"].items():
        began = time.perf_counter()
        try:
            outputs = llm.generate(
                [request["prompt"] for request in requests],
                [SamplingParams(**_params(request["params"])) for request in requests],
                use_tqdm=False,
            )
        except Exception as err:  # a request vLLM refuses: recorded, and the engine goes on
            batches[name] = {"error": f"{type(err).__name__}: {err}"}
            continue
        seconds[name] = time.perf_counter() - began
        batches[name] = [_completion(output) for output in outputs]
    result = {
        "batches": batches,
        "hooked": hasattr(GPUModelRunner._sample, "_specverify_original"),
        "start_seconds": start_seconds,
        "generate_seconds": seconds,
    }
    with open(result_path, "w") as file:
        json.dump(result, file)
    llm.llm_engine.engine_core.shutdown()


if __name__ == "__main__":
    main(*sys.argv[1:3])
