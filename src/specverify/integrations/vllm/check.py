"""The plug-in checked end to end where vLLM is installed (the `vllm` section of `specverify check`).

Two real engines on the machine's own device, one after the other, each in a child process
(`python -m specverify.integrations.vllm.check JOB RESULT`): the plug-in with n-gram speculation, and the
plug-in without speculation. The same seeded requests of mixed parameters (greedy; temperature with
top-p; top-k; min-p) go to both, and each request must give the same tokens in both: what a request
commits does not depend on the drafts (docs/spec.md). Every engine runs with usage statistics off and its
host address on loopback (`ENVIRONMENT`).

A difference is reported with its first differing position. On a GPU, logits that change with the batch
shape (a speculative step scores K + 1 positions at once) can change a token with no sampler at fault:
the check runs float32 and eager by default to keep that rare, and says so when it happens.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from .entry import ENVIRONMENT as PLUGIN_SWITCH
from .hooks import PLUGIN_ON

#: What every vLLM process we start gets: no usage statistics, the host address on loopback (vLLM
#: otherwise looks up a public address), no model downloads.
ENVIRONMENT = {
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "VLLM_HOST_IP": "127.0.0.1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
}
#: The KV cache a CPU engine reserves, in GiB, unless the environment says otherwise (vLLM's CPU default
#: claims most of the machine's memory, and refuses to start when other processes hold some); ignored on GPU.
CPU_KV_CACHE = {"VLLM_CPU_KVCACHE_SPACE": "2"}
#: n-gram speculation as the check runs it: four drafts a step, looked up in the prompt and the output.
NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 1}
#: (prompt, SamplingParams keywords): copy tasks, so that n-gram drafts are often accepted and often not.
REQUESTS = (
    ("Repeat this sentence twice: the cat sat on the mat.", {"temperature": 0.0}),
    ("List the numbers from 1 to 30: 1, 2, 3,", {"temperature": 0.7, "top_p": 0.9, "seed": 11}),
    ("Copy this list: apples, pears, plums, cherries, grapes.", {"temperature": 1.0, "top_k": 20, "seed": 12}),
    ("Write the alphabet: a b c d e f", {"temperature": 0.8, "min_p": 0.1, "seed": 13}),
)
#: The self-test's requests: stock vLLM refuses min-p with speculation, and vllm-cpu's rejection sampler
#: reads top-k per draft from memory it never wrote (docs/vllm.md), which can crash the engine.
STOCK_REQUESTS = tuple((prompt, params) for prompt, params in REQUESTS if not {"min_p", "top_k"} & set(params))
#: Seconds one engine may take, start and generation together.
ENGINE_TIMEOUT = 900


def absent_reason() -> str | None:
    """Why the check cannot run in this environment (None: vLLM is installed)."""
    if importlib.util.find_spec("vllm") is None:
        return "vLLM is not installed in this environment (the plug-in is checked where vLLM runs)"
    return None


def default_model() -> Path | None:
    """The transformers folder of the embedded SmolLM2-135M-Instruct in the model cache, the newest one
    (written when `specverify generate` or the tests first load it), or None."""
    from ...contract import cache_root

    folders = [
        folder
        for folder in cache_root().glob("SmolLM2-135M-Instruct*-transformers*")
        if (folder / "model.safetensors").is_file() and (folder / "config.json").is_file()
    ]
    return max(folders, key=lambda folder: folder.stat().st_mtime) if folders else None


def vllm_check(model: str | None, max_tokens: int = 48, dtype: str = "float32", plugin: bool = True) -> dict:
    """Both engines run on `model` (a folder or a model name vLLM can load offline; default: the embedded
    model's folder); plugin=False: stock vLLM instead, the check's self-test (its seeded requests change
    with speculation, so the check must fail) -> {"passed", "plug_in" (the line the engine logs), "requests": [{"params",
    "identical", "first_difference"}], ...}, or {"skipped": reason} where it cannot run."""
    reason = absent_reason()
    if reason is None and model is None:
        found = default_model()
        model = None if found is None else str(found)
        if model is None:
            reason = "no model: pass --vllm-model, or run `specverify generate` once to cache the embedded one"
    if reason is not None:
        return {"skipped": reason, "passed": True}
    asked = REQUESTS if plugin else STOCK_REQUESTS
    engines = {
        name: _run_engine(model, speculative, asked, max_tokens, dtype, plugin)
        for name, speculative in _ENGINES.items()
    }
    requests = []
    for (_, params), drafted, plain in zip(asked, engines["speculative"]["token_ids"], engines["plain"]["token_ids"]):
        difference = next((i for i, (a, b) in enumerate(zip(drafted, plain)) if a != b), None)
        if difference is None and len(drafted) != len(plain):
            difference = min(len(drafted), len(plain))
        requests.append({"params": params, "identical": difference is None, "first_difference": difference})
    return {
        "passed": all(request["identical"] for request in requests),
        "model": model,
        "dtype": dtype,
        "vllm": engines["plain"]["vllm"],
        "plug_in": engines["speculative"]["plug_in"],
        "speculative": NGRAM,
        "max_tokens": max_tokens,
        "requests": requests,
        "seconds": {name: engine["seconds"] for name, engine in engines.items()},
    }


#: The two engines compared: the plug-in with n-gram speculation, and without speculation.
_ENGINES = {"speculative": True, "plain": False}


def _run_engine(model: str, speculative: bool, requests: tuple, max_tokens: int, dtype: str, plugin: bool) -> dict:
    """One engine in a child process -> its result (engine_job's). RuntimeError with the end of the child's
    output when it fails."""
    job = {
        "model": model,
        "speculative": speculative,
        "requests": requests,
        "max_tokens": max_tokens,
        "dtype": dtype,
    }
    env = {**CPU_KV_CACHE, **os.environ, **ENVIRONMENT, PLUGIN_SWITCH: "1" if plugin else "0"}
    with tempfile.TemporaryDirectory() as folder:
        job_file, result_file = Path(folder) / "job.json", Path(folder) / "result.json"
        job_file.write_text(json.dumps(job))
        done = subprocess.run(
            [sys.executable, "-m", __name__, str(job_file), str(result_file)],
            cwd=folder,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=ENGINE_TIMEOUT,
            check=False,
        )
        if done.returncode != 0 or not result_file.exists():
            raise RuntimeError(f"the vLLM engine failed (exit {done.returncode}): {_cause(done.stdout)}")
        logged = re.search(f"{re.escape(PLUGIN_ON)}.*", done.stdout)
        return {
            **json.loads(result_file.read_text()),
            "plug_in": logged[0] if logged else "(stock vLLM: no plug-in line logged)",
        }


def _cause(output: str) -> str:
    """The last error line of a failed engine's output (vLLM's shutdown logs follow it), else its end."""
    errors = re.findall(r"^(?:\(\w+ pid=\d+\) ERROR [^\]]*\] )?([\w.]*(?:Error|Exception): .*)$", output, re.MULTILINE)
    return errors[-1] if errors else output[-2000:]


def engine_job(job: dict) -> dict:
    """Inside the child process: one engine (n-gram speculation or none), the job's requests generated
    in one batch -> {"token_ids": per request, "vllm": version, "seconds"}."""
    import time

    import vllm
    from vllm import LLM, SamplingParams

    began = time.perf_counter()
    llm = LLM(
        model=job["model"],
        dtype=job["dtype"],
        max_model_len=1024,
        enforce_eager=True,
        seed=0,
        speculative_config=NGRAM if job["speculative"] else None,
    )
    requests = job["requests"]
    sampling = [SamplingParams(max_tokens=job["max_tokens"], ignore_eos=True, **params) for _, params in requests]
    outputs = llm.generate([prompt for prompt, _ in requests], sampling, use_tqdm=False)
    result = {
        "token_ids": [list(output.outputs[0].token_ids) for output in outputs],
        "vllm": vllm.__version__,
        "seconds": time.perf_counter() - began,
    }
    llm.llm_engine.engine_core.shutdown()
    return result


if __name__ == "__main__":
    job_path, result_path = sys.argv[1:3]
    Path(result_path).write_text(json.dumps(engine_job(json.loads(Path(job_path).read_text()))))
