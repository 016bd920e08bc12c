"""Structured output under speculation on the embedded SmolLM2-135M-Instruct (1 CPU thread by default).

1. Schema validity: seeded runs of `--example json` with examples/person.schema.json, the seed walking
   through temperatures, K, drafters (n-gram, the model itself) and proposal modes; each answer is
   checked with `jsonschema`, and every fourth argmax run against constrained plain decoding.
2. Speedup with and without the grammar: decoding tokens/s of speculative (n-gram drafter, greedy) over
   plain decoding, on `--example json` (extraction: prompt lookup rarely guesses right) and on
   `--example json-copy` (the answer copies the prompt), each measured `--repeats` times (best kept).

Prints a table per part and, on the last line, all results as one JSON object.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from specverify.decoding import (
    GrammarCompiler,
    ModelDrafter,
    NgramDrafter,
    SamplingParams,
    plain_generate,
    speculative_generate,
)
from specverify.decoding.constraints.schema import read_schema, schema_violation
from specverify.decoding.engines.loading import load_model
from specverify.decoding.examples import EXAMPLES

SCHEMA = Path(__file__).resolve().parent.parent / "examples" / "person.schema.json"
TEMPERATURES = (0.0, 0.7, 1.0)
KS = (2, 4, 6)
DRAFTERS = ("ngram", "model")
PROPOSALS = ("argmax", "sampled")


def validity(loaded, grammar, schema, ids, runs: int, max_tokens: int) -> list[dict]:
    """One row per seeded run: settings, tokens, whether complete, the schema error (None when valid)."""
    rows = []
    for seed in range(runs):
        temperature, k = TEMPERATURES[seed % 3], KS[seed // 3 % 3]
        drafter_name, proposal = DRAFTERS[seed % 2], PROPOSALS[seed // 2 % 2]
        drafter = NgramDrafter() if drafter_name == "ngram" else ModelDrafter(loaded.model)
        params = SamplingParams(temperature=temperature, top_p=0.95 if temperature else 1.0)
        common = {"seed": seed, "max_tokens": max_tokens, "stop_tokens": loaded.tokenizer.stop_tokens}
        spec = speculative_generate(
            loaded.model, drafter, [ids], params, k=k, draft_proposal=proposal, grammar=grammar, **common
        )
        row = {"seed": seed, "temperature": temperature, "k": k, "drafter": drafter_name, "proposal": proposal}
        row["tokens"] = len(spec.tokens[0])
        row["complete"] = spec.grammar_complete[0]
        row["schema_error"] = schema_violation(schema, loaded.tokenizer.decode(spec.tokens[0]))
        if proposal == "argmax" and seed % 4 == 0:
            plain = plain_generate(loaded.model, [ids], params, grammar=grammar, **common)
            row["identical_to_plain"] = plain.tokens == spec.tokens
        rows.append(row)
        print(f"{row}", flush=True)
    return rows


def speedups(loaded, grammar, ids, k: int, max_tokens: int, repeats: int) -> dict:
    """Best-of-repeats tokens/s of speculative (n-gram drafter) and plain decoding, with and without grammar."""
    out = {}
    for name, g in (("without grammar", None), ("with grammar", grammar)):
        common = {"seed": 0, "max_tokens": max_tokens, "stop_tokens": loaded.tokenizer.stop_tokens, "grammar": g}
        best = {"speculative": 0.0, "plain": 0.0}
        for _ in range(repeats):
            spec = speculative_generate(loaded.model, NgramDrafter(), [ids], SamplingParams(), k=k, **common)
            plain = plain_generate(loaded.model, [ids], SamplingParams(), **common)
            assert spec.tokens == plain.tokens
            best["speculative"] = max(best["speculative"], spec.tokens_per_second)
            best["plain"] = max(best["plain"], plain.tokens_per_second)
        out[name] = {
            "tokens": len(spec.tokens[0]),
            "tokens_per_step": round(spec.tokens_per_step, 3),
            "speculative_tokens_per_second": round(best["speculative"], 2),
            "plain_tokens_per_second": round(best["plain"], 2),
            "speedup": round(best["speculative"] / best["plain"], 3),
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=24, help="seeded validity runs (default 24)")
    parser.add_argument("--max-tokens", type=int, default=160)
    parser.add_argument("--repeats", type=int, default=3, help="timing repeats per setting (default 3)")
    parser.add_argument("-k", type=int, default=4, help="K for the speedup part (default 4)")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    loaded = load_model()
    schema = read_schema(SCHEMA)
    start = time.perf_counter()
    compiler = GrammarCompiler(loaded.tokenizer.tokenizer, loaded.model.vocab_size, loaded.tokenizer.stop_tokens)
    grammar = compiler.json_schema(schema)
    compile_seconds = time.perf_counter() - start
    ids = loaded.tokenizer.encode_chat(EXAMPLES["json"])
    rows = validity(loaded, grammar, schema, ids, args.runs, args.max_tokens)
    valid = sum(r["schema_error"] is None for r in rows)
    complete = sum(bool(r["complete"]) for r in rows)
    print(f"\nschema-valid answers: {valid}/{len(rows)}; complete: {complete}/{len(rows)}")
    timing = {}
    header = f"{'tokens':>6} {'tok/step':>8} {'spec tok/s':>10} {'plain tok/s':>11} {'speedup':>7}"
    print(f"\n{'prompt':10} {'':16} {header}")
    for example in ("json", "json-copy"):
        prompt_ids = loaded.tokenizer.encode_chat(EXAMPLES[example])
        timing[example] = speedups(loaded, grammar, prompt_ids, args.k, args.max_tokens, args.repeats)
        for name, t in timing[example].items():
            print(
                f"{example:10} {name:16} {t['tokens']:>6} {t['tokens_per_step']:>8} "
                f"{t['speculative_tokens_per_second']:>10} {t['plain_tokens_per_second']:>11} {t['speedup']:>7}"
            )
    print(
        json.dumps(
            {
                "threads": args.threads,
                "grammar_compile_seconds": round(compile_seconds, 3),
                "validity": {"valid": valid, "runs": len(rows), "rows": rows},
                "speedup": timing,
            }
        )
    )


if __name__ == "__main__":
    main()
