"""Data-parallel engine cores started by another command: one without the plug-in refuses a front end that has it.

vLLM's front end sends each data-parallel engine core it waits for (its own, and `--headless` ones started
on other nodes) an init message, `EngineHandshakeMetadata`, whose `parallel_config` entries the engine core
sets on its own ParallelConfig (vllm/v1/engine/utils.py:1478, vllm/v1/engine/core.py:1386). A front end with
the plug-in adds one entry, MARK. The engine core loads its plug-ins after that exchange (EngineCore.__init__,
core.py:129), so the entry point, which vLLM runs in every process where specverify is installed, installs
`guard_engine_core` whatever SPECVERIFY_VLLM says: an engine core that got MARK but runs without the plug-in
fails its start with EngineCoreWithoutPlugin, naming the fix, before it loads the model, instead of serving
stock vLLM behind a front end that accepted min-p. Where specverify is not installed at all, nothing of ours runs and the mark is ignored.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

#: The ParallelConfig attribute a front end with the plug-in sets on every engine core it hands an init message.
MARK = "specverify_front_end"
#: Whether this process runs the plug-in (set by mark_front_end, which hooks.install calls).
_plugin_here = False


class EngineCoreWithoutPlugin(RuntimeError):
    """An engine core without the plug-in was asked to serve a front end that runs it."""


def mark_front_end(engine_utils: Any) -> None:
    """Make every init message this process's front end sends carry MARK (this process runs the plug-in).
    engine_utils: the module vllm.v1.engine.utils, whose wait_for_engine_startup builds the message."""
    global _plugin_here
    if not getattr(engine_utils.EngineHandshakeMetadata, "_specverify_marks", False):
        engine_utils.EngineHandshakeMetadata = _marked(engine_utils.EngineHandshakeMetadata)
    _plugin_here = True


def _marked(metadata: type) -> type:
    """A subclass of vLLM's EngineHandshakeMetadata whose parallel_config entries include MARK; encoded as the
    original (same fields), so a stock engine core reads it as before."""

    @dataclasses.dataclass
    class Marked(metadata):
        _specverify_marks = True

        def __post_init__(self) -> None:
            self.parallel_config = {**self.parallel_config, MARK: 1}

    Marked.__name__ = Marked.__qualname__ = metadata.__name__
    return Marked


def check_engine_core(parallel_config: Any) -> None:
    """EngineCoreWithoutPlugin if this engine core's front end runs the plug-in (MARK set by its init message)
    and this process does not."""
    if getattr(parallel_config, MARK, None) is None or _plugin_here:
        return
    rank = getattr(parallel_config, "data_parallel_index", "?")  # the global rank (core.py:1472)
    raise EngineCoreWithoutPlugin(
        f"this data-parallel engine core (rank {rank}) runs without specverify's vLLM plug-in, but its front end "
        "runs it and accepts requests stock vLLM refuses or samples differently (min-p with speculation); it will "
        "not serve them stock: set SPECVERIFY_VLLM=1 in this engine core's environment (on its node) and start it "
        "again"
    )


def guard_engine_core() -> None:
    """Wrap vLLM's Executor.__init__, which EngineCore.__init__ calls right after loading the plug-ins and before
    the model loads (core.py:129-144), with check_engine_core. Does nothing where vLLM lacks it: this runs with
    the plug-in off too, and must not break a vLLM that did not ask for the plug-in."""
    try:
        from vllm.v1.executor.abstract import Executor
    except ImportError:
        return
    original = Executor.__dict__.get("__init__")
    if original is None or hasattr(original, "_specverify_guarded"):
        return

    @functools.wraps(original)
    def __init__(self, vllm_config, *args, **kwargs):
        check_engine_core(vllm_config.parallel_config)
        original(self, vllm_config, *args, **kwargs)

    __init__._specverify_guarded = original
    Executor.__init__ = __init__
