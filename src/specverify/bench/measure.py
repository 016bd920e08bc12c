"""The benchmark's measurement, shared by `specverify bench` and the device check's timing section: every case
timed in one process on the same logits, so the ratios hold even on a noisy machine.

Each case reports min and median over repeats, as a ratio to one `amax` pass over the logits (the physical
read floor) and to one `torch.softmax`. On a GPU each call is timed between two synchronisations and peak
memory comes from torch.cuda's allocator statistics. With traffic (CPU), each verifier case also gets its
passes: the bytes its Triton kernels load over the bytes of the logits, counted under Triton's interpreter
(kernels/triton/traffic.py).
"""

from __future__ import annotations

import contextlib
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable, Collection, Iterator

import torch

from .. import kernels
from ..kernels import native
from .cases import Case, Mode, Role, benchmark_cases
from .inputs import make_batch

#: The default device of the timed calls.
CPU = torch.device("cpu")
#: progress(text, step): what the benchmark is doing, for a person (see `run_benchmark`).
Say = Callable[[str, bool], None]


def time_case(
    run: Callable[[], object], repeats: int, device: torch.device = CPU, on_call: Callable[[int], None] | None = None
) -> list[float]:
    """Wall-clock seconds of each of `repeats` calls, after one warm-up call (on a GPU: from a synchronised
    start to the synchronised end of the call's work); on_call(i) after the i-th timed call, and on_call(0)
    after the warm-up (progress)."""
    synchronize = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    run()
    if on_call is not None:
        on_call(0)
    times = []
    for i in range(repeats):
        synchronize()
        start = time.perf_counter()
        run()
        synchronize()
        times.append(time.perf_counter() - start)
        if on_call is not None:
            on_call(i + 1)
    return times


@contextlib.contextmanager
def _quiet_stderr() -> Iterator[None]:
    """Send what C++ code writes to file descriptor 2 to /dev/null inside the block."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as sink:
            os.dup2(sink.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def peak_extra_bytes(run: Callable[[], object], device: torch.device = CPU) -> int:
    """Peak bytes allocated during one call beyond what was allocated before it (CPU: via the profiler;
    CUDA: the caching allocator's statistics).

    The call runs on a fresh thread, so per-thread scratch buffers that later calls reuse are counted."""
    if device.type == "cuda":
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        worker = threading.Thread(target=run)
        worker.start()
        worker.join()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated(device) - before

    def profiled() -> None:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
            run()
        result.append(prof)

    result: list = []
    worker = threading.Thread(target=profiled)
    with _quiet_stderr():  # the profiler's C++ side logs its start and stop there
        worker.start()
        worker.join()
    prof = result[0]
    # an op's memory includes what the ops it calls allocate: count each allocation once, at its own op
    events = sorted((e for e in prof.events() if e.self_cpu_memory_usage != 0), key=lambda e: e.time_range.start)
    level = peak = 0
    for event in events:
        level += event.self_cpu_memory_usage
        peak = max(peak, level)
    return peak


def loaded_backend(logits: torch.Tensor) -> dict:
    """Which backend runs the verifier on these logits (kernels/), and how long loading it took in this
    process (the C build or the Triton import included when not done yet: the stall a first call would see)
    -> {"backend", "kernels" (what it is, for a person), "kernels_load_s"}."""
    start = time.perf_counter()
    backend = kernels.backend_for(logits).name
    seconds = time.perf_counter() - start
    if backend == "native":
        threads = "OpenMP on torch's runtime" if native.load().specverify_threads_itself else "a Python thread pool"
        text = f"native (compiled C kernels, rows spread by {threads})"
    elif backend == "triton":
        text = "triton (Triton kernels" + (", interpreted)" if logits.device.type == "cpu" else ")")
    else:
        why = f": {native.unavailable_because}" if logits.device.type == "cpu" and native.unavailable_because else ""
        text = f"torch (the torch reference ops{why})"
    return {"backend": backend, "kernels": text, "kernels_load_s": seconds}


def metered_passes(run: Callable[[], object], logits: torch.Tensor) -> float:
    """Bytes the Triton kernels of one call load over the bytes of the logits, counted under Triton's
    interpreter (kernels/triton/traffic.py); the logits must be on the CPU."""
    from ..kernels.triton.traffic import metered

    with kernels.forced("triton"), metered() as traffic:
        run()
    return traffic.passes(logits)


def _calls_said(say: Say, name: str, repeats: int) -> Callable[[int], None]:
    """on_call for `time_case`: says how many of the case's calls are done (a step's inner line)."""
    return lambda calls: say(f"timing {name}: " + (f"{calls} of {repeats} calls" if calls else "warmed up"), False)


def _timed(cases: list[Case], repeats: int, device: torch.device, say: Say) -> list[list[float]]:
    """Each case's seconds per timed call, in the cases' order."""
    times = []
    for i, case in enumerate(cases):
        say(f"timing {i + 1}/{len(cases)}: {case.name}", True)
        times.append(time_case(case.run, repeats, device, _calls_said(say, case.name, repeats)))
    return times


def _median_of(role: Role, cases: list[Case], times: list[list[float]]) -> float:
    """The median seconds of the case of `role` (the floor or softmax: one each)."""
    return next(statistics.median(seconds) for case, seconds in zip(cases, times) if case.role is role)


def _config(
    batch_size: int, positions: int, vocab: int, dtype: torch.dtype, repeats: int, device: torch.device
) -> dict:
    """What was timed, where and with what: the first entries of the results' "config"."""
    return {
        "B": batch_size,
        "K": positions,
        "V": vocab,
        "dtype": str(dtype).replace("torch.", ""),
        "repeats": repeats,
        "threads": torch.get_num_threads(),
        "load_average": os.getloadavg()[0],
        "device": str(device),
        "torch": torch.__version__,
    }


def run_benchmark(
    batch_size: int,
    positions: int,
    vocab: int,
    dtype: torch.dtype,
    modes: Collection[Mode],
    repeats: int,
    device: torch.device = CPU,
    traffic: bool = False,
    progress: Say | None = None,
) -> dict:
    """Time every case of the modes asked side by side -> {"config": {...}, "cases": {name: {"min_ms",
    "median_ms", "x_read_floor", "x_softmax", and for the verifier's chain cases "peak_extra_x_logits" and,
    metered, "passes"}}} (the JSON of `specverify bench`). traffic: also meter each verifier case once on the
    Triton backend under its interpreter (CPU only). progress(text, step): what the benchmark is doing, for a
    person: step=True as each step starts (a case timed, measured or metered), False after each call within
    it (`report.Progress` shows those only after a quiet spell)."""
    say = progress or (lambda text, step: None)
    say("making the logits", True)
    batch = make_batch(batch_size, positions, vocab, dtype).to(device)
    logits = batch.target_logits
    say("loading the kernels (the first run of a machine builds them)", True)
    backend = loaded_backend(logits)
    if traffic:  # loaded before anything imports triton (torch's profiler does): it sets TRITON_INTERPRET first
        with kernels.forced("triton"):
            kernels.backend_for(logits)
    cases, notes = benchmark_cases(batch, modes, backend["backend"], say)
    times = _timed(cases, repeats, device, say)
    units = _median_of(Role.FLOOR, cases, times), _median_of(Role.SOFTMAX, cases, times)
    config = _config(batch_size, positions, vocab, dtype, repeats, device)
    device_name = {"device_name": torch.cuda.get_device_name(device)} if device.type == "cuda" else {}
    results = {"config": {**config, **backend, **device_name, **notes}, "cases": {}}
    for case, seconds in zip(cases, times):
        results["cases"][case.name] = _entry(case, seconds, units, logits, traffic, say)
    return results


def _entry(
    case: Case, seconds: list[float], units: tuple[float, float], logits: torch.Tensor, traffic: bool, say: Say
) -> dict:
    """One case's results: its times, as ratios to the (floor, softmax) medians `units`, and what its role
    measures beyond them (peak memory; passes where traffic is metered)."""
    median = statistics.median(seconds)
    entry = {
        "min_ms": min(seconds) * 1e3,
        "median_ms": median * 1e3,
        "x_read_floor": median / units[0],
        "x_softmax": median / units[1],
    }
    if case.role.measures_memory:
        say(f"peak memory of {case.name}", True)
        logits_bytes = logits.numel() * logits.element_size()
        entry["peak_extra_x_logits"] = peak_extra_bytes(case.run, logits.device) / logits_bytes
    if traffic and case.role.meters_traffic:
        say(f"passes over the logits of {case.name}, under Triton's interpreter", True)
        entry["passes"] = metered_passes(case.run, logits)
    return entry
