"""The main loop side by side with what a user would otherwise reach for, on the embedded SmolLM2-135M-Instruct.

In one process, on the same loaded model and the same chat prompts (every built-in example), greedy and
at temperature 0.7, `--max-tokens` new tokens each:
- transformers `model.generate` (plain), and its prompt-lookup decoding
  (`generate(prompt_lookup_num_tokens=K)`) at K = 4 and 10;
- specverify's plain loop, and its speculative loop with the n-gram (prompt-lookup) drafter at fixed
  K = 4 and 10 and at K = auto.
Every method first runs 8 tokens untimed (builds, calibrations, first-shape allocations); then `--repeats`
rounds, each timing every method once in turn, so that the machine's load falls on all alike. Times are
whole generations (prefill included) from the caller's side. Ratios are taken within a round and
reported as min and median over the rounds.

transformers' prompt lookup draws with the global torch generator: under sampling its output depends on K
and on the drafts, and it decodes one request at a time; specverify keys every draw by (request seed +
position), so its output is the same for any K, drafter or batch.

Prints a table and, on the last line, all results as one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch

from specverify.decoding import NgramDrafter, SamplingParams, plain_generate, speculative_generate
from specverify.decoding.examples import EXAMPLES
from specverify.decoding.loading import load_model

LOOKUP_KS = (4, 10)
FIXED_KS = (4, 10)
NAMES = ("copy", "code", "chat", "json")
TEMPERATURES = (0.0, 0.7)


def hf_generate(loaded, ids: list[int], temperature: float, max_tokens: int, lookup: int | None, seed: int):
    """transformers generate (prompt lookup with `lookup` tokens, or plain) -> new tokens."""
    model = loaded.model.model
    eos = sorted(loaded.tokenizer.stop_tokens)
    sampling = {"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0} if temperature else {
        "do_sample": False, "temperature": None, "top_k": None, "top_p": None}
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
    return out[0, len(ids):].tolist()


def methods(loaded, ids: list[int], temperature: float, max_tokens: int):
    """name -> run(seed) -> (new tokens, tokens per target step or None)."""
    params = SamplingParams(temperature=temperature)
    common = {"max_tokens": max_tokens, "stop_tokens": loaded.tokenizer.stop_tokens}
    table = {"hf plain": lambda seed: (hf_generate(loaded, ids, temperature, max_tokens, None, seed), None)}
    for k in LOOKUP_KS:
        table[f"hf lookup K={k}"] = lambda seed, k=k: (hf_generate(loaded, ids, temperature, max_tokens, k, seed), None)

    def ours(k):
        def run(seed):
            if k is None:
                result = plain_generate(loaded.model, [ids], params, seed=seed, **common)
            else:
                result = speculative_generate(loaded.model, NgramDrafter(), [ids], params, k=k, seed=seed, **common)
            return result.tokens[0], result.tokens_per_step
        return run

    table["sv plain"] = ours(None)
    for k in (*FIXED_KS, "auto"):
        table[f"sv K={k}"] = ours(k)
    return table


def timed(run, seed: int) -> tuple[float, int, float | None]:
    start = time.perf_counter()
    tokens, per_step = run(seed)
    seconds = time.perf_counter() - start
    return len(tokens) / seconds, len(tokens), per_step


def measure(loaded, name: str, temperature: float, max_tokens: int, repeats: int) -> dict:
    ids = loaded.tokenizer.encode_chat(EXAMPLES[name])
    for run in methods(loaded, ids, temperature, 8).values():
        run(0)  # untimed and short: one-time work (builds, calibration, first-shape allocations)
    table = methods(loaded, ids, temperature, max_tokens)
    rounds = []
    for r in range(repeats):
        rounds.append({method: timed(run, r) for method, run in table.items()})
    out = {}
    for method in table:
        rates = [rnd[method][0] for rnd in rounds]
        vs_plain = [rnd[method][0] / rnd["hf plain"][0] for rnd in rounds]
        best_lookup = [max(rnd[f"hf lookup K={k}"][0] for k in LOOKUP_KS) for rnd in rounds]
        vs_lookup = [rnd[method][0] / b for rnd, b in zip(rounds, best_lookup)]
        vs_sv_plain = [rnd[method][0] / rnd["sv plain"][0] for rnd in rounds]
        per_step = [rnd[method][2] for rnd in rounds if rnd[method][2] is not None]
        out[method] = {
            "tokens_per_second": round(statistics.median(rates), 2),
            "tokens": statistics.median(rnd[method][1] for rnd in rounds),
            "tokens_per_step": round(statistics.median(per_step), 3) if per_step else None,
            "vs_hf_plain": [round(min(vs_plain), 3), round(statistics.median(vs_plain), 3)],
            "vs_sv_plain": [round(min(vs_sv_plain), 3), round(statistics.median(vs_sv_plain), 3)],
            "vs_best_lookup": [round(min(vs_lookup), 3), round(statistics.median(vs_lookup), 3)],
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--examples", default=",".join(NAMES), help="comma-separated built-in examples")
    parser.add_argument("--temperatures", default=",".join(map(str, TEMPERATURES)))
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    loaded = load_model()
    load_before = os.getloadavg()
    results = {}
    print(f"{'example':8} {'T':>4} {'method':16} {'tok/s':>7} {'tok/step':>8} {'x hf plain':>12} "
          f"{'x sv plain':>12} {'x best lookup':>14}   (ratios: min-median over rounds)")
    for name in args.examples.split(","):
        for temperature in (float(t) for t in args.temperatures.split(",")):
            rows = measure(loaded, name, temperature, args.max_tokens, args.repeats)
            results[f"{name}@T={temperature}"] = rows
            for method, row in rows.items():
                per_step = "" if row["tokens_per_step"] is None else f"{row['tokens_per_step']:.2f}"
                ratios = ["{:.2f}-{:.2f}".format(*row[key]) for key in ("vs_hf_plain", "vs_sv_plain", "vs_best_lookup")]
                print(f"{name:8} {temperature:4.1f} {method:16} {row['tokens_per_second']:7.1f} {per_step:>8} "
                      f"{ratios[0]:>12} {ratios[1]:>12} {ratios[2]:>14}", flush=True)
    load_after = os.getloadavg()
    print(f"load average (1, 5, 15 min): before {load_before}, after {load_after}; threads {args.threads}")
    print(json.dumps({
        "settings": vars(args),
        "load_average": {"before": load_before, "after": load_after},
        "results": results,
    }))


if __name__ == "__main__":
    main()
