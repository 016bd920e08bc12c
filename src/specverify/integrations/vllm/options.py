"""Which vLLM engine options the plug-in supports, checked when an engine starts (before the model loads).

Each unsupported option fails the start with one message naming the option, its value and what to do.
"""

from __future__ import annotations

from typing import Any


class UnsupportedOption(ValueError):
    """An engine option the specverify plug-in cannot keep its guarantee under."""


PROCESSED_LOGPROBS_MODES = ("processed_logits", "processed_logprobs")


def check_engine_config(vllm_config: Any) -> None:
    """Raise UnsupportedOption for the first option of vllm_config (a vllm.config.VllmConfig) we do not support.

    - Model Runner V2 (its sampler and rejection sampler are other classes, not hooked yet);
    - logprobs_mode processed_logits / processed_logprobs (we do not build vLLM's processed logits);
    - rejection_sample_method "synthetic" (a benchmarking mode that ignores the target), and "block" without
      sampled drafts (check_rejection_method);
    - async scheduling with speculative decoding (the runner then counts a request's tokens
      optimistically, so "tokens generated so far", which keys every draw, is not known on the host);
    - Ray workers or Ray data-parallel engine cores (check_parallel_backends).
    """
    if getattr(vllm_config, "use_v2_model_runner", False):
        raise UnsupportedOption(
            "specverify's vLLM plug-in hooks the V1 model runner; Model Runner V2 is not supported yet "
            "(got use_v2_model_runner=True): set VLLM_USE_V2_MODEL_RUNNER=0"
        )
    check_parallel_backends(getattr(vllm_config, "parallel_config", None))
    model_config = getattr(vllm_config, "model_config", None)
    mode = getattr(model_config, "logprobs_mode", "raw_logprobs")
    if mode in PROCESSED_LOGPROBS_MODES:
        raise UnsupportedOption(
            f"specverify's vLLM plug-in returns raw logprobs only: logprobs_mode must be raw_logprobs or "
            f"raw_logits (got logprobs_mode={mode!r})"
        )
    speculative = getattr(vllm_config, "speculative_config", None)
    if speculative is None:
        return
    check_rejection_method(speculative)
    scheduler = getattr(vllm_config, "scheduler_config", None)
    if getattr(scheduler, "async_scheduling", False):
        raise UnsupportedOption(
            "specverify's vLLM plug-in keys each draw by the tokens a request has generated, which async "
            f"scheduling with speculative decoding (method {getattr(speculative, 'method', None)!r}) does not "
            "know on the host: async_scheduling must be off with speculation (got async_scheduling=True): "
            "pass --no-async-scheduling (LLM(..., async_scheduling=False))"
        )


#: vLLM's rejection_sample_method values the plug-in verifies with: "standard" (SPEC §3.1 for n-gram and
#: greedy drafts, §3.2 for probabilistic ones) and "block" (§3.6, probabilistic drafts only).
REJECTION_METHODS = ("standard", "block")


def check_rejection_method(speculative: Any) -> None:
    """rejection_sample_method is one we verify with, and "block" comes with sampled drafts (a draft model or
    head with draft_sample_method="probabilistic"): block verification judges drafts drawn from q, and
    argmax drafts are already verified optimally by SPEC §3.1. speculative: vLLM's SpeculativeConfig."""
    method = getattr(speculative, "rejection_sample_method", "standard")
    if method not in REJECTION_METHODS:
        raise UnsupportedOption(
            "specverify's vLLM plug-in verifies drafts against the target: rejection_sample_method must be "
            f"'standard' or 'block' (got rejection_sample_method={method!r})"
        )
    sampling = getattr(speculative, "draft_sample_method", "greedy")
    if method == "block" and sampling != "probabilistic":
        raise UnsupportedOption(
            "rejection_sample_method='block' judges sampled drafts (SPEC §3.6): it needs a draft model or head "
            f"with draft_sample_method='probabilistic' (got method={getattr(speculative, 'method', None)!r}, "
            f"draft_sample_method={sampling!r}); n-gram and greedy drafts are verified by specverify's argmax "
            "rule, already the best any lossless rule does for them: use 'standard'"
        )


def check_parallel_backends(parallel_config: Any) -> None:
    """Refuse Ray as the executor or the data-parallel backend: vLLM starts Ray's processes with only the
    variables it forwards (VLLM_*, NCCL_*, HF_*, ...), so SPECVERIFY_VLLM=1 never reaches them and they would
    run stock vLLM behind a front end that accepted min-p with speculation. parallel_config: vLLM's
    ParallelConfig (or None)."""
    executor = getattr(parallel_config, "distributed_executor_backend", None)
    data_parallel = getattr(parallel_config, "data_parallel_backend", "mp")
    if executor == "ray" or data_parallel == "ray":
        raise UnsupportedOption(
            "specverify's vLLM plug-in is switched on by SPECVERIFY_VLLM=1, which vLLM does not pass to Ray's "
            f"processes (got distributed_executor_backend={executor!r}, data_parallel_backend={data_parallel!r}): "
            "use the mp backends (--distributed-executor-backend mp, --data-parallel-backend mp)"
        )
