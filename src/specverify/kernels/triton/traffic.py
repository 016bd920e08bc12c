"""The traffic meter: the bytes each Triton kernel launch loads and stores, counted under Triton's interpreter,
and the torch ops a call runs beside them.

Inside `metered()`, every interpreted launch (CPU tensors, TRITON_INTERPRET=1) is recorded with the bytes
its loads and stores move where their mask is on, per pointer argument of the kernel (an address is
charged to the argument whose storage holds it, the first one where several share a storage; a tensor in
an argument group, a NamedTuple, is named `group.field`, as `logits.data`); an atomic
counts as a load and a store of its word. Every torch op run outside a launch is recorded by name: on a
GPU each is a launch of its own unless it is a view or an uninitialised allocation (`TorchOps.launches`).
`Traffic.passes(logits)` is the bytes loaded over the bytes of the logits: how many times a call reads
them, which is what a memory-bound verifier pays on a GPU.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode

#: Torch ops that launch nothing on a GPU: views, metadata and uninitialised allocations.
FREE_OPS = frozenset(
    {
        "empty",
        "empty_like",
        "empty_strided",
        "view",
        "_unsafe_view",
        "reshape",
        "expand",
        "as_strided",
        "alias",
        "detach",
        "t",
        "unsqueeze",
        "squeeze",
        "select",
        "slice",
        "lift_fresh",
    }
)


@dataclass
class Launch:
    """One kernel launch: its name and the bytes loaded and stored through each pointer argument."""

    kernel: str
    loaded: Counter = field(default_factory=Counter)
    stored: Counter = field(default_factory=Counter)


@dataclass
class Traffic:
    """What the calls inside one `metered()` block did: kernel launches in order, torch ops by name."""

    launches: list[Launch] = field(default_factory=list)
    torch_ops: list[str] = field(default_factory=list)

    def loaded(self, kernel: str | None = None, argument: str | None = None) -> int:
        """Bytes loaded, by every launch or those of one kernel, through every argument or one."""
        return _total(self.launches, "loaded", kernel, argument)

    def stored(self, kernel: str | None = None, argument: str | None = None) -> int:
        """Bytes stored, as `loaded`."""
        return _total(self.launches, "stored", kernel, argument)

    def passes(self, logits: torch.Tensor, kernel: str | None = None, argument: str | None = None) -> float:
        """Bytes loaded (as `loaded`) over the bytes of `logits`."""
        return self.loaded(kernel, argument) / (logits.numel() * logits.element_size())

    def per_kernel(self) -> dict[str, dict]:
        """{kernel: {"launches", "loaded", "stored", "loaded_by_argument"}}, kernels in order of first launch."""
        kernels: dict[str, dict] = {}
        for launch in self.launches:
            entry = kernels.setdefault(
                launch.kernel, {"launches": 0, "loaded": 0, "stored": 0, "loaded_by_argument": Counter()}
            )
            entry["launches"] += 1
            entry["loaded"] += sum(launch.loaded.values())
            entry["stored"] += sum(launch.stored.values())
            entry["loaded_by_argument"].update(launch.loaded)
        for entry in kernels.values():
            entry["loaded_by_argument"] = dict(entry["loaded_by_argument"])
        return kernels

    def gpu_launches(self) -> list[str]:
        """What a GPU would launch, in order: each torch op that is not free, and each Triton kernel ("triton:name")."""
        return [name for name in self.torch_ops if name not in FREE_OPS]


def _total(launches: list[Launch], direction: str, kernel: str | None, argument: str | None) -> int:
    return sum(
        count
        for launch in launches
        if kernel is None or launch.kernel == kernel
        for name, count in getattr(launch, direction).items()
        if argument is None or name == argument
    )


class _Ops(TorchDispatchMode):
    """Records the torch ops run outside a kernel launch (the interpreter's own copies are not the call's)."""

    def __init__(self, traffic: Traffic, inside: list) -> None:
        super().__init__()
        self.traffic, self.inside = traffic, inside

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not self.inside:
            self.traffic.torch_ops.append(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


def _tensors(arguments: dict) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) for each tensor argument in order, those in a group (a NamedTuple) named group.field."""
    for name, value in arguments.items():
        if isinstance(value, torch.Tensor):
            yield name, value
        elif isinstance(value, tuple) and hasattr(value, "_fields"):
            yield from _tensors({f"{name}.{field}": item for field, item in zip(value._fields, value)})


@contextlib.contextmanager
def metered() -> Iterator[Traffic]:
    """Count the traffic of every interpreted Triton launch (and the torch ops) inside the block. Raises
    RuntimeError where Triton's interpreter is not what runs the kernels (TRITON_INTERPRET=1 unset)."""
    import triton
    from triton.runtime import interpreter

    if not triton.knobs.runtime.interpret:
        raise RuntimeError(
            "the traffic meter counts interpreted launches: set TRITON_INTERPRET=1 before importing triton"
        )
    traffic = Traffic()
    inside: list[tuple[Launch, np.ndarray, list[str]]] = []
    builder = interpreter.interpreter_builder
    executor = interpreter.GridExecutor
    original_call = executor.__call__
    original_load, original_store = builder.create_masked_load, builder.create_masked_store
    original_atomic = builder.create_atomic_rmw

    def charge(direction: str, pointers, mask) -> None:
        if not inside:
            return
        launch, starts, names = inside[-1]
        addresses = pointers.data[np.broadcast_to(mask.data, pointers.data.shape)].astype(np.uint64)
        if not addresses.size:
            return
        size = pointers.get_element_ty().primitive_bitwidth // 8
        owner = np.searchsorted(starts, addresses, side="right") - 1
        counts = getattr(launch, direction)
        for index, number in zip(*np.unique(owner, return_counts=True)):
            counts[names[index] if index >= 0 else "?"] += int(number) * size

    def call(self, *args, **kwargs):
        bound = {**dict(zip(self.arg_names, args)), **kwargs}
        storages: dict[int, str] = {}
        for name, value in _tensors(bound):  # the first argument on each storage is charged for it
            storages.setdefault(value.untyped_storage().data_ptr(), name)
        starts = np.array(sorted(storages), dtype=np.uint64)
        launch = Launch(self.fn.__name__)
        traffic.launches.append(launch)
        traffic.torch_ops.append(f"triton:{launch.kernel}")
        inside.append((launch, starts, [storages[int(start)] for start in starts]))
        try:
            return original_call(self, *args, **kwargs)
        finally:
            inside.pop()

    def load(pointers, mask, other, *rest):
        charge("loaded", pointers, mask)
        return original_load(pointers, mask, other, *rest)

    def store(pointers, value, mask, *rest):
        charge("stored", pointers, mask)
        return original_store(pointers, value, mask, *rest)

    def atomic(operation, pointers, value, mask, *rest):
        charge("loaded", pointers, mask)
        charge("stored", pointers, mask)
        return original_atomic(operation, pointers, value, mask, *rest)

    executor.__call__ = call
    builder.create_masked_load, builder.create_masked_store, builder.create_atomic_rmw = load, store, atomic
    try:
        with _Ops(traffic, inside):
            yield traffic
    finally:
        executor.__call__ = original_call
        del builder.create_masked_load, builder.create_masked_store, builder.create_atomic_rmw
