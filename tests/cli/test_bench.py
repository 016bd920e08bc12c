"""`specverify bench`: what it reports and that its baseline samples what peers sample (no timings asserted)."""

from __future__ import annotations

import json

import pytest
import torch

import specverify as sv
from specverify.bench import make_batch, make_tree, peak_extra_bytes, sort_based_baseline
from specverify.cli import main

CASES = [
    "read floor (amax)",
    "torch.softmax",
    "argmax, validate=False",
    "argmax, validate=True",
    "sampled, validate=False",
    "relaxed, every row thinking",
    "all greedy, validate=False",
    "all greedy, validate=True",
    "sort-based baseline",
]


def test_the_last_line_is_one_json_object_with_every_case(capsys):
    assert main(["bench", "--batch", "3", "--drafts", "2", "--vocab", "700", "--repeats", "2"]) == 0
    out, err = capsys.readouterr()
    lines = out.strip().splitlines()
    results = json.loads(lines[-1])
    progress = err.splitlines()  # one line per case as it starts, on stderr
    assert progress[0] == "specverify bench: B=3 K=2 V=700 float32 on cpu"
    assert progress[1:] == [
        f"  timing {i + 1}/{len(results['cases'])}: {name}" for i, name in enumerate(results["cases"])
    ]
    config = results["config"]
    assert (config["B"], config["K"], config["V"], config["dtype"], config["repeats"]) == (3, 2, 700, "float32", 2)
    assert config["kernels"] and config["kernels_load_s"] >= 0
    assert [name for name in results["cases"] if name in CASES] == CASES
    for name, entry in results["cases"].items():
        assert 0 < entry["min_ms"] <= entry["median_ms"], name
        assert entry["x_softmax"] > 0 and entry["x_read_floor"] > 0, name
        assert ("peak_extra_x_logits" in entry) == name.startswith(("argmax", "sampled", "relaxed", "all greedy")), name
    assert results["cases"]["torch.softmax"]["x_softmax"] == 1.0
    assert results["cases"]["read floor (amax)"]["x_read_floor"] == 1.0
    assert any(line.startswith("argmax, validate=False") for line in lines)  # the table


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--repeats", "0"], "--repeats must be >= 1 (got 0)"),
        (["--drafts", "-1"], "--drafts must be >= 0 (got -1)"),
        (["--threads", "-1"], "--threads must be >= 1 (got -1)"),
        (
            ["--modes", "argmax,fast"],
            "--modes must name cases among argmax, sampled, relaxed, greedy, sort, tree (got 'argmax,fast')",
        ),
        (["--modes", ","], "--modes must name cases among argmax, sampled, relaxed, greedy, sort, tree (got ',')"),
        (
            ["--vocab", "1000000000"],
            "--batch 32 x (--drafts 4 + 1) x --vocab 1000000000 logits need about 31,471.3 GiB",
        ),
    ],
)
def test_bad_arguments_are_one_line_before_any_work(capsys, argv, message):
    threads = torch.get_num_threads()
    assert main(["bench", *argv]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith(f"specverify bench: error: {message}") and err.count("\n") == 1
    assert torch.get_num_threads() == threads


def test_the_sort_based_baseline_draws_inside_the_truncated_support():
    batch = make_batch(6, 3, 400, torch.float32, seed=5)
    positions = batch.target_logits.shape[0] // 6

    def per_row(t):
        return t.repeat_interleave(positions)

    probs = sv.truncated_probs(
        batch.target_logits, per_row(batch.temperature), per_row(batch.top_k), per_row(batch.top_p)
    )
    for _ in range(20):
        tokens = sort_based_baseline(batch)
        assert (probs.gather(1, tokens[:, None]) > 0).all()
    greedy = per_row(batch.temperature) == 0
    assert torch.equal(tokens[greedy], batch.target_logits[greedy].argmax(-1))


def test_peak_extra_bytes_counts_what_a_call_allocates():
    size = 1 << 20
    assert size * 4 <= peak_extra_bytes(lambda: torch.ones(size)) < size * 4 + 65536
    assert peak_extra_bytes(lambda: None) == 0


def test_the_tree_rows_sit_beside_the_chains_of_the_same_depth_and_of_as_many_nodes(capsys):
    assert (
        main(["bench", "--batch", "3", "--drafts", "2", "--vocab", "700", "--repeats", "2", "--modes", "argmax,tree"])
        == 0
    )
    results = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert (results["config"]["tree_nodes"], results["config"]["tree_depth"]) == (8, 2)
    assert 0 <= results["config"]["tree_mean_path_length"] <= 2
    for validate in (False, True):
        assert f"tree N=8 depth 2, validate={validate}" in results["cases"]
        assert f"chain K=8, validate={validate}" in results["cases"]
        assert f"argmax, validate={validate}" in results["cases"]  # the chain of the tree's depth


def test_the_benchmark_tree_expands_the_most_likely_tokens_along_its_spine():
    batch = make_batch(4, 12, 300, torch.float32, seed=2)
    draft, parents = make_tree(batch, depth=3)
    assert parents[0].tolist() == [-1] * 4 + [0] * 4 + [4] * 4
    logits = batch.target_logits.view(4, 13, 300)
    for level, index in enumerate((0, 1, 5)):  # the root, then the first node (spine) of each level
        assert torch.equal(draft[:, 4 * level : 4 * level + 4], logits[:, index].topk(4, dim=-1).indices)
