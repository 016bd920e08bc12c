"""The device check's vllm section: the plug-in end to end where vLLM is installed
(`integrations.vllm.check`), and its lines of the report."""

from __future__ import annotations

import sys


def vllm_section(model: str | None, stock: bool = False) -> dict:
    """integrations.vllm.check.vllm_check on `model` (None: the embedded model's cached folder; stock: on
    stock vLLM, the self-test); an engine that fails to start or run is a failed section carrying the
    engine's message."""
    from ..integrations.vllm.check import vllm_check

    try:
        return vllm_check(model, plugin=not stock)
    except RuntimeError as error:
        return {"passed": False, "failures": [str(error)]}


def vllm_summary(section: dict) -> str:
    """The section's summary line for a person (after its verdict word)."""
    if "skipped" in section:
        return f"SKIP  {section['skipped']}"
    if "requests" not in section:  # the engine failed: the failure is printed with the others
        return "FAIL  the engine did not run"
    requests = section["requests"]
    same = sum(request["identical"] for request in requests)
    return (
        f"{'PASS' if section['passed'] else 'FAIL'}  {same} of {len(requests)} seeded requests identical with "
        f"n-gram speculation (k={section['speculative']['num_speculative_tokens']}) on and off, "
        f"{section['max_tokens']} tokens each, {section['dtype']}; {section['plug_in']}"
    )


def print_vllm_details(section: dict, out=None) -> None:
    """A line per request whose text differs with speculation on and off (none when all are identical)."""
    out = out or sys.stdout
    for request in section.get("requests", []):
        if not request["identical"]:
            print(
                f"vllm: {request['params']}: differs from token {request['first_difference']} (on a GPU, logits that "
                "change with the batch shape can do this with no sampler at fault)",
                file=out,
            )
