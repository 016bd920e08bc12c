"""The one-time warm-up: the compiled kernels are built before the first timed step, once per process."""

from __future__ import annotations

import os
import subprocess
import sys

import torch

from specverify.decoding import plain_generate
from specverify.decoding.loop.warmup import _warmed, warm_up
from tests.support.models import MarkovModel
from tests.support.paths import SRC


def test_fresh_cache_builds_the_kernels_inside_the_warm_up(tmp_path):
    """With an empty kernel cache, warm_up builds and loads the kernels (where a compiler exists), takes
    measurable time once, and nothing the second time."""
    script = (
        "from specverify.decoding.loop.warmup import warm_up; from specverify.kernels import native; "
        "first = warm_up(1000); second = warm_up(1000); "
        "print(first, second, native.load.cache_info().currsize, native.load() is not None)"
    )
    env = {**os.environ, "SPECVERIFY_CACHE": str(tmp_path), "PYTHONPATH": str(SRC)}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
    first, second, loaded, native = out.stdout.split()
    assert float(first) > 0 and float(second) == 0.0
    assert loaded == "1"  # the kernels were loaded (or found unavailable) by the warm-up, not later
    if native == "True":
        assert list(tmp_path.glob("kernels-*.so")), "the warm-up did not build the kernels into the empty cache"


def test_the_loop_warms_up_before_timing_once_per_vocabulary():
    model = MarkovModel(torch.randn(40, 40, generator=torch.Generator().manual_seed(3)))
    _warmed.discard((model.vocab_size, "cpu"))
    first = plain_generate(model, [[1, 2, 3]], max_tokens=4)
    second = plain_generate(model, [[1, 2, 3]], max_tokens=4)
    assert first.warmup_seconds > 0 and second.warmup_seconds == 0.0
    assert first.tokens == second.tokens
    assert warm_up(model.vocab_size) == 0.0
