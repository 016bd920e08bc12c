"""Where a check's computation runs: a device and its backend (Target), and specverify's calls made
there, their results brought back to the CPU."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator

import torch

import specverify as sv

from .. import kernels


@dataclasses.dataclass(frozen=True)
class Target:
    """A device, and the backend that runs there: None for the device's default (CPU: the compiled C
    kernels; CUDA: Triton), or "torch", "native", "triton" (SPECVERIFY_BACKEND). native=False is the older
    spelling of backend="torch"."""

    device: str
    native: bool = True
    perturb_ulps: int = 0  # test hook: nudge float32 logits by this many ulps to emulate other rounding
    backend: str | None = None

    @property
    def forced_backend(self) -> str | None:
        return self.backend or (None if self.native else "torch")

    def __str__(self) -> str:
        text = self.device
        if self.forced_backend:
            text += " (torch path)" if self.forced_backend == "torch" else f" ({self.forced_backend})"
        return text + (f" (+-{self.perturb_ulps} ulp)" if self.perturb_ulps else "")


@contextlib.contextmanager
def running_on(target: Target) -> Iterator[None]:
    """Inside the block, specverify runs on the target's backend (SPECVERIFY_BACKEND), when it names one."""
    with kernels.forced(target.forced_backend):
        yield


def to_target(value, target: Target, perturb: bool = False):
    """A tensor moved to the target's device (float32 nudged by its perturb_ulps when `perturb`); anything
    else as it is."""
    if not isinstance(value, torch.Tensor):
        return value
    if perturb and target.perturb_ulps and value.dtype == torch.float32:
        value = perturb_ulps(value, target.perturb_ulps, seed=1234)
    return value.to(target.device)


def perturb_ulps(x: torch.Tensor, ulps: int, seed: int) -> torch.Tensor:
    """x (float32, any shape) with every finite entry moved by `ulps` float32 ulps up or down at random."""
    g = torch.Generator().manual_seed(seed)
    away = torch.rand(x.shape, generator=g) < 0.5  # away from zero, or towards it
    moved = (x.contiguous().view(torch.int32) + torch.where(away, ulps, -ulps).to(torch.int32)).view(torch.float32)
    keep = torch.isfinite(moved) & torch.isfinite(x) & (x != 0) & (torch.signbit(moved) == torch.signbit(x))
    return torch.where(keep, moved, x)


def run_verifier(args: dict, target: Target):
    """stochastic_acceptance_sampler(**args) on the target -> its three outputs on the CPU."""
    moved = {name: to_target(value, target, perturb=name == "target_logits") for name, value in args.items()}
    with running_on(target):
        out = sv.stochastic_acceptance_sampler(**moved)
    if target.device.startswith("cuda"):
        torch.cuda.synchronize()
    return tuple(t.cpu() for t in out)


def run_truncated_probs(logits2d, temperature, top_k, top_p, min_p, bitmask, target: Target) -> torch.Tensor:
    """truncated_probs on the target: logits2d [N, V], the parameters [N] (or None) -> float32 [N, V] on the CPU."""
    with running_on(target):
        probs = sv.truncated_probs(
            to_target(logits2d, target, perturb=True),
            to_target(temperature, target),
            to_target(top_k, target),
            to_target(top_p, target),
            to_target(min_p, target),
            to_target(bitmask, target),
        )
    return probs.cpu()
