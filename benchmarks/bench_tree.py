"""Tree steps against chains and plain decoding in the real loop, on the embedded SmolLM2-135M-Instruct.

Two measurements, both in one process on the same loaded model:

- The loop (default): on the built-in chat prompts (every example given), greedy and at temperature 0.7,
  `--max-tokens` new tokens each: specverify's plain loop, its chain loop with the n-gram drafter at each
  `--chain-ks` (fixed K, and "auto"), and its tree loop with the n-gram trie at each `--tree-nodes`. Every
  method first runs 8 tokens untimed; then `--repeats` rounds, each running every method once in turn, so
  that the machine's load falls on all alike. tokens/s is decoding's (prefill excluded, as `specverify
  generate` reports it). The best chain is the chain K with the highest median tokens/s; ratios against it
  and against plain are taken within a round, reported as min and median over the rounds.
- The cost curve (`--cost`): on the code prompt's context, the time of one target forward over a step of
  n tokens (the root plus n - 1 nodes; a chain of K = n - 1 drafts and a tree of n - 1 nodes, the 16-wide
  trie's shape, cut to n - 1 nodes) plus its verification, against n; min and median over `--repeats`.

Prints a table and, on the last line, all results as one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch

import specverify
from specverify.decoding import (
    NgramDrafter,
    NgramTrieDrafter,
    SamplingParams,
    plain_generate,
    speculative_generate,
    tree_generate,
)
from specverify.decoding.drafting.tree import continuation_trie
from specverify.decoding.engines.loading import load_model
from specverify.decoding.examples import EXAMPLES
from specverify.decoding.params import row_params

NAMES = ("copy", "code", "chat", "json")
TEMPERATURES = (0.0, 0.7)
CHAIN_KS = ("2", "4", "8", "auto")
TREE_NODES = (8, 16, 32)
COST_TOKENS = (1, 2, 3, 4, 5, 7, 9, 13, 17, 25, 33)


def methods(loaded, ids: list[int], temperature: float, max_tokens: int, chain_ks, tree_nodes):
    """name -> run(seed) -> GenerationResult."""
    params = SamplingParams(temperature=temperature)
    common = {"max_tokens": max_tokens, "stop_tokens": loaded.tokenizer.stop_tokens}
    table = {"plain": lambda seed: plain_generate(loaded.model, [ids], params, seed=seed, **common)}
    for k in chain_ks:
        table[f"chain K={k}"] = lambda seed, k=k: speculative_generate(
            loaded.model, NgramDrafter(), [ids], params, k=k if k == "auto" else int(k), seed=seed, **common
        )
    for n in tree_nodes:
        table[f"tree N={n}"] = lambda seed, n=n: tree_generate(
            loaded.model, NgramTrieDrafter(), [ids], params, nodes=n, seed=seed, **common
        )
    return table


def measure(loaded, name: str, temperature: float, max_tokens: int, repeats: int, chain_ks, tree_nodes) -> dict:
    ids = loaded.tokenizer.encode_chat(EXAMPLES[name])
    for run in methods(loaded, ids, temperature, 8, chain_ks, tree_nodes).values():
        run(0)  # untimed and short: one-time work (builds, calibration, first-shape allocations)
    table = methods(loaded, ids, temperature, max_tokens, chain_ks, tree_nodes)
    rounds = [{method: run(r) for method, run in table.items()} for r in range(repeats)]
    rate = {m: [rnd[m].tokens_per_second for rnd in rounds] for m in table}
    chains = [m for m in table if m.startswith("chain")]
    best = max(chains, key=lambda m: statistics.median(rate[m]))
    out = {"best_chain": best}
    for method in table:
        vs_plain = [a / b for a, b in zip(rate[method], rate["plain"])]
        vs_best = [a / b for a, b in zip(rate[method], rate[best])]
        out[method] = {
            "tokens_per_second": [round(min(rate[method]), 2), round(statistics.median(rate[method]), 2)],
            "tokens_per_step": round(statistics.median(rnd[method].tokens_per_step for rnd in rounds), 3),
            "tokens": statistics.median(rnd[method].num_tokens for rnd in rounds),
            "vs_plain": [round(min(vs_plain), 3), round(statistics.median(vs_plain), 3)],
            "vs_best_chain": [round(min(vs_best), 3), round(statistics.median(vs_best), 3)],
        }
    return out


def cost_curve(loaded, repeats: int) -> dict:
    """Seconds of one step's forward plus verification against the tokens in the step (root + drafts)."""
    ids = loaded.tokenizer.encode_chat(EXAMPLES["code"])
    model = loaded.model
    greedy = row_params(SamplingParams(), 1)
    context = ids[:-1]
    tokens, parents = continuation_trie(ids, max(COST_TOKENS), max(COST_TOKENS), 3, 1)
    if len(tokens) < max(COST_TOKENS) - 1:  # the prompt's trie may be small: pad it as a chain of its last node
        while len(tokens) < max(COST_TOKENS) - 1:
            parents.append(len(tokens) - 1)
            tokens.append(tokens[-1] if tokens else ids[-1])
    session = model.session(1)
    session.extend(torch.tensor([context]), return_logits=False)
    root = torch.tensor([[ids[-1]]])
    out = {}
    for n in COST_TOKENS:
        chain_drafts = torch.tensor([ids[: n - 1]], dtype=torch.int64)
        times = {"chain": [], "tree": []}
        for _ in range(repeats):
            start = time.perf_counter()
            logits = session.extend(torch.cat([root, chain_drafts], 1)).float()
            first, recovered, bonus = specverify.stochastic_acceptance_sampler(
                chain_drafts, logits, greedy.temperature, greedy.top_k, None, greedy.top_p, None, torch.tensor([0])
            )
            first.tolist()
            times["chain"].append(time.perf_counter() - start)
            session.truncate(torch.tensor([len(context)]))
            nodes = torch.tensor([tokens[: n - 1]], dtype=torch.int64)
            links = torch.tensor([parents[: n - 1]], dtype=torch.int64)
            start = time.perf_counter()
            logits = session.extend_tree(root, nodes, links).float()
            path, length, _ = specverify.tree_acceptance_sampler(
                nodes, links, logits, greedy.temperature, greedy.top_k, greedy.top_p, torch.tensor([0])
            )
            length.tolist()
            times["tree"].append(time.perf_counter() - start)
            session.truncate(torch.tensor([len(context)]))
        out[n] = {kind: [round(min(t) * 1e3, 2), round(statistics.median(t) * 1e3, 2)] for kind, t in times.items()}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--examples", default=",".join(NAMES), help="comma-separated built-in examples")
    parser.add_argument("--temperatures", default=",".join(map(str, TEMPERATURES)))
    parser.add_argument("--chain-ks", default=",".join(CHAIN_KS), help="chain draft lengths: ints or auto")
    parser.add_argument("--tree-nodes", default=",".join(map(str, TREE_NODES)))
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--cost", action="store_true", help="only the cost curve (forward + verify against step tokens)"
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    loaded = load_model()
    load_before = os.getloadavg()
    results: dict = {}
    if args.cost:
        results["cost_ms"] = curve = cost_curve(loaded, args.repeats)
        base = curve[1]["chain"][0]
        print(f"{'tokens':>6} {'chain ms':>14} {'tree ms':>14} {'x 1-token (min)':>16}   (min / median)")
        for n, row in curve.items():
            print(
                f"{n:6d} {'{:.1f} / {:.1f}'.format(*row['chain']):>14} {'{:.1f} / {:.1f}'.format(*row['tree']):>14} "
                f"{row['tree'][0] / base:16.2f}"
            )
    else:
        chain_ks = args.chain_ks.split(",")
        tree_nodes = [int(n) for n in args.tree_nodes.split(",")]
        print(
            f"{'example':8} {'T':>4} {'method':12} {'tok/s min-med':>14} {'tok/step':>8} {'x plain':>12} "
            f"{'x best chain':>13}   (ratios: min-median over rounds)"
        )
        for name in args.examples.split(","):
            for temperature in (float(t) for t in args.temperatures.split(",")):
                rows = measure(loaded, name, temperature, args.max_tokens, args.repeats, chain_ks, tree_nodes)
                results[f"{name}@T={temperature}"] = rows
                for method, row in rows.items():
                    if method == "best_chain":
                        continue
                    mark = "*" if method == rows["best_chain"] else " "
                    print(
                        f"{name:8} {temperature:4.1f} {method + mark:12} {'{:.1f}-{:.1f}'.format(*row['tokens_per_second']):>14} "
                        f"{row['tokens_per_step']:8.2f} {'{:.2f}-{:.2f}'.format(*row['vs_plain']):>12} "
                        f"{'{:.2f}-{:.2f}'.format(*row['vs_best_chain']):>13}",
                        flush=True,
                    )
    load_after = os.getloadavg()
    print(
        f"load average (1, 5, 15 min): before {load_before}, after {load_after}; threads {args.threads}; * best chain"
    )
    print(
        json.dumps(
            {"settings": vars(args), "load_average": {"before": load_before, "after": load_after}, "results": results}
        )
    )


if __name__ == "__main__":
    main()
