"""`specverify bench`: what it reports, how it shows it, and that its baseline samples what peers sample (no timings asserted)."""

from __future__ import annotations

import argparse
import dataclasses
import io
import json
import time

import pytest
import torch

import specverify as sv
from specverify.bench import cases
from specverify.bench.cases import Mode, Role, benchmark_cases, torch_path_cases
from specverify.bench.command import BenchSettings, bench_settings
from specverify.bench.inputs import make_batch, make_tree
from specverify.bench.measure import peak_extra_bytes, run_benchmark
from specverify.bench.peers import sort_based_baseline
from specverify.bench.report import Progress
from specverify.cli import build_parser, main
from specverify.usage import UsageError

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


def test_a_table_for_80_columns_progress_on_stderr_and_the_json_in_a_file(capsys, tmp_path):
    report = tmp_path / "bench.json"
    argv = ["bench", "--batch", "3", "--drafts", "2", "--vocab", "700", "--repeats", "2", "--json", str(report)]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    results = json.loads(report.read_text())
    progress = err.splitlines()  # a line per step as it starts, on stderr
    assert progress[0] == "specverify bench: B=3 K=2 V=700 float32 on cpu"
    timing = [line for line in progress if line.startswith("  timing ") and "/" in line.split(":")[0]]
    assert timing == [f"  timing {i + 1}/{len(results['cases'])}: {name}" for i, name in enumerate(results["cases"])]
    assert "  peak memory of argmax, validate=False" in progress
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
    lines = out.splitlines()
    assert any(line.startswith("argmax, validate=False ") for line in lines)  # the table
    assert "tree N=8 depth 2, validate=False" in lines  # a name too long for its column: a line of its own
    assert max(map(len, lines)) <= 80 and "{" not in out


def test_json_alone_prints_only_the_json(capsys):
    assert (
        main(
            ["bench", "--batch", "2", "--drafts", "1", "--vocab", "64", "--repeats", "1", "--modes", "greedy", "--json"]
        )
        == 0
    )
    results = json.loads(capsys.readouterr().out)
    assert set(results["cases"]) == {"read floor (amax)", "torch.softmax", *CASES[6:8]}


def test_a_slow_case_says_how_far_it_got_after_a_quiet_spell():
    """Progress: a step is always said; a call within it only once QUIET seconds have passed without a line;
    and while one call runs longer than that, the watch thread (inside `with`) says the step still runs."""
    out = io.StringIO()
    progress = Progress(out)  # not entered: no watch thread
    progress.QUIET = 1.0
    progress("timing 1/1: slow", True)
    progress("timing slow: 1 of 3 calls", False)  # right after a line: silent
    time.sleep(1.1)
    progress("timing slow: 2 of 3 calls", False)
    assert out.getvalue().splitlines() == ["  timing 1/1: slow", "  timing slow: 2 of 3 calls"]
    out = io.StringIO()
    with Progress(out) as progress:
        progress.QUIET = 0.2
        progress("timing 1/1: one long call", True)
        time.sleep(0.7)
    lines = out.getvalue().splitlines()
    assert lines[0] == "  timing 1/1: one long call" and len(lines) >= 2, lines
    assert all(line.startswith("  timing 1/1: one long call: ") and line.endswith(" s so far") for line in lines[1:])
    calls = []
    results = run_benchmark(2, 1, 64, torch.float32, [Mode.GREEDY], 3, progress=lambda text, step: calls.append(step))
    assert calls.count(False) == 4 * len(results["cases"])  # the warm-up and every timed call reported


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
            ["--json", "/no-such-folder/bench.json"],
            "--json /no-such-folder/bench.json: its folder /no-such-folder does",
        ),
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
    assert main(["bench", "-B", "3", "-K", "2", "-V", "700", "--repeats", "2", "--modes", "argmax,tree", "--json"]) == 0
    results = json.loads(capsys.readouterr().out)
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


def test_each_case_is_built_with_its_role_and_the_modes_are_typed():
    """The cases are typed: a Role decides what is measured beyond the time (the floor and softmax are the
    units), a Mode which cases run; no display string is parsed."""
    batch = make_batch(2, 1, 64, torch.float32)
    built, notes = benchmark_cases(batch, set(Mode), "native", lambda text, step: None)
    roles = {case.name: case.role for case in built}
    assert [case.role for case in built[:2]] == [Role.FLOOR, Role.SOFTMAX]
    assert {name for name, role in roles.items() if role is Role.VERIFIER} == set(CASES[2:8])
    assert roles["sort-based baseline"] is Role.PEER
    assert {role for name, role in roles.items() if name.startswith(("tree", "chain"))} == {Role.TREE}
    assert notes["tree_nodes"] == 4
    torch_path = torch_path_cases(batch, {Mode.SAMPLED, Mode.TREE})
    assert [(case.name, case.role) for case in torch_path] == [("sampled, torch reference path", Role.TORCH_PATH)]
    assert {role for role in Role if role.measures_memory} == {Role.VERIFIER, Role.TORCH_PATH}
    assert {role for role in Role if role.meters_traffic} == {Role.VERIFIER}


def test_what_is_measured_of_a_case_follows_its_role_not_its_name(monkeypatch):
    """Renaming the verifier's cases changes the rows' names only: their peak memory is still measured."""
    renamed = {
        mode: tuple((f"case {i} of {mode.value}", validate) for i, (_, validate) in enumerate(named))
        for mode, named in cases.CHAIN_CASES.items()
    }
    monkeypatch.setattr(cases, "CHAIN_CASES", renamed)
    results = run_benchmark(2, 1, 64, torch.float32, [Mode.GREEDY, Mode.SORT], 1)
    assert list(results["cases"]) == [*CASES[:2], "case 0 of greedy", "case 1 of greedy", "sort-based baseline"]
    measured = {name for name, entry in results["cases"].items() if "peak_extra_x_logits" in entry}
    assert measured == {"case 0 of greedy", "case 1 of greedy"}


def _parsed(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["bench", *argv])


def test_the_settings_carry_every_flag_checked_once():
    """bench_settings turns every flag into a typed field (a flag without a field fails here): the run reads
    the settings, never the parsed arguments."""
    args = _parsed("-B", "3", "--modes", "tree,greedy", "--dtype", "bfloat16", "--threads", "2", "--json")
    settings = bench_settings(args)
    assert {field.name for field in dataclasses.fields(BenchSettings)} == set(vars(args)) - {"run", "command"}
    assert (settings.batch, settings.drafts, settings.vocab, settings.repeats, settings.threads) == (3, 4, 128256, 7, 2)
    assert settings.modes == (Mode.TREE, Mode.GREEDY) and settings.dtype is torch.bfloat16
    assert settings.device == torch.device("cpu") and settings.traffic is False and settings.json == "-"


@pytest.mark.parametrize(
    "argv, flag",
    [(["--batch", "0"], "--batch"), (["--modes", "fast"], "--modes"), (["--device", "meta", "--traffic"], "--traffic")],
)
def test_a_bad_flag_is_a_usage_error_naming_it(argv, flag, capsys):
    """The command raises the project's UsageError; the CLI shows it as one line and exits 2."""
    with pytest.raises(UsageError, match=f"^{flag} "):
        bench_settings(_parsed(*argv))
    assert main(["bench", *argv]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith(f"specverify bench: error: {flag} ") and err.count("\n") == 1
