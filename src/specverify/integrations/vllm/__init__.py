"""specverify inside vLLM: a `vllm.general_plugins` plug-in, on with SPECVERIFY_VLLM=1, that makes vLLM's
V1 model runner verify every draft with `stochastic_acceptance_sampler` and sample every plain step with
`sample`, keyed per request (docs/vllm.md).

Modules: entry (the entry point, opt-in, version gate), options (engine options checked at start),
layout (vLLM's flat metadata onto our padded [B, K] contract and back), rows (per-request seeds and
min-p), hooks (the patches and the worker check), handshake (data-parallel engine cores refuse a front end
with the plug-in when they run without it). Importing this package does not import vLLM.
"""

from .entry import (
    ENVIRONMENT,
    SUPPORTED_RANGE,
    UnsupportedVersion,
    check_version,
    enable,
    enabled,
    register,
)

__all__ = ["ENVIRONMENT", "SUPPORTED_RANGE", "UnsupportedVersion", "check_version", "enable", "enabled", "register"]
