"""Compiled CPU kernels (kernels.c), built with the system C compiler on first use.

The shared library is cached under $SPECVERIFY_CACHE (default ~/.cache/specverify) by a hash of the
source, compiler flags and OpenMP runtime, so the build (about a second) happens once per machine. Where
no compiler is found or the build fails, `load()` warns once (naming the cause and the fix) and returns
None, and the dispatch (kernels/) runs the torch reference instead; SPECVERIFY_BACKEND=torch (or the older
SPECVERIFY_NATIVE=0) skips the build and the warning. The kernels take contiguous CPU rows (float32,
bfloat16 or float16 where they read inputs; float32 weights).

Threads: where torch runs on GNU OpenMP (Linux wheels), the kernels are built with OpenMP and linked to
the very runtime torch loaded, so a call spreads its rows over torch's own thread team; that team's
threads spin for a while after every parallel torch op, and work handed to them starts at once, where
threads of our own would have to share the cores with them (a 40% slowdown measured right after a
torch reduction). Elsewhere a batch is split into `torch.get_num_threads()` slices run by a Python
thread pool (ctypes releases the GIL during the call).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from ...contract import MASK64, ROW_STRIDE, cache_root
from ..backend import Backend
from . import arguments
from .arguments import row_address

SOURCE = Path(__file__).with_name("kernels.c")
FLAGS = ["-O3", "-fPIC", "-std=c99", "-fno-trapping-math", "-ffp-contract=fast", "-Wno-psabi"]
#: Rows per slice below which splitting a batch between threads costs more than it saves.
MIN_ROWS_PER_THREAD = 4


def torch_openmp_runtime() -> Path | None:
    """The GNU OpenMP runtime this process has loaded for torch (Linux), or None."""
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "/libgomp" in line}
    except OSError:
        return None
    return Path(min(paths)) if len(paths) == 1 else None


class BuildError(Exception):
    """Why the kernels could not be built or loaded, in words a user can act on."""


def _build(target: Path, openmp: Path | None) -> None:
    """Compile kernels.c into target: with OpenMP linked to the given runtime, or without OpenMP.
    Raises BuildError naming the cause."""
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise BuildError("no C compiler found (neither $CC, cc nor gcc)")
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
        built, objects = Path(scratch) / target.name, Path(scratch) / "kernels.o"
        steps = [[compiler, *FLAGS, *(["-fopenmp"] if openmp else []), "-c", str(SOURCE), "-o", str(objects)]]
        runtime = [str(openmp), f"-Wl,-rpath,{openmp.parent}"] if openmp else []
        steps.append([compiler, "-shared", str(objects), *runtime, "-o", str(built), "-lm"])
        for step in steps:
            try:
                done = subprocess.run(step, capture_output=True, text=True)
            except OSError as error:
                raise BuildError(f"the C compiler {compiler!r} could not be run ({error})") from error
            if done.returncode != 0:
                message = (done.stderr or done.stdout).strip().splitlines()
                raise BuildError(
                    f"{Path(compiler).name} failed (exit {done.returncode}): {message[0] if message else 'no message'}"
                )
        os.replace(built, target)  # atomic: concurrent builders never see a half-written library


def _open(openmp: Path | None) -> ctypes.CDLL:
    """The kernels built for this OpenMP runtime (or none), built first if not cached. Raises BuildError."""
    key = SOURCE.read_bytes() + " ".join(FLAGS).encode() + str(openmp).encode()
    target = cache_root() / f"kernels-{hashlib.sha256(key).hexdigest()[:16]}.so"
    try:
        if not target.exists():
            _build(target, openmp)
            _remove_old_builds(target)
        else:
            os.utime(target)  # its last use, which keeps it among the builds kept
        return ctypes.CDLL(str(target))
    except OSError as error:
        raise BuildError(f"the built library could not be loaded ({error})") from error


#: Builds of other sources, flags or OpenMP runtimes kept in the cache (the most recently used): a few
#: versions side by side (other clones, venvs) rebuild nothing; the rest do not pile up.
KEPT_BUILDS = 4


def _remove_old_builds(kept: Path) -> None:
    """Remove all but the KEPT_BUILDS most recently used kernels-*.so beside `kept` (always kept). A library
    another process has loaded stays valid after its file is removed (Linux keeps the open inode)."""

    def last_used(path: Path) -> float:
        try:
            return path.stat().st_mtime
        except OSError:  # removed by another process meanwhile
            return 0.0

    builds = sorted(kept.parent.glob("kernels-*.so"), key=last_used, reverse=True)
    for old in [p for p in builds if p != kept][KEPT_BUILDS - 1 :]:
        old.unlink(missing_ok=True)


#: Why the kernels are unavailable in this process (None: available, or not tried yet).
unavailable_because: str | None = None


@functools.cache
def load() -> ctypes.CDLL | None:
    """The compiled kernels, or None where they cannot be built (callers fall back to torch). A failure is
    reported once per process by a warning naming the cause and the fix."""
    global unavailable_because
    if os.environ.get("SPECVERIFY_NATIVE", "1") == "0":
        unavailable_because = "SPECVERIFY_NATIVE=0"
        return None
    openmp = torch_openmp_runtime()
    library = None
    if openmp:
        try:
            library = _open(openmp)
        except BuildError:
            pass  # try again without OpenMP
    threaded = library is not None
    if library is None:
        try:
            library = _open(None)
        except BuildError as error:
            unavailable_because = str(error)
            warnings.warn(
                f"specverify: the compiled CPU kernels are unavailable: {error}. The CPU runs the torch "
                "reference path instead (correct, but many times slower). Fix: install a C compiler (e.g. "
                "gcc) or set CC; or set SPECVERIFY_BACKEND=torch to choose that path and silence this warning.",
                RuntimeWarning,
                stacklevel=2,
            )
            return None
    library.specverify_threads_itself = threaded
    _declare(library)
    return library


def _declare(library: ctypes.CDLL) -> None:
    """Declare each entry point's one argument (a pointer to its struct) and its result (0, or the bytes of
    an allocation it could not make); RuntimeError where kernels.c's structs and arguments.py's differ (a
    field added on one side only)."""
    sizes = (ctypes.c_int64 * len(arguments.STRUCTS))()
    library.specverify_struct_sizes(sizes)
    differ = [s.__name__ for s, size in zip(arguments.STRUCTS, sizes) if ctypes.sizeof(s) != size]
    if differ:
        raise RuntimeError(
            f"specverify: the argument structs of kernels.c and arguments.py differ in size: {', '.join(differ)}"
        )
    for name, struct in arguments.ENTRY_POINTS.items():
        kernel = getattr(library, name)
        kernel.argtypes, kernel.restype = [ctypes.POINTER(struct)], ctypes.c_int64
    library.specverify_refuse_allocations_above.argtypes = [ctypes.c_uint64]


def _run(kernel, name: str, struct: ctypes.Structure) -> None:
    """One call of an entry point on its argument struct; MemoryError where it could not allocate."""
    refused = kernel(ctypes.byref(struct))
    if refused:
        raise MemoryError(f"specverify: the C kernel {name} could not allocate {refused} bytes")


@functools.cache
def _pool(workers: int) -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=workers, thread_name_prefix="specverify")


def _split_rows(rows: int, run) -> None:
    """Call run(start, stop) on slices of the rows, in parallel over torch's thread count (once over all
    rows where the kernels spread their rows over OpenMP threads themselves)."""
    slices = 1  # (few rows, or OpenMP threads: torch's thread count is not asked, a cost at small batches)
    if rows >= 2 * MIN_ROWS_PER_THREAD and not load().specverify_threads_itself:
        slices = max(1, min(torch.get_num_threads(), rows // MIN_ROWS_PER_THREAD))
    if slices == 1:
        run(0, rows)
        return
    bounds = [rows * s // slices for s in range(slices + 1)]
    for future in [_pool(slices).submit(run, a, b) for a, b in zip(bounds, bounds[1:])]:
        future.result()


#: Element types the kernels read directly (codes of kernels.c); others are converted to float32 first.
DTYPES = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}


def _as(values: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """values in `dtype`, contiguous (values itself where it already is: no op dispatched)."""
    return values if values.dtype == dtype and values.is_contiguous() else values.to(dtype).contiguous()


def _readable(values: torch.Tensor) -> tuple[torch.Tensor, int]:
    """values, contiguous and in a dtype the kernels read, with that dtype's code."""
    if values.dtype not in DTYPES:
        values = values.to(torch.float32)
    return values if values.is_contiguous() else values.contiguous(), DTYPES[values.dtype]


def weigh_rows(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    greedy_below: float,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    min_p: torch.Tensor | None,
    rtol: float,
    block: int,
    out: torch.Tensor,
    source: torch.Tensor | None = None,
) -> torch.Tensor:
    """interface.weigh_rows in C, one row a call of kernels.c's weigh_rows (logits of any of DTYPES read
    as they are; a skipped row costs next to nothing)."""
    rows, vocab = out.shape
    logits, dtype = _readable(logits)
    temperature, top_k, top_p = _as(temperature, torch.float32), _as(top_k, torch.int64), _as(top_p, torch.float32)
    min_p = None if min_p is None else _as(min_p, torch.float32)
    source = None if source is None else _as(source, torch.int64)
    blocks = -(-vocab // block)
    sums = torch.empty(rows, blocks, dtype=torch.float64)
    logits_per_row = 0 if source is not None else vocab  # (rows picked by source: all of them from row 0)
    kernel = load().weigh_rows

    def run(start: int, stop: int) -> None:
        struct = arguments.WeighArgs(
            logits=row_address(logits, start, logits_per_row),
            source=row_address(source, start, 1),
            temperature=row_address(temperature, start, 1),
            top_k=row_address(top_k, start, 1),
            top_p=row_address(top_p, start, 1),
            min_p=row_address(min_p, start, 1),
            weights=row_address(out, start, vocab),
            block_sums=row_address(sums, start, blocks),
            dtype=dtype,
            rows=stop - start,
            n=vocab,
            block=block,
            rtol=rtol,
            greedy_below=greedy_below,
        )
        _run(kernel, "weigh_rows", struct)

    _split_rows(rows, run)
    return sums


def argmax_rows(values: torch.Tensor) -> torch.Tensor:
    """interface.argmax_rows in C."""
    values, dtype = _readable(values)
    rows, vocab = values.shape
    out = torch.empty(rows, dtype=torch.int64)
    kernel = load().argmax_rows

    def run(start: int, stop: int) -> None:
        struct = arguments.ArgmaxArgs(
            values=row_address(values, start, vocab),
            out=row_address(out, start, 1),
            dtype=dtype,
            rows=stop - start,
            n=vocab,
        )
        _run(kernel, "argmax_rows", struct)

    _split_rows(rows, run)
    return out


def scan_rows(values: torch.Tensor, in_use: torch.Tensor | None = None) -> torch.Tensor:
    """interface.scan_rows in C, on the bit patterns (rows not in use not read)."""
    values, dtype = _readable(values)
    rows, vocab = values.shape
    in_use = None if in_use is None else in_use.to(torch.uint8).contiguous()
    out = torch.empty(rows, dtype=torch.uint8)
    kernel = load().scan_rows

    def run(start: int, stop: int) -> None:
        struct = arguments.ScanArgs(
            values=row_address(values, start, vocab),
            in_use=row_address(in_use, start, 1),
            flags=row_address(out, start, 1),
            dtype=dtype,
            rows=stop - start,
            n=vocab,
        )
        _run(kernel, "scan_rows", struct)

    _split_rows(rows, run)
    return out


def sample_rows(weights: torch.Tensor, sums: torch.Tensor, block: int, uniforms: torch.Tensor) -> torch.Tensor:
    """interface.sample_rows in C."""
    rows, vocab = weights.shape
    sums, uniforms = _as(sums, torch.float64), _as(uniforms, torch.float64)
    blocks = sums.shape[1]
    out = torch.empty(rows, dtype=torch.int64)
    kernel = load().sample_rows

    def run(start: int, stop: int) -> None:
        struct = arguments.SampleArgs(
            weights=row_address(weights, start, vocab),
            block_sums=row_address(sums, start, blocks),
            uniforms=row_address(uniforms, start, 1),
            out=row_address(out, start, 1),
            rows=stop - start,
            n=vocab,
            block=block,
        )
        _run(kernel, "sample_rows", struct)

    _split_rows(rows, run)
    return out


#: The most tokens a row's kept set may hold to reach the recovery draw sparsely (draw_rows); a larger one
#: is handed over as a dense row of weights.
KEPT_CAPACITY = 1024


def _set_keys(keys: arguments.RequestKeys, seeds: int | torch.Tensor, shared: bool, start: int) -> None:
    """Fill kernels.c's request_keys (`keys`, a field of an entry point's struct: filled in place, where a
    struct built apart and copied in costs twice as much) for the requests from `start` on: seeds int64 [B],
    one per request, or (shared) one seed for the batch, an int or int64 [] or [1] (request b: s + b * ROW_STRIDE,
    mod 2**64)."""
    if not shared:
        keys.seeds, keys.seeds_step = row_address(seeds, start, 1), 1
        return
    offset = start * ROW_STRIDE
    if isinstance(seeds, int):
        keys.offset, keys.row_stride = (seeds + offset) & MASK64, ROW_STRIDE
        return
    keys.seeds, keys.offset, keys.row_stride = seeds.data_ptr(), offset & MASK64, ROW_STRIDE


def _readable_params(params: tuple) -> tuple:
    """(temperature, greedy_below, top_k, top_p, min_p, rtol) with the per-request tensors [B] contiguous
    in the dtypes kernels.c reads (float32, int64, float32, float32 or None)."""
    temperature, greedy_below, top_k, top_p, min_p, rtol = params
    temperature, top_k, top_p = _as(temperature, torch.float32), _as(top_k, torch.int64), _as(top_p, torch.float32)
    return temperature, greedy_below, top_k, top_p, None if min_p is None else _as(min_p, torch.float32), rtol


def _readable_seed(seed: int | torch.Tensor) -> int | torch.Tensor:
    """An int seed as it is, a tensor one contiguous int64."""
    return _as(seed, torch.int64) if isinstance(seed, torch.Tensor) else seed


def _set_chain_rows(
    rows: arguments.ChainRows,
    logits: torch.Tensor,
    dtype: int,
    per_position: int,
    params: tuple,
    block: int,
    start: int,
    stop: int,
) -> None:
    """Fill kernels.c's chain_rows (`rows`, a field of an entry point's struct, in place as _set_keys) for
    requests [start, stop): their logits rows [.., V] (per_position a request) of dtype code `dtype`, the
    readable params (_readable_params) and the block."""
    vocab = logits.shape[-1]
    temperature, greedy_below, top_k, top_p, min_p, rtol = params
    rows.logits = row_address(logits, start, per_position * vocab)
    rows.temperature = row_address(temperature, start, 1)
    rows.top_k = row_address(top_k, start, 1)
    rows.top_p = row_address(top_p, start, 1)
    if min_p is not None:
        rows.min_p = row_address(min_p, start, 1)
    rows.dtype, rows.requests, rows.per_position, rows.n = dtype, stop - start, per_position, vocab
    rows.block, rows.rtol, rows.greedy_below = block, rtol, greedy_below


def _set_kept_rows(into: arguments.KeptRows, kept: tuple | None, blocks: int, vocab: int, row: int) -> None:
    """Fill kernels.c's kept_rows (`into`, a field of an entry point's struct, in place as _set_keys) from
    row `row` on: kept (count, ids, weights, dense, block sums), or None (only the capacity)."""
    into.capacity = KEPT_CAPACITY
    if kept is None:
        return
    count, ids, weights, dense, sums = kept
    into.count = row_address(count, row, 1)
    into.ids = row_address(ids, row, KEPT_CAPACITY)
    into.weights = row_address(weights, row, KEPT_CAPACITY)
    into.dense = row_address(dense, row, vocab)
    into.block_sums = row_address(sums, row, blocks)


def _draw(
    logits: torch.Tensor,
    per_position: int,
    params: tuple,
    block: int,
    keys: tuple[int | torch.Tensor, bool, int],
    tokens: torch.Tensor,
    bonus: torch.Tensor | None = None,
    verdicts: tuple[torch.Tensor, torch.Tensor] | None = None,
    draft: torch.Tensor | None = None,
    accept_salt: int = 0,
    dense: torch.Tensor | None = None,
) -> tuple | None:
    """kernels.c's draw_rows over logits [R, V] or [B, per_position, V] (R = B * per_position). params:
    (temperature, greedy_below, top_k, top_p, min_p, rtol), per request [B] where tensors; keys: (seeds,
    shared, salt) as _set_keys takes them and the stream's salt; tokens: contiguous int64, written with the
    draws: R of them, or with bonus (contiguous int64 [B], the last position's draws) [B, per_position - 1];
    verdicts: (the drafts as given, int [B, per_position - 1]; first, contiguous int64 [B], written with
    the argmax-mode verdicts), or draft, accept_salt and dense for sampled mode (draw_rows) -> the sampled
    mode's outputs, or None."""
    vocab = logits.shape[-1]
    requests, drafted = logits.numel() // vocab // per_position, per_position - 1
    rows, stride = requests * per_position, per_position if bonus is None else drafted
    logits, dtype = _readable(logits)
    params = _readable_params(params)
    seeds, shared, salt = keys
    seeds = _readable_seed(seeds)
    proposed, first = (None, None) if verdicts is None else (_as(verdicts[0], torch.int64), verdicts[1])
    at_draft = accept = sums = kept = None  # (only the tokens, unless asked for)
    blocks = -(-vocab // block)
    if draft is not None:
        draft = _as(draft, torch.int64)
        at_draft = torch.empty(requests, drafted, dtype=torch.float32)
        accept = torch.empty(requests, drafted, dtype=torch.float64)
        sums = torch.empty(rows, blocks, dtype=torch.float64)
        count = torch.empty(rows, dtype=torch.int64)
        ids = torch.empty(rows, KEPT_CAPACITY, dtype=torch.int32)
        weights = torch.empty(rows, KEPT_CAPACITY, dtype=torch.float32)
        kept = (count, ids, weights, dense, sums)
    kernel = load().draw_rows

    def run(a: int, b: int) -> None:
        struct = arguments.DrawArgs(salt=salt, tokens=row_address(tokens, a, stride))
        if bonus is not None:  # (fields left NULL are not set: each set costs about 0.1 us)
            struct.bonus = row_address(bonus, a, 1)
        if proposed is not None:
            struct.proposed, struct.first = row_address(proposed, a, drafted), row_address(first, a, 1)
        if draft is not None:
            struct.draft, struct.accept_salt = row_address(draft, a, drafted), accept_salt
            struct.at_draft, struct.accept_uniforms = row_address(at_draft, a, drafted), row_address(accept, a, drafted)
        _set_chain_rows(struct.rows, logits, dtype, per_position, params, block, a, b)
        _set_keys(struct.keys, seeds, shared, a)
        _set_kept_rows(struct.kept, kept, blocks, vocab, a * per_position)
        _run(kernel, "draw_rows", struct)

    _split_rows(requests, run)
    return None if draft is None else (at_draft, accept, sums, kept[:4])


def draw_rows(
    logits: torch.Tensor,
    per_position: int,
    temperature: torch.Tensor,
    greedy_below: float,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    min_p: torch.Tensor | None,
    rtol: float,
    block: int,
    seeds: torch.Tensor,
    salt: int,
    draft: torch.Tensor | None = None,
    accept_salt: int = 0,
    dense: torch.Tensor | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, tuple]:
    """The keyed target draw of every row (kernels.c's draw_rows): row b * per_position + j of logits [R, V]
    (R = B * per_position) weighed with request b's params [B] and drawn with the uniform of key
    seeds[b] + j (seeds int64 [B]) and `salt`, its weights not written out -> int64 [R].
    With draft (int64 [B, per_position - 1], -1 where none), accept_salt and dense (contiguous float32
    [R, V], rows written only where a kept set is too large to hand over sparsely), for sampled mode:
    (tokens [R], the weight of each draft token float32 [B, per_position - 1], the uniforms of key
    seeds[b] + j and accept_salt float64 [B, per_position - 1], the block sums float64 [R, ceil(V / block)],
    the kept weights for recover_kept_rows)."""
    params = (temperature, greedy_below, top_k, top_p, min_p, rtol)
    tokens = torch.empty(logits.shape[0], dtype=torch.int64)
    sampled = _draw(
        logits, per_position, params, block, (seeds, False, salt), tokens, None, None, draft, accept_salt, dense
    )
    return tokens if sampled is None else (tokens, *sampled)


def _verdict_outputs(requests: int, drafted: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A chain call's outputs, for the kernel to write: first int64 [B], recovered int64 [B, K], bonus int64
    [B, 1], three tensors (one torch op each: views of one tensor would cost one op more)."""
    int64 = torch.int64
    return (
        torch.empty(requests, dtype=int64),
        torch.empty(requests, drafted, dtype=int64),
        torch.empty(requests, 1, dtype=int64),
    )


def draw_verdicts(
    logits: torch.Tensor,
    draft_tokens: torch.Tensor,
    temperature: torch.Tensor,
    greedy_below: float,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    min_p: torch.Tensor | None,
    rtol: float,
    block: int,
    seed: int | torch.Tensor,
    shared: bool,
    salt: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The argmax-mode verdicts of a chain call in one kernel call (kernels.c's draw_rows with proposed):
    the keyed target draw y of every row of logits [B, K + 1, V] as draw_rows makes it, request b
    accepting its drafts while they equal y. draft_tokens: int [B, K] as given (an id outside [0, V) and
    everything after it is padding); seed: int64 [B] per request, or (shared) an int or int64 [] or [1] for the
    batch -> (first rejected index int64 [B], recovered int64 [B, K] (y at every drafted position), bonus
    int64 [B, 1]): the outputs argmax_verdict and greedy_verdict give, each its own tensor."""
    requests, drafted = draft_tokens.shape
    params = (temperature, greedy_below, top_k, top_p, min_p, rtol)
    first, recovered, bonus = _verdict_outputs(requests, drafted)
    _draw(logits, drafted + 1, params, block, (seed, shared, salt), recovered, bonus, (draft_tokens, first))
    return first, recovered, bonus


def draw_sampled_verdicts(
    logits: torch.Tensor,
    draft_tokens: torch.Tensor,
    temperature: torch.Tensor,
    greedy_below: float,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    min_p: torch.Tensor | None,
    rtol: float,
    block: int,
    seed: int | torch.Tensor,
    shared: bool,
    salts: tuple[int, int, int],
    draft_probs: torch.Tensor,
    dense: torch.Tensor,
    by_block: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The sampled-mode verdicts of a chain call in one kernel call (kernels.c's draw_sampled_verdicts):
    draw_rows' draws and kept weights of logits [B, K + 1, V], the ratio test of each draft as given
    (int [B, K]: an id outside [0, V) and everything after it is padding) against draft_probs float [B, K, V],
    and recover_kept_rows' recovery; with by_block, block verification (SPEC §3.6, draw_block_verdicts) on
    the same draws instead. seed as in draw_verdicts; salts: the streams' (target, accept, residual); dense:
    float32 [B, K + 1, V] of room, contiguous -> (first rejected index int64 [B], recovered int64 [B, K],
    bonus int64 [B, 1])."""
    requests, drafted = draft_tokens.shape
    per_position, vocab = drafted + 1, logits.shape[-1]
    logits, dtype = _readable(logits)
    draft_probs, draft_dtype = _readable(draft_probs)
    params = _readable_params((temperature, greedy_below, top_k, top_p, min_p, rtol))
    seed = _readable_seed(seed)
    proposed = _as(draft_tokens, torch.int64)
    first, recovered, bonus = _verdict_outputs(requests, drafted)
    name = "draw_block_verdicts" if by_block else "draw_sampled_verdicts"
    kernel = getattr(load(), name)

    def run(a: int, b: int) -> None:
        struct = arguments.SampledVerdictArgs(
            salt=salts[0],
            accept_salt=salts[1],
            residual_salt=salts[2],
            proposed=row_address(proposed, a, drafted),
            draft_probs=row_address(draft_probs, a, drafted * vocab),
            dense=row_address(dense, a, per_position * vocab),
            bonus=row_address(bonus, a, 1),
            recovered=row_address(recovered, a, drafted),
            first=row_address(first, a, 1),
            draft_dtype=draft_dtype,
            capacity=KEPT_CAPACITY,
        )
        _set_chain_rows(struct.rows, logits, dtype, per_position, params, block, a, b)
        _set_keys(struct.keys, seed, shared, a)
        _run(kernel, name, struct)

    _split_rows(requests, run)
    return first, recovered, bonus


def recover_kept_rows(
    kept: tuple,
    weight_sums: torch.Tensor,
    mass: torch.Tensor,
    draft_probs: torch.Tensor,
    draft: torch.Tensor,
    mode: torch.Tensor,
    seeds: torch.Tensor,
    salt: int,
    block: int,
) -> torch.Tensor:
    """recover_rows on what draw_rows kept for the recovery (`kept`, and its block sums float64
    [B * (K + 1), blocks]), the uniform of position j of request b keyed by seeds[b] + j (int64 [B]) and
    `salt`. mass: float64 [B, K]; draft_probs: float [B, K, V]; draft: int64 [B, K]; mode: int [B, K]
    -> int64 [B, K]."""
    requests, positions, vocab = draft_probs.shape
    blocks = weight_sums.shape[-1]
    draft_probs, draft_dtype = _readable(draft_probs)
    mass, seeds = _as(mass, torch.float64), _as(seeds, torch.int64)
    draft, mode = _as(draft, torch.int64), _as(mode, torch.int32)
    out = torch.empty(requests, positions, dtype=torch.int64)
    kernel = load().recover_kept_rows

    def run(a: int, b: int) -> None:
        struct = arguments.RecoverKeptArgs(
            salt=salt,
            mass=row_address(mass, a, positions),
            draft_probs=row_address(draft_probs, a, positions * vocab),
            draft=row_address(draft, a, positions),
            mode=row_address(mode, a, positions),
            out=row_address(out, a, positions),
            draft_dtype=draft_dtype,
            requests=b - a,
            positions=positions,
            n=vocab,
            block=block,
        )
        _set_kept_rows(struct.kept, (*kept, weight_sums), blocks, vocab, a * (positions + 1))
        _set_keys(struct.keys, seeds, False, a)
        _run(kernel, "recover_kept_rows", struct)

    _split_rows(requests, run)
    return out


def recover_rows(
    weights: torch.Tensor,
    weight_sums: torch.Tensor,
    mass: torch.Tensor,
    draft_probs: torch.Tensor,
    draft: torch.Tensor,
    mode: torch.Tensor,
    uniforms: torch.Tensor,
    block: int,
) -> torch.Tensor:
    """interface.recover_rows in C, the residual never materialised."""
    requests, positions, vocab = draft_probs.shape
    weight_positions, blocks = weights.shape[1], weight_sums.shape[-1]
    weights, weight_sums = weights.contiguous(), weight_sums.contiguous()
    draft_probs, draft_dtype = _readable(draft_probs)
    mass, uniforms = _as(mass, torch.float64), _as(uniforms, torch.float64)
    draft, mode = _as(draft, torch.int64), _as(mode, torch.int32)
    out = torch.empty(requests, positions, dtype=torch.int64)
    kernel = load().recover_rows

    def run(a: int, b: int) -> None:
        struct = arguments.RecoverArgs(
            weights=row_address(weights, a, weight_positions * vocab),
            weight_sums=row_address(weight_sums, a, weight_positions * blocks),
            mass=row_address(mass, a, positions),
            draft_probs=row_address(draft_probs, a, positions * vocab),
            draft=row_address(draft, a, positions),
            mode=row_address(mode, a, positions),
            uniforms=row_address(uniforms, a, positions),
            out=row_address(out, a, positions),
            draft_dtype=draft_dtype,
            requests=b - a,
            positions=positions,
            weight_positions=weight_positions,
            n=vocab,
            block=block,
        )
        _run(kernel, "recover_rows", struct)

    _split_rows(requests, run)
    return out


def relaxed_rows(logits: torch.Tensor, draft: torch.Tensor, k: int, delta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """interface.relaxed_rows in C, without materialising the softmax."""
    requests, positions = draft.shape
    logit_positions, vocab = logits.shape[1], logits.shape[2]
    logits, dtype = _readable(logits)
    draft = _as(draft, torch.int64)
    accepted = torch.zeros(requests, positions, dtype=torch.uint8)
    top1 = torch.zeros(requests, positions, dtype=torch.int64)
    kernel = load().relaxed_rows

    def run(a: int, b: int) -> None:
        struct = arguments.RelaxedArgs(
            logits=row_address(logits, a, logit_positions * vocab),
            draft=row_address(draft, a, positions),
            accepted=row_address(accepted, a, positions),
            top1=row_address(top1, a, positions),
            dtype=dtype,
            requests=b - a,
            positions=positions,
            logit_positions=logit_positions,
            n=vocab,
            k=k,
            delta=delta,
        )
        _run(kernel, "relaxed_rows", struct)

    _split_rows(requests, run)
    return accepted.bool(), top1


from .chain import verify_chain as verify_chain  # noqa: E402 (the whole-call ops, built on the ops above)
from .chain import verify_tree as verify_tree  # noqa: E402

BACKEND = Backend(name="native", ops=sys.modules[__name__])
