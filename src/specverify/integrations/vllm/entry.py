"""The `vllm.general_plugins` entry point: opt-in by SPECVERIFY_VLLM=1, and the vLLM versions we support.

vLLM calls `register()` once in each of its processes (API server or LLM, engine core, workers). Without
SPECVERIFY_VLLM=1 it only guards the engine core: one whose data-parallel front end runs the plug-in fails its
start (handshake.py); any other vLLM that did not ask for the plug-in runs unchanged.
"""

from __future__ import annotations

import os
import re

#: The environment variable that turns the plug-in on ("1") or leaves it off ("0", empty or unset).
ENVIRONMENT = "SPECVERIFY_VLLM"
#: The vLLM releases whose internals the hooks were written against and tested on.
SUPPORTED_RANGE = ">=0.32.0,<0.33"
_SUPPORTED_SERIES = (0, 32)


class UnsupportedVersion(RuntimeError):
    """The installed vLLM is outside SUPPORTED_RANGE."""


def enabled() -> bool:
    """Whether SPECVERIFY_VLLM asks for the plug-in; ValueError naming the variable for another value."""
    value = os.environ.get(ENVIRONMENT, "").strip()
    if value not in ("", "0", "1"):
        raise ValueError(f"{ENVIRONMENT} must be 1 (on) or 0 (off) (got {value!r})")
    return value == "1"


def check_version(version: str) -> None:
    """UnsupportedVersion unless vLLM `version` (e.g. "0.32.0", "0.32.1.dev3+cpu") is in SUPPORTED_RANGE."""
    match = re.match(r"(\d+)\.(\d+)(?:\.\d+)*(?:(?:rc|\.dev|\.post|a|b)\d*)*(?:\+[\w.]+)?$", version.strip())
    if match is None or (int(match[1]), int(match[2])) != _SUPPORTED_SERIES:
        raise UnsupportedVersion(
            f"specverify's vLLM plug-in supports vLLM {SUPPORTED_RANGE} (got vLLM {version}); "
            f"install a supported vLLM or unset {ENVIRONMENT}"
        )


def register() -> None:
    """The entry point: guard this process's engine core against a front end with the plug-in (always); when
    SPECVERIFY_VLLM=1, check vLLM's version and install the hooks. Raises (failing the engine start) on an
    unsupported version or a patch that cannot be applied."""
    from . import handshake

    handshake.guard_engine_core()
    if not enabled():
        return
    import vllm

    check_version(vllm.__version__)
    from . import hooks

    hooks.install()


def enable() -> None:
    """Turn the plug-in on from Python, before building an engine: sets SPECVERIFY_VLLM=1 (inherited by
    the engine's processes, which load the plug-in through the entry point) and installs it here."""
    os.environ[ENVIRONMENT] = "1"
    register()
