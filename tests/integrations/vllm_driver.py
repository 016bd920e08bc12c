"""Run in the vLLM venv by the vLLM tests: one real LLM engine built from a JSON job, its batches generated
in order, one JSON result written (a batch vLLM refuses is recorded as {"error": message}). Usage: python vllm_driver.py JOB.json RESULT.json

JOB: {"engine": {LLM keyword arguments, "model" included}, "batches": {name: [{"prompt": str,
"params": {SamplingParams keyword arguments}}, ...]}}. Each batch is one `LLM.generate` call.
JOB may also hold "probes": [names of PROBES], each run in every worker after the batches. Under torchrun (one
process per data-parallel rank, vLLM's external_launcher), JOB holds "ranks" instead of "batches": rank r
(torchrun's RANK) generates ranks[r] and writes RESULT.r.
RESULT: {"batches": {name: [{"token_ids": [...], "text": str, "logprobs": [[[id, logprob], ...], ...] | null,
"sequences": [the same for each of the request's n sequences]}]}, "spec_decode": {name: vLLM's spec-decode
counters' increase over the batch: drafts, draft_tokens, accepted_tokens}, "workers": [per worker: "hooked"
(specverify's hooks on its model runner class), "check" (the plug-in's worker check: its line or error)],
"probes": {name: [per worker: what the probe saw]}, "start_seconds", "generate_seconds", "pid" (this process)}.
The engine is shut down before the script exits, so at most one engine runs per job.
"""

from __future__ import annotations

import json
import os
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


#: vLLM's spec-decode counters (`LLM.get_metrics`, the engine built with disable_log_stats=False).
SPEC_DECODE_COUNTERS = {
    "drafts": "vllm:spec_decode_num_drafts",
    "draft_tokens": "vllm:spec_decode_num_draft_tokens",
    "accepted_tokens": "vllm:spec_decode_num_accepted_tokens",
}


def _counters(llm) -> dict[str, float]:
    """The spec-decode counters now (0 for one the engine does not report)."""
    values = {metric.name: getattr(metric, "value", 0) for metric in llm.get_metrics()}
    return {key: float(values.get(name, 0)) for key, name in SPEC_DECODE_COUNTERS.items()}


def _worker_hooks(worker) -> dict:
    """Run in every worker: is the model runner's class hooked by specverify, and the plug-in's own check of
    this worker (its log line, or the error it raises)."""
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    hooked = hasattr(GPUModelRunner._sample, "_specverify_original")
    try:
        from specverify.integrations.vllm.hooks import worker_check

        return {"hooked": hooked, "check": worker_check(worker)}
    except Exception as err:
        return {"hooked": hooked, "check": f"{type(err).__name__}: {err}"}


def _sampler_outside_a_step(worker) -> str:
    """Run in every worker: call the runner's sampler as no known vLLM call site does (outside _sample and
    the warm-up) -> what it raised, or "no error"."""
    import torch

    runner = getattr(worker, "worker", worker).model_runner
    try:
        runner.sampler.sample(torch.zeros(2, 8), None)
    except Exception as err:
        return f"{type(err).__name__}: {err}"
    return "no error"


PROBES = {"sampler_outside_a_step": _sampler_outside_a_step}


def _generate(llm, requests: list[dict]):
    from vllm import SamplingParams

    return llm.generate(
        [request["prompt"] for request in requests],
        [SamplingParams(**_params(request["params"])) for request in requests],
        use_tqdm=False,
    )


def _this_rank(job: dict, result_path: str) -> tuple[dict, str]:
    """(the batches this process generates, where it writes its result): the job's own, or under torchrun
    (job["ranks"]: one batches dict per data-parallel rank) rank RANK's and RESULT.RANK."""
    if "ranks" not in job:
        return job["batches"], result_path
    rank = int(os.environ["RANK"])
    return job["ranks"][rank], f"{result_path}.{rank}"


def main(job_path: str, result_path: str) -> None:
    from vllm import LLM

    with open(job_path) as file:
        job = json.load(file)
    batches_asked, result_path = _this_rank(job, result_path)
    # collective_rpc sends the worker functions above to the engine core as pickles (this driver's own
    # functions, on a local socket), which vLLM allows only when asked
    os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"
    started = time.perf_counter()
    llm = LLM(**{"disable_log_stats": False, **job["engine"]})
    start_seconds = time.perf_counter() - started
    batches, seconds, counters = {}, {}, {}
    for name, requests in batches_asked.items():
        began, before = time.perf_counter(), _counters(llm)
        try:
            outputs = _generate(llm, requests)
        except Exception as err:  # a request vLLM refuses: recorded, and the engine goes on
            batches[name] = {"error": f"{type(err).__name__}: {err}"}
            continue
        seconds[name] = time.perf_counter() - began
        counters[name] = {key: value - before[key] for key, value in _counters(llm).items()}
        batches[name] = [_completion(output) for output in outputs]
    result = {
        "batches": batches,
        "spec_decode": counters,
        "workers": llm.collective_rpc(_worker_hooks),
        "probes": {name: llm.collective_rpc(PROBES[name]) for name in job.get("probes", [])},
        "start_seconds": start_seconds,
        "generate_seconds": seconds,
        "pid": os.getpid(),
    }
    with open(result_path, "w") as file:
        json.dump(result, file)
    llm.llm_engine.engine_core.shutdown()


if __name__ == "__main__":
    main(*sys.argv[1:3])
