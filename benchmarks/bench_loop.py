"""The main loop side by side with what a user would otherwise reach for, on the embedded SmolLM2-135M-Instruct.

In one process, on the same loaded model and the same chat prompts (every built-in example), greedy and
at temperature 0.7, `--max-tokens` new tokens each, with `--engine transformers` (default):
- transformers `model.generate` (plain), and its prompt-lookup decoding
  (`generate(prompt_lookup_num_tokens=K)`) at K = 4 and 10;
- specverify's plain loop, and its speculative loop with the n-gram (prompt-lookup) drafter at fixed
  K = 4 and 10 and at K = auto.
With `--engine llamacpp` (GGUF as shipped, or `--llamacpp-f16`), on llama.cpp with `--threads` threads:
- llama.cpp's own generation through llama-cpp-python's `Llama` (plain), and its prompt-lookup decoding
  (`Llama(draft_model=LlamaPromptLookupDecoding(num_pred_tokens=K))`) at K = 4 and 10;
- specverify's loops as above, on specverify's llama.cpp engine (the same weights and kernels);
- with `--with-transformers`, also specverify's plain and K = auto loops on the transformers engine.
Every method first runs 8 tokens untimed (builds, calibrations, first-shape allocations); then `--repeats`
rounds, each timing every method once in turn, so that the machine's load falls on all alike. Times are
whole generations (prefill included) from the caller's side and, on llama.cpp, also decoding alone (from
the first new token to the last; ratios then compare those decode rates). Ratios are taken within a
round and reported as min and median over the rounds. "same as plain": whether a method's tokens (first
round, seed 0) equal plain decoding's on its engine, and where not, the first differing token and the
logit margin there (plain's token minus the other's, in plain decoding's own one-token evaluation).

transformers' and llama.cpp's prompt lookup draw with a running generator: under sampling their output
depends on K and on the drafts, and they decode one request at a time; specverify keys every draw by
(`request_seed(seed, position)`), so its output is the same for any K, drafter or batch.

Prints a table and, on the last line, all results as one JSON object.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import time

import torch

from specverify.decoding import NgramDrafter, SamplingParams, plain_generate, speculative_generate
from specverify.decoding.engines.loading import load_model, torch_threads
from specverify.decoding.examples import EXAMPLES

LOOKUP_KS = (4, 10)
FIXED_KS = (4, 10)
NAMES = tuple(EXAMPLES)
TEMPERATURES = (0.0, 0.7)


def hf_generate(loaded, ids: list[int], temperature: float, max_tokens: int, lookup: int | None, seed: int):
    """transformers generate (prompt lookup with `lookup` tokens, or plain) -> new tokens."""
    model = loaded.model.model
    eos = sorted(loaded.tokenizer.stop_tokens)
    sampling = (
        {"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0}
        if temperature
        else {"do_sample": False, "temperature": None, "top_k": None, "top_p": None}
    )
    torch.manual_seed(seed)
    inputs = torch.tensor([ids])
    out = model.generate(
        inputs,
        attention_mask=torch.ones_like(inputs),
        max_new_tokens=max_tokens,
        eos_token_id=eos,
        pad_token_id=eos[0],
        prompt_lookup_num_tokens=lookup,
        **sampling,
    )
    return out[0, len(ids) :].tolist()


def methods(loaded, ids: list[int], temperature: float, max_tokens: int):
    """name -> run(seed) -> (new tokens, tokens per target step or None, seconds to the first token or None)."""
    table = {"hf plain": lambda seed: (hf_generate(loaded, ids, temperature, max_tokens, None, seed), None, None)}
    for k in LOOKUP_KS:
        table[f"hf lookup K={k}"] = lambda seed, k=k: (
            hf_generate(loaded, ids, temperature, max_tokens, k, seed),
            None,
            None,
        )
    return {**table, **ours(loaded, ids, temperature, max_tokens)}


def ours(loaded, ids: list[int], temperature: float, max_tokens: int, prefix: str = "sv", ks=(*FIXED_KS, "auto")):
    """specverify's plain loop and its speculative loop (n-gram drafter, each K in ks) on loaded's engine,
    named "<prefix> plain", "<prefix> K=<k>"."""
    params = SamplingParams(temperature=temperature)
    common = {"max_tokens": max_tokens, "stop_tokens": loaded.tokenizer.stop_tokens}

    def loop(k):
        def run(seed):
            start, first = time.perf_counter(), []

            def on_step(event):
                return first or first.append(time.perf_counter() - start)

            if k is None:
                result = plain_generate(loaded.model, [ids], params, seed=seed, on_step=on_step, **common)
            else:
                result = speculative_generate(
                    loaded.model, NgramDrafter(), [ids], params, k=k, seed=seed, on_step=on_step, **common
                )
            return result.tokens[0], result.tokens_per_step, first[0]

        return run

    table = {f"{prefix} plain": loop(None)}
    for k in ks:
        table[f"{prefix} K={k}"] = loop(k)
    return table


@contextlib.contextmanager
def without_extra_buffers():
    """llama-cpp-python's high-level `Llama` loads its model without llama.cpp's extra weight buffers, as
    specverify's llama.cpp engine does (their AMX kernels segfault on this machine's CPUs, see
    decoding/llamacpp.py): both sides then run the same matmul kernels."""
    import llama_cpp.llama_cpp as low_level

    default = low_level.llama_model_default_params

    def params():
        chosen = default()
        chosen.use_extra_bufts = False
        return chosen

    low_level.llama_model_default_params = params
    try:
        yield
    finally:
        low_level.llama_model_default_params = default


def llama_cpp_llms(path, threads: int) -> dict:
    """llama.cpp's own generation through its high-level `Llama`: plain, and its prompt-lookup decoding
    (`LlamaPromptLookupDecoding`, default n-gram size 2) at each K in LOOKUP_KS -> name -> Llama. Flash
    attention on, as in specverify's llama.cpp engine (and llama.cpp's own "auto" default)."""
    from llama_cpp import Llama
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    def llm(lookup):
        draft = None if lookup is None else LlamaPromptLookupDecoding(num_pred_tokens=lookup)
        with without_extra_buffers():
            return Llama(
                str(path),
                n_ctx=2048,
                n_threads=threads,
                n_threads_batch=threads,
                draft_model=draft,
                flash_attn=True,
                verbose=False,
            )

    return {"lc plain": llm(None), **{f"lc lookup K={k}": llm(k) for k in LOOKUP_KS}}


def lc_generate(llm, ids: list[int], temperature: float, max_tokens: int, stop_tokens, seed: int):
    """llama.cpp's `Llama.generate` from token ids, no prompt cache (reset first), greedy at T = 0, else
    temperature alone (top-k, top-p, min-p off) -> (new tokens, None, seconds to the first token)."""
    llm.reset()
    llm.set_seed(seed)
    start, first, tokens = time.perf_counter(), None, []
    for token in llm.generate(ids, temp=temperature, top_k=0, top_p=1.0, min_p=0.0, repeat_penalty=1.0):
        first = first if first is not None else time.perf_counter() - start
        tokens.append(token)
        if token in stop_tokens or len(tokens) == max_tokens:
            break
    return tokens, None, first


def llamacpp_methods(loaded, llms: dict, ids: list[int], temperature: float, max_tokens: int, transformers=None):
    """llama.cpp's own plain and lookup generation beside specverify's loops on llama.cpp (same weights),
    and, given the model loaded on transformers, specverify's plain and K=auto loops there ("tf ...")."""
    stop = loaded.tokenizer.stop_tokens
    table = {
        name: lambda seed, llm=llm: lc_generate(llm, ids, temperature, max_tokens, stop, seed)
        for name, llm in llms.items()
    }
    table.update(ours(loaded, ids, temperature, max_tokens))
    if transformers is not None:
        table.update(ours(transformers, ids, temperature, max_tokens, "tf", ("auto",)))
    return table


def timed(run, seed: int) -> tuple[float, float | None, list[int], float | None]:
    """(tokens/s of the whole generation, decode tokens/s after the first token, tokens, tokens per step)."""
    start = time.perf_counter()
    tokens, per_step, first = run(seed)
    seconds = time.perf_counter() - start
    decode = (len(tokens) - 1) / (seconds - first) if first is not None and len(tokens) > 1 else None
    return len(tokens) / seconds, decode, tokens, per_step


def divergence(model, ids: list[int], plain: list[int], other: list[int]) -> dict | None:
    """Where `other` first leaves `plain` (None if never): the token index and the logit margin there,
    logit(plain's token) - logit(other's token), in plain decoding's own evaluation (the prompt in one
    pass, then one token at a time)."""
    index = next((i for i, (a, b) in enumerate(zip(plain, other)) if a != b), None)
    if index is None:
        return None if len(plain) == len(other) else {"index": min(len(plain), len(other)), "margin": None}
    session = model.session(1)
    session.extend(torch.tensor([ids[:-1]]), return_logits=False)
    logits = None
    for token in [ids[-1], *plain[:index]]:
        logits = session.extend(torch.tensor([[token]]))[0, 0]
    return {"index": index, "margin": round(float(logits[plain[index]] - logits[other[index]]), 4)}


def same_as_plain(models: dict, ids, method: str, first_round: dict, temperature: float, baseline: str):
    """Whether a method's tokens (seed 0) equal plain decoding's on its engine: True, or where they part
    (`divergence` on models[method's prefix]). A lookup under sampling draws with its sampler's running
    state: not comparable (None)."""
    if method.endswith("plain") or (temperature and "lookup" in method):
        return None
    prefix = method.split()[0]
    plain = first_round[f"{prefix} plain" if prefix in ("sv", "tf") else baseline][2]
    where = divergence(models[prefix], ids, plain, first_round[method][2])
    return True if where is None else where


def ratios(rounds: list[dict], method: str, reference, slot: int) -> list[float]:
    """[min, median] over rounds of method's rate (slot 0: whole, 1: decode) over reference(round)'s."""
    values = [rnd[method][slot] / reference(rnd) for rnd in rounds]
    return [round(min(values), 3), round(statistics.median(values), 3)]


def measure(table: dict, warm_up: dict, baseline: str, repeats: int) -> tuple[dict, dict]:
    """Time every method `repeats` rounds (each round every method once, in turn) after an untimed short
    run of each -> (per method: rates and ratios, the first round's results)."""
    for run in warm_up.values():
        run(0)  # untimed and short: one-time work (builds, calibration, first-shape allocations)
    rounds = [{method: timed(run, r) for method, run in table.items()} for r in range(repeats)]
    lookups = [f"{baseline.split()[0]} lookup K={k}" for k in LOOKUP_KS]
    slot = 1 if rounds[0][baseline][1] is not None else 0  # decode rates where every method has them
    out = {}
    for method in table:
        per_step = [rnd[method][3] for rnd in rounds if rnd[method][3] is not None]
        out[method] = {
            "tokens_per_second": round(statistics.median(rnd[method][0] for rnd in rounds), 2),
            "decode_tokens_per_second": None
            if slot == 0
            else round(statistics.median(rnd[method][1] for rnd in rounds), 2),
            "tokens": statistics.median(len(rnd[method][2]) for rnd in rounds),
            "tokens_per_step": round(statistics.median(per_step), 3) if per_step else None,
            "vs_plain": ratios(rounds, method, lambda rnd: rnd[baseline][slot], slot),
            "vs_sv_plain": ratios(rounds, method, lambda rnd: rnd["sv plain"][slot], slot),
            "vs_best_lookup": ratios(rounds, method, lambda rnd: max(rnd[k][slot] for k in lookups), slot),
        }
    return out, rounds[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--examples", default=",".join(NAMES), help="comma-separated built-in examples")
    parser.add_argument("--temperatures", default=",".join(map(str, TEMPERATURES)))
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--engine",
        default="transformers",
        choices=("transformers", "llamacpp"),
        help="transformers (beside model.generate) or llamacpp (beside llama.cpp's own Llama)",
    )
    parser.add_argument("--llamacpp-f16", action="store_true", help="with --engine llamacpp: the F16 copy")
    parser.add_argument(
        "--with-transformers",
        action="store_true",
        help="with --engine llamacpp: also specverify's plain and K=auto loops on transformers",
    )
    args = parser.parse_args()
    torch.set_num_threads(torch_threads(args.engine, args.threads))
    loaded = load_model(engine=args.engine, threads=args.threads, f16=args.llamacpp_f16)
    prefix = "hf" if args.engine == "transformers" else "lc"
    llms = llama_cpp_llms(loaded.model.path, args.threads) if args.engine == "llamacpp" else None
    transformers = load_model() if llms and args.with_transformers else None
    models = {prefix: loaded.model, "sv": loaded.model, "tf": transformers and transformers.model}
    load_before = os.getloadavg()
    results = {}
    print(
        f"{loaded.source}, {args.threads} thread(s); rates of whole generations (prefill included) and, "
        f"where measured, of decoding after the first token; ratios of {'decode' if llms else 'whole'} rates, "
        f"min-median over rounds"
    )
    print(
        f"{'example':9} {'T':>3} {'method':14} {'tok/s':>6} {'dec/s':>6} {'tok/step':>8} {f'x {prefix} plain':>12} "
        f"{'x sv plain':>11} {'x best lookup':>13}  same as plain"
    )
    for name in args.examples.split(","):
        ids = loaded.tokenizer.encode_chat(EXAMPLES[name])
        for temperature in (float(t) for t in args.temperatures.split(",")):
            rows, first_round = measure(
                *(
                    llamacpp_methods(loaded, llms, ids, temperature, n, transformers)
                    if llms
                    else methods(loaded, ids, temperature, n)
                    for n in (args.max_tokens, 8)
                ),
                f"{prefix} plain",
                args.repeats,
            )
            for method, row in rows.items():
                row["same_as_plain"] = same_as_plain(models, ids, method, first_round, temperature, f"{prefix} plain")
                per_step = "" if row["tokens_per_step"] is None else f"{row['tokens_per_step']:.2f}"
                decode = "" if row["decode_tokens_per_second"] is None else f"{row['decode_tokens_per_second']:.1f}"
                shown = ["{:.2f}-{:.2f}".format(*row[key]) for key in ("vs_plain", "vs_sv_plain", "vs_best_lookup")]
                same = row["same_as_plain"]
                same = (
                    ""
                    if same is None
                    else "yes"
                    if same is True
                    else (f"no: token {same['index']}, margin {same['margin']}")
                )
                print(
                    f"{name:9} {temperature:3.1f} {method:14} {row['tokens_per_second']:6.1f} {decode:>6} "
                    f"{per_step:>8} {shown[0]:>12} {shown[1]:>11} {shown[2]:>13}  {same}",
                    flush=True,
                )
            results[f"{name}@T={temperature}"] = rows
    load_after = os.getloadavg()
    print(f"load average (1, 5, 15 min): before {load_before}, after {load_after}; threads {args.threads}")
    print(
        json.dumps(
            {
                "settings": vars(args),
                "model": loaded.source,
                "load_average": {"before": load_before, "after": load_after},
                "results": results,
            }
        )
    )


if __name__ == "__main__":
    main()
