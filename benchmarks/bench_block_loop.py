"""Block verification against token-wise verification in the real loop, on the embedded SmolLM2-135M-Instruct
with a real draft model: tokens per step and tokens per second, side by side (issue 32, SPEC §3.6).

The draft is made from the target, with its tokenizer and its weights (no copy): by default a layer-skip
draft (its first `--draft-layers` transformer layers, then the target's final norm and tied head: a real,
cheaper model, as self-speculative decoding uses), or with `--draft-scale S` the whole target with its final
norm scaled by S (its logits x S: a draft as costly as the target whose q is flatter than p for S < 1, the
draft of the vLLM plug-in's statistical test). Either way q differs from the target's p. It samples its drafts (`draft_proposal="sampled"`), and each
step's K drafts are judged one by one ("token", SPEC §3.2) or as a block ("block", §3.6). Both rules give
the target's output law, so the gain is in drafts kept per step: tokens per step is the direct measure,
tokens per second what it buys once the draft and verifier costs are paid.

Every built-in example at each sampled temperature, `--max-tokens` new tokens, K = `--k`; `--repeats`
rounds, each running the two rules in turn on the same prompt and seeds (seed = round), so that the
machine's load falls on both alike; per round the ratio block / token of tokens per step and of tokens per
second, reported as min / median / max over rounds. Greedy rows are judged by SPEC §3.3 under both rules
(identical tokens), so greedy temperature is left out. Prints a table and, last, one JSON object.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import time

import torch

from specverify.decoding import ModelDrafter, SamplingParams, speculative_generate
from specverify.decoding.engines.hf import HFLanguageModel
from specverify.decoding.engines.loading import load_model
from specverify.decoding.examples import EXAMPLES

RULES = ("token", "block")


def layer_skip_draft(target: HFLanguageModel, layers: int) -> HFLanguageModel:
    """The target's first `layers` decoder layers, its final norm and head, sharing the target's weights
    (transformers' Llama-style models: `model.model.layers`, `config.num_hidden_layers`)."""
    model = target.model
    total = len(model.model.layers)
    if not 1 <= layers <= total:
        raise ValueError(f"--draft-layers must be in [1, {total}] (got {layers})")
    inner = copy.copy(model.model)
    inner._modules = dict(inner._modules)
    inner.layers = torch.nn.ModuleList(list(model.model.layers)[:layers])
    inner.config = copy.deepcopy(model.config)
    inner.config.num_hidden_layers = layers
    draft = copy.copy(model)
    draft._modules = dict(draft._modules)
    draft.model = inner
    draft.config = inner.config
    return HFLanguageModel(draft)


def scaled_draft(target: HFLanguageModel, scale: float) -> HFLanguageModel:
    """The whole target with its final norm's weight times `scale` (so its logits times `scale`), sharing
    every other weight."""
    model = target.model
    inner = copy.copy(model.model)
    inner._modules = dict(inner._modules)
    inner.norm = copy.deepcopy(model.model.norm)
    with torch.no_grad():
        inner.norm.weight.mul_(scale)
    draft = copy.copy(model)
    draft._modules = dict(draft._modules)
    draft.model = inner
    return HFLanguageModel(draft)


def run(loaded, draft, ids, temperature: float, k: int, max_tokens: int, seed: int, rule: str) -> dict:
    """One generation -> its tokens, tokens per step, accepted / drafted and tokens per second."""
    start = time.perf_counter()
    result = speculative_generate(
        loaded.model,
        ModelDrafter(draft),
        [ids],
        SamplingParams(temperature=temperature),
        k=k,
        seed=seed,
        max_tokens=max_tokens,
        stop_tokens=loaded.tokenizer.stop_tokens,
        draft_proposal="sampled",
        verification=rule,
    )
    seconds = time.perf_counter() - start
    return {
        "tokens": result.num_tokens,
        "steps": result.row_steps,
        "seconds": seconds,
        "tokens_per_step": result.tokens_per_step,
        "accepted": sum(result.accepted),
        "drafted": sum(result.drafted),
        "tokens_per_second": result.num_tokens / seconds,
    }


def spread(values: list[float]) -> list[float]:
    """[min, median, max], rounded."""
    return [round(min(values), 3), round(statistics.median(values), 3), round(max(values), 3)]


def measure(loaded, draft, ids, temperature: float, args) -> dict:
    """`args.repeats` rounds of both rules -> per rule its medians, the block / token ratios' spread over
    rounds, and the pooled ratios (all rounds' tokens over all their steps, or seconds, per rule)."""
    rounds = []
    for seed in range(args.repeats):
        rounds.append(
            {rule: run(loaded, draft, ids, temperature, args.k, args.max_tokens, seed, rule) for rule in RULES}
        )
    out = {
        rule: {key: round(statistics.median(r[rule][key] for r in rounds), 3) for key in rounds[0][rule]}
        for rule in RULES
    }
    for key in ("tokens_per_step", "tokens_per_second"):
        out[f"block_over_token_{key}"] = spread([r["block"][key] / r["token"][key] for r in rounds])
    totals = {
        rule: {key: sum(r[rule][key] for r in rounds) for key in ("tokens", "steps", "seconds")} for rule in RULES
    }
    out["pooled_block_over_token"] = {
        f"tokens_per_{unit}": round(
            (totals["block"]["tokens"] / totals["block"][f"{unit}s"])
            / (totals["token"]["tokens"] / totals["token"][f"{unit}s"]),
            3,
        )
        for unit in ("step", "second")
    }
    out["acceptance"] = {
        rule: sum(r[rule]["accepted"] for r in rounds) / max(1, sum(r[rule]["drafted"] for r in rounds))
        for rule in RULES
    }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--examples", default=",".join(EXAMPLES), help="comma-separated built-in examples")
    parser.add_argument("--temperatures", default="0.7,1.0", help="sampled temperatures (greedy is the same rule)")
    parser.add_argument("--draft-layers", type=int, default=20, help="the layer-skip draft's layers (of 30)")
    parser.add_argument("--draft-scale", type=float, help="instead: the whole target, its logits times this")
    parser.add_argument("-k", type=int, default=4, help="drafts per step")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    loaded = load_model()
    if args.draft_scale is None:
        draft, described = layer_skip_draft(loaded.model, args.draft_layers), f"its first {args.draft_layers} layers"
    else:
        draft, described = scaled_draft(loaded.model, args.draft_scale), f"itself, logits x {args.draft_scale:g}"
    load_before = os.getloadavg()
    print(
        f"{loaded.source}, draft: {described}; K = {args.k}, {args.max_tokens} tokens, "
        f"{args.repeats} rounds, {args.threads} thread(s); block / token ratios min / median / max over rounds"
    )
    print(
        f"{'example':9} {'T':>4} {'accept tok':>10} {'accept blk':>10} {'tok/step ratio':>20} {'pooled':>6} "
        f"{'tok/s ratio':>20} {'pooled':>6}"
    )
    results = {}
    for name in args.examples.split(","):
        ids = loaded.tokenizer.encode_chat(EXAMPLES[name])
        for temperature in (float(t) for t in args.temperatures.split(",")):
            row = measure(loaded, draft, ids, temperature, args)
            per_step, per_second = row["block_over_token_tokens_per_step"], row["block_over_token_tokens_per_second"]
            pooled = row["pooled_block_over_token"]
            print(
                f"{name:9} {temperature:4.1f} {row['acceptance']['token']:10.3f} {row['acceptance']['block']:10.3f} "
                f"{'{:.3f}/{:.3f}/{:.3f}'.format(*per_step):>20} {pooled['tokens_per_step']:6.3f} "
                f"{'{:.3f}/{:.3f}/{:.3f}'.format(*per_second):>20} {pooled['tokens_per_second']:6.3f}",
                flush=True,
            )
            results[f"{name}@T={temperature}"] = row
    print(f"load average (1, 5, 15 min): before {load_before}, after {os.getloadavg()}")
    print(json.dumps({"settings": vars(args), "model": loaded.source, "results": results}))


if __name__ == "__main__":
    main()
