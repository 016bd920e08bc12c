"""Fixtures of the command-line tests: the tiny JSON model folder that the grammar and requests tests run
`specverify generate` on (test_decoding_cli.py has a `model_folder` of its own, with a word-level tokenizer)."""

from __future__ import annotations

import pytest

from tests.support.tiny_json import tiny_llama, tiny_tokenizer


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny-json-model")
    tiny_tokenizer().save_pretrained(folder)
    tiny_llama(0).model.save_pretrained(folder)
    return folder
