"""The device check's vllm section: the plug-in end to end where vLLM is installed
(`integrations.vllm.check`), and its line of the report."""

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


def print_vllm(section: dict, out=None) -> None:
    """The section's line (and one per differing request) for a person."""
    out = out or sys.stdout
    if "skipped" in section:
        print(f"  vllm        SKIP  {section['skipped']}", file=out)
        return
    if "requests" not in section:  # the engine failed: the failure is printed with the others
        print("  vllm        FAIL  the engine did not run", file=out)
        return
    requests = section["requests"]
    same = sum(request["identical"] for request in requests)
    print(
        f"  vllm        {'PASS' if section['passed'] else 'FAIL'}  {same} of {len(requests)} seeded requests identical "
        f"with n-gram speculation (k={section['speculative']['num_speculative_tokens']}) on and off, "
        f"{section['max_tokens']} tokens each, {section['dtype']}; {section['plug_in']}",
        file=out,
    )
    for request in requests:
        if not request["identical"]:
            print(
                f"    {request['params']}: differs from token {request['first_difference']} (on a GPU, logits that "
                "change with the batch shape can do this with no sampler at fault)",
                file=out,
            )
