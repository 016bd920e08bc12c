"""The patches that make vLLM's V1 model runner sample and verify with specverify, and the check that they hold.

Patched once per process by `install()`:
- `GPUModelRunner.__init__`: the new runner's `sampler.sample` (every plain step) and
  `rejection_sampler.forward` (every step with drafts) become ours, sharing the runner's request rows;
- `GPUModelRunner._sample`: marks the call as a real step, so the rows are the batch's requests;
- `GPUModelRunner._dummy_sampler_run`: marks vLLM's own warm-up calls of the samplers, which get dummy rows
  (seed 0). A sampler call in neither raises HookError: a call site this plug-in does not know would
  otherwise key every request alike without a word;
- `SamplingParams._validate_spec_decode`: min_p is allowed with speculation, logit_bias still refused;
- `EngineArgs.create_engine_config`: unsupported options (options.py) fail before any engine process starts;
- `EngineCore._initialize_kv_caches`: checks the options again, then asks every worker, once the engine
  is built, whether the hooks are in place (`worker_check`) and logs the one line saying the plug-in is on;
- vLLM's data-parallel handshake: every engine core this process's front end starts or waits for is told
  that the front end runs the plug-in, and refuses to start without it (handshake.py).
Penalties, bad words, allowed-token masks, min-tokens and grammar bitmasks stay vLLM's: they are applied to
the logits exactly where vLLM applies them, and specverify samples from what they leave.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import weakref
from typing import Any

import torch

from ... import kernels, sample, stochastic_acceptance_sampler
from . import handshake, layout, options
from .rows import RequestRows

#: How the line an engine logs when the plug-in is on begins.
PLUGIN_ON = "specverify plug-in on"
#: The attribute holding a runner's (and its samplers') shared state.
STATE = "_specverify_rows"

_installed = False


class HookError(RuntimeError):
    """A patch could not be applied, or a worker runs without it: the engine must not start."""


#: The calls of the samplers the plug-in knows: a real step (`_sample`) and vLLM's warm-up.
STEP, WARM_UP = "GPUModelRunner._sample", "GPUModelRunner._dummy_sampler_run"


class _RunnerRows:
    """One model runner's request rows, shared by its sampler and rejection sampler. `caller`: which known
    call of the samplers is running (STEP, WARM_UP), None outside them."""

    def __init__(self, runner: Any) -> None:
        self._runner = weakref.ref(runner)
        self.rows = RequestRows(getattr(runner.model_config, "seed", 0))
        self.caller: str | None = None
        #: how sampled drafts are judged (SPEC §3.2 or §3.6): vLLM's rejection_sample_method "block" or not
        speculative = getattr(runner, "speculative_config", None)
        block = getattr(speculative, "rejection_sample_method", "standard") == "block"
        self.verification = "block" if block else "token"

    def step(self, batch: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(seeds int64 [batch], min_p float32 [batch] or None) of the current step's requests; dummy rows in
        vLLM's warm-up; HookError for a call from anywhere else."""
        if self.caller == WARM_UP:
            return RequestRows.warmup(batch, device)
        runner = self._runner()
        if self.caller != STEP or runner is None:
            raise HookError(
                f"a sampler was called outside {STEP} and {WARM_UP}, so specverify cannot tell which requests "
                "its rows are and will not key them alike (this vLLM has a call site the plug-in does not know; "
                "turn it off with SPECVERIFY_VLLM=0)"
            )
        request_ids = runner.input_batch.req_ids
        if len(request_ids) < batch:
            raise HookError(f"the step has {batch} sampled rows but the batch only {len(request_ids)} requests")
        return self.rows.step(request_ids[:batch], runner.requests, device)


def _plain_sample(self: Any, logits: torch.Tensor, sampling_metadata: Any, logprobs_mode_override: Any = None):
    """Replaces `Sampler.sample` of a hooked runner: one token per row with `specverify.sample`.

    logits: float32 [B, V] after vLLM's penalties, masks and non-argmax-invariant processors (grammar
    bitmasks already applied by the runner); vLLM's temperature, min-p and top-k/top-p are ours.
    Returns (int64 [B], None): processed logprobs modes are refused at engine start.
    """
    seeds, min_p = getattr(self, STATE).step(logits.shape[0], logits.device)
    temperature, top_k, top_p = layout.sampling_rows(
        sampling_metadata.temperature, sampling_metadata.top_k, sampling_metadata.top_p, logits.shape[-1]
    )
    return sample(logits, temperature, top_k, top_p, seeds, min_p, validate=False), None


def _needs_processing(sampling_metadata: Any) -> bool:
    """Whether vLLM's logits processors may change the target logits of a speculative step."""
    from vllm.v1.sample.logits_processor.builtin import MinTokensLogitsProcessor

    metadata = sampling_metadata
    if not metadata.no_penalties or metadata.bad_words_token_ids or metadata.allowed_token_ids_mask is not None:
        return True
    holder = getattr(metadata, "thinking_budget_state_holder", None)
    if holder is not None and holder.has_tracked_requests():
        return True
    for processor in metadata.logitsprocs.non_argmax_invariant:
        if isinstance(processor, MinTokensLogitsProcessor) and not processor.min_toks:
            continue  # no request with min_tokens in the batch: a no-op
        return True
    return False


def _processed_logits(self: Any, logits: torch.Tensor, metadata: Any, sampling_metadata: Any) -> torch.Tensor:
    """The flat logits [T + B, V] after vLLM's processors, applied as vLLM's rejection sampler applies
    them: the bonus rows as a plain step's (spec tokens counted), then the target rows with the drafts
    before each position. A new float32 tensor; `logits` is left as it was (raw logprobs read it)."""
    bonus = self.sampler.apply_logits_processors(
        logits[metadata.bonus_logits_indices].to(torch.float32), sampling_metadata, predict_bonus_token=True
    )
    target = self.apply_logits_processors(
        logits[metadata.target_logits_indices].to(torch.float32), sampling_metadata, metadata
    )
    processed = torch.empty(logits.shape, dtype=torch.float32, device=logits.device)
    processed[metadata.bonus_logits_indices] = bonus
    processed[metadata.target_logits_indices] = target
    return processed


def verify_step(
    metadata: Any,
    draft_probs: torch.Tensor | None,
    scores: torch.Tensor,
    sampling_metadata: Any,
    seeds: torch.Tensor,
    min_p: torch.Tensor | None,
    verification: str = "token",
) -> torch.Tensor:
    """One step's drafts verified by `specverify.stochastic_acceptance_sampler`, in vLLM's layout.

    metadata: vLLM's SpecDecodeMetadata (flat drafts [T], cu_num_draft_tokens [B], bonus indices [B],
    max_spec_len K); draft_probs: float [T, V], or None (n-gram and greedy drafters: argmax mode); scores:
    the logits [T + B, V] after vLLM's processors; sampling_metadata: its temperature / top_k / top_p;
    seeds: int64 [B] (request_seed(base, tokens generated)); min_p: float [B] or None; verification: how
    sampled drafts are judged, "token" or "block" (argmax drafts: SPEC §3.1 either way).
    Returns vLLM's sampled_token_ids: int32 [B, K + 1], each row's committed tokens then -1.
    """
    positions = metadata.max_spec_len
    cu = metadata.cu_num_draft_tokens
    temperature, top_k, top_p = layout.sampling_rows(
        sampling_metadata.temperature, sampling_metadata.top_k, sampling_metadata.top_p, scores.shape[-1]
    )
    probs = None if draft_probs is None else layout.padded_draft_probs(draft_probs, cu, positions)
    first, recovered, bonus = stochastic_acceptance_sampler(
        layout.padded_drafts(metadata.draft_token_ids, cu, positions),
        layout.padded_logits(scores, metadata.bonus_logits_indices, cu, positions),
        temperature, top_k, None, top_p, None, seeds,
        draft_proposal="argmax" if probs is None else "sampled",
        draft_probs_full=probs,
        min_p=min_p,
        verification="token" if probs is None else verification,
        validate=False,
    )  # fmt: skip
    return layout.vllm_output(first, recovered, bonus)


def _verify(self: Any, metadata: Any, draft_probs: torch.Tensor | None, logits: torch.Tensor, sampling_metadata: Any):
    """Replaces `RejectionSampler.forward` of a hooked runner: `verify_step` on the step's requests.

    logits: [T + B, V] (grammar bitmasks already applied by the runner; processors applied here as vLLM
    applies them). Returns vLLM's SamplerOutput: sampled_token_ids int32 [B, max_spec_len + 1]; logprobs
    of the committed tokens from the raw logits when requested.
    """
    from vllm.v1.outputs import SamplerOutput

    rows = getattr(self, STATE)
    seeds, min_p = rows.step(len(metadata.num_draft_tokens), logits.device)
    scores = (
        _processed_logits(self, logits, metadata, sampling_metadata) if _needs_processing(sampling_metadata) else logits
    )
    tokens = verify_step(metadata, draft_probs, scores, sampling_metadata, seeds, min_p, rows.verification)
    logprobs = None
    if sampling_metadata.max_num_logprobs is not None:
        logprobs = self._get_logprobs_tensors(
            sampling_metadata.max_num_logprobs,
            metadata,
            logits,
            logits[metadata.target_logits_indices].to(torch.float32),
            logits[metadata.bonus_logits_indices].to(torch.float32),
            tokens,
        )
    return SamplerOutput(sampled_token_ids=tokens, logprobs_tensors=logprobs)


def _attach(runner: Any) -> None:
    """Give a freshly built runner's samplers our sample and verify, sharing one _RunnerRows."""
    rows = _RunnerRows(runner)
    setattr(runner, STATE, rows)
    setattr(runner.sampler, STATE, rows)
    runner.sampler.sample = types.MethodType(_plain_sample, runner.sampler)
    rejection = getattr(runner, "rejection_sampler", None)
    if rejection is not None:
        setattr(rejection, STATE, rows)
        rejection.forward = types.MethodType(_verify, rejection)
    if rows.verification == "block":
        _keep_draft_probs(runner)


def _keep_draft_probs(runner: Any) -> None:
    """Make the runner's drafter sample its drafts and keep their distributions under
    rejection_sample_method "block": vLLM's V1 proposer does so only for "standard" (llm_base_proposer.py:258,
    `_enable_probabilistic_draft_probs`), and block verification judges sampled drafts (SPEC §3.6)."""
    drafter = getattr(runner, "drafter", None)
    if not hasattr(drafter, "_enable_probabilistic_draft_probs"):
        raise HookError(
            f"rejection_sample_method='block' needs a drafter that samples its drafts (got {type(drafter).__name__}, "
            "which has no _enable_probabilistic_draft_probs in this vLLM)"
        )
    drafter._enable_probabilistic_draft_probs = True


def _wrap_init(original):
    @functools.wraps(original)
    def __init__(self, *args, **kwargs):
        original(self, *args, **kwargs)
        _attach(self)

    __init__._specverify_original = original
    return __init__


def _wrap_caller(caller: str):
    """A wrap of the runner method named `caller` (STEP or WARM_UP): the samplers' calls inside it are
    marked as coming from it."""

    def wrap(original):
        @functools.wraps(original)
        def marked(self, *args, **kwargs):
            rows = getattr(self, STATE, None)
            if rows is None:
                raise HookError(f"{type(self).__name__} was built without specverify's hooks")
            outer, rows.caller = rows.caller, caller
            try:
                return original(self, *args, **kwargs)
            finally:
                rows.caller = outer

        marked._specverify_original = original
        return marked

    return wrap


def _validate_spec_decode(self: Any, speculative_config: Any) -> None:
    """Replaces `SamplingParams._validate_spec_decode`: min_p works with speculation under specverify;
    logit_bias is still refused, as vLLM refuses it."""
    from vllm.exceptions import VLLMValidationError

    if speculative_config is not None and self.logit_bias:
        raise VLLMValidationError(
            "The logit_bias sampling parameter is not yet supported with speculative decoding.",
            parameter="logit_bias",
            value=self.logit_bias,
        )


def _describe(runner: Any) -> str:
    """The one line an engine logs when the plug-in is on."""
    import vllm

    backend = kernels.backend_for(torch.empty(0, device=runner.device)).name
    where = {"native": "compiled C kernels", "triton": "Triton kernels", "torch": "torch reference"}[backend]
    rule = " (block verification)" if getattr(runner, STATE).verification == "block" else ""
    verifies = (
        f"drafts by specverify.stochastic_acceptance_sampler{rule}, "
        if getattr(runner, "rejection_sampler", None)
        else ""
    )
    return (
        f"{PLUGIN_ON} (vLLM {vllm.__version__}, V1 model runner): {verifies}plain steps by "
        f"specverify.sample; backend {backend} ({where}) on {runner.device}"
    )


def worker_check(worker: Any) -> str:
    """Run on every worker once its engine is built: the runner's hooks are in place, else HookError.
    Returns the line the engine logs (which backend verifies on this worker's device)."""
    from vllm.v1.sample.logits_processor.builtin import MinPLogitsProcessor
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    worker = getattr(worker, "worker", worker)  # the wrapper of a worker, or the worker
    runner = getattr(worker, "model_runner", None)
    name = type(runner).__qualname__
    if not isinstance(runner, GPUModelRunner):
        raise HookError(
            f"specverify's vLLM plug-in hooks the V1 model runner (GPUModelRunner and subclasses); this worker "
            f"runs {name} (Model Runner V2 needs VLLM_USE_V2_MODEL_RUNNER=0)"
        )
    for method in ("_sample", "_dummy_sampler_run"):
        if not hasattr(getattr(type(runner), method), "_specverify_original"):
            raise HookError(
                f"specverify's hook of {name}.{method} is not in place in this worker (was the plug-in loaded?)"
            )
    if getattr(runner, STATE, None) is None or getattr(runner.sampler.sample, "__func__", None) is not _plain_sample:
        raise HookError(f"specverify's hook of {name}.sampler.sample is not in place in this worker")
    rejection = getattr(runner, "rejection_sampler", None)
    if (
        runner.speculative_config is not None
        and getattr(getattr(rejection, "forward", None), "__func__", None) is not _verify
    ):
        raise HookError(f"specverify's hook of {name}.rejection_sampler.forward is not in place in this worker")
    if getattr(runner, STATE).verification == "block" and not runner.drafter._enable_probabilistic_draft_probs:
        raise HookError(f"{name}'s drafter does not keep its draft probabilities, which block verification judges")
    for processor in runner.input_batch.logitsprocs.argmax_invariant:
        if not isinstance(processor, MinPLogitsProcessor):
            raise options.UnsupportedOption(
                "specverify's vLLM plug-in applies temperature, min-p and top-k/top-p itself, so it cannot run "
                f"argmax-invariant logits processors (got {type(processor).__qualname__})"
            )
    return _describe(runner)


def _wrap_initialize_kv_caches(original):
    """EngineCore._initialize_kv_caches: the first EngineCore method that runs after the plug-ins are
    loaded in the engine-core process (its __init__ loads them) and after the workers are built."""

    @functools.wraps(original)
    def _initialize_kv_caches(self, vllm_config, *args, **kwargs):
        options.check_engine_config(vllm_config)
        result = original(self, vllm_config, *args, **kwargs)  # includes vLLM's warm-up of the hooked samplers
        lines = self.model_executor.collective_rpc(worker_check)
        from vllm.logger import init_logger

        init_logger("vllm.specverify").info("%s", lines[0] if lines else PLUGIN_ON)
        return result

    _initialize_kv_caches._specverify_original = original
    return _initialize_kv_caches


def _wrap_create_engine_config(original):
    """EngineArgs.create_engine_config (API server or LLM process): unsupported options fail here, before
    any engine process starts."""

    @functools.wraps(original)
    def create_engine_config(self, *args, **kwargs):
        config = original(self, *args, **kwargs)
        options.check_engine_config(config)
        return config

    create_engine_config._specverify_original = original
    return create_engine_config


def _patch(owner: type, name: str, wrap) -> None:
    """owner.name = wrap(owner.name), once; HookError naming what vLLM lacks."""
    original = owner.__dict__.get(name)
    if original is None:
        raise HookError(
            f"specverify's vLLM plug-in cannot patch {owner.__module__}.{owner.__qualname__}.{name}: not found"
        )
    if hasattr(original, "_specverify_original"):
        return
    setattr(owner, name, wrap(original))


def install() -> None:
    """Apply every patch of this module in this process (idempotent). HookError when one cannot be applied."""
    global _installed
    if _installed:
        return
    try:
        from vllm.engine.arg_utils import EngineArgs
        from vllm.sampling_params import SamplingParams
        from vllm.v1.engine import utils as engine_utils
        from vllm.v1.engine.core import EngineCore
        from vllm.v1.sample.rejection_sampler import RejectionSampler
        from vllm.v1.sample.sampler import Sampler
        from vllm.v1.worker.gpu_model_runner import GPUModelRunner
    except ImportError as err:
        raise HookError(f"specverify's vLLM plug-in cannot import what it patches: {err}") from err
    for owner, name in ((Sampler, "sample"), (RejectionSampler, "forward"), (RejectionSampler, "_get_logprobs_tensors"),
                        (RejectionSampler, "apply_logits_processors"), (Sampler, "apply_logits_processors")):  # fmt: skip
        if not callable(getattr(owner, name, None)):
            raise HookError(f"specverify's vLLM plug-in needs {owner.__qualname__}.{name}, which this vLLM lacks")
    _patch(GPUModelRunner, "__init__", _wrap_init)
    _patch(GPUModelRunner, "_sample", _wrap_caller(STEP))
    _patch(GPUModelRunner, "_dummy_sampler_run", _wrap_caller(WARM_UP))
    _patch(EngineCore, "_initialize_kv_caches", _wrap_initialize_kv_caches)
    _patch(EngineArgs, "create_engine_config", _wrap_create_engine_config)
    if "_validate_spec_decode" not in SamplingParams.__dict__:
        raise HookError("specverify's vLLM plug-in cannot patch SamplingParams._validate_spec_decode: not found")
    SamplingParams._validate_spec_decode = _validate_spec_decode
    if not dataclasses.is_dataclass(getattr(engine_utils, "EngineHandshakeMetadata", None)):
        raise HookError(
            "specverify's vLLM plug-in needs vllm.v1.engine.utils.EngineHandshakeMetadata, which this vLLM lacks"
        )
    handshake.mark_front_end(engine_utils)
    _installed = True
