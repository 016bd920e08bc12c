"""Compile every Triton kernel of specverify for real GPU targets, without a GPU (run as a script, in a
process where TRITON_INTERPRET is not set: the interpreter's kernels cannot be compiled).

    python tests/support/compile_triton.py 90 80                     # every variant (verify_flags), for these capabilities
    python tests/support/compile_triton.py 90 80 --representative    # each kernel once, every code path switched on
    python tests/support/compile_triton.py 90 --rest                 # every variant but the representative ones

Each kernel is compiled (to PTX and a cubin) from an `ASTSource` for `GPUTarget("cuda", cap, 32)` with
the argument types and constexpr values the launchers use (kernels/triton/__init__.py), for every input
dtype and flag combination, so code that the interpreter accepts but the compiler rejects fails here.
The compiles run in one process per core the script may use (at most 4). Exit status 0 when all compiled,
1 otherwise (the first error printed).
"""

from __future__ import annotations

import itertools
import multiprocessing
import os
import sys
import time

os.environ.pop("TRITON_INTERPRET", None)

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from specverify.kernels.triton import groups, jit, launch_shape, verify_shape

FLOATS = {"fp32": "*fp32", "bf16": "*bf16", "fp16": "*fp16"}
CUDA = torch.device("cuda")


def _shape(rows: int, vocab: int, block: int | None = None, search: bool = True) -> dict:
    shape = launch_shape(rows, vocab, CUDA, block)
    shape.pop("num_warps")
    if not search:
        shape.pop("SEARCH")
    return shape


#: The flags of verify_kernel's token-wise variants, in verify_flags' order: a grammar mask (int32 Logits.words),
#: HAS_MIN_P, SHARED_SEED, HAS_RELAXED, SAMPLED (relaxed rows and sampled drafts never meet in one call).
VERIFY_FLAGS = [flags for flags in itertools.product((False, True), repeat=5) if not (flags[3] and flags[4])]


def pairwise_cover(combinations: list[tuple[bool, ...]], start: list[tuple[bool, ...]]) -> list[tuple[bool, ...]]:
    """`start`, then a few more of the combinations, in which every two flags take every pair of values that
    some combination gives them (a covering array of strength 2, completed greedily): the interactions of
    two code paths that a compiler can reject, at a fraction of the full product's compile time."""

    def pairs(flags):
        return {(i, j, flags[i], flags[j]) for i, j in itertools.combinations(range(len(flags)), 2)}

    needed, chosen = set().union(*map(pairs, combinations)).difference(*map(pairs, start)), list(start)
    while needed:
        best = max(combinations, key=lambda flags: len(needed & pairs(flags)))
        chosen.append(best)
        needed -= pairs(best)
    return chosen


def verify_flags(dtype: str) -> list[tuple[bool, ...]]:
    """The flag combinations of verify_kernel compiled for logits of `dtype`, each with BLOCK_VERIFICATION
    last: float32 a pairwise cover of every token-wise combination from REPRESENTATIVE's two (one variant
    compiles in about 20 s: the full product of 24 would take most of an hour on two cores) and block
    verification masked with min-p and a seed tensor, and unmasked with an int seed; 16-bit logits masked
    with min-p in relaxed rows and in sampled drafts, token-wise and as blocks (the paths that read them)
    with a seed tensor."""
    if dtype == "fp32":
        start = [(True, True, True, True, False), (False, True, True, False, True)]
        token = [(*flags, False) for flags in pairwise_cover(VERIFY_FLAGS, start=start)]
        return token + [(True, True, False, False, True, True), (False, False, True, False, True, True)]
    masked = (True, True, False)  # a grammar mask, min-p, a seed tensor
    return [(*masked, True, False, False), (*masked, False, True, False), (*masked, False, True, True)]


def variants():
    """(name, kernel, signature, constexprs) for every variant the launchers can make, the whole-call kernel's
    flags as verify_flags chooses them."""
    big, small = _shape(160, 128256, 1024), _shape(4096, 12, 12)
    whole = {
        label: {name: verify_shape(rows, vocab, CUDA)[name] for name in ("TILES", "CANDIDATES", "SPAN")}
        for label, rows, vocab in (("V=128256", 160, 128256), ("V=12", 4096, 12))
    }
    # block verification: K = 4, SPAN 8 lanes per request (32 requests at V = 128256, 1024 at V = 12)
    blocks = {
        label: {name: value for name, value in verify_shape(lanes, vocab, CUDA, 8).items() if name != "num_warps"}
        for label, lanes, vocab in (("V=128256", 256, 128256), ("V=12", 8192, 12))
    }
    for dtype, (label, shape) in itertools.product(FLOATS, [("V=128256", big), ("V=12", small)]):
        for min_p in (False, True):
            signature = {
                "x_ptr": FLOATS[dtype],
                "t_ptr": "*fp32",
                "k_ptr": "*i64",
                "p_ptr": "*fp32",
                "mp_ptr": "*fp32",
                "out_ptr": "*fp32",
                "sums_ptr": "*fp64",
                "rows": "i32",
                "V": "i32",
                "blocks": "i32",
                "greedy_below": "fp32",
                "rtol": "fp32",
            }
            constexprs = dict(
                HAS_MIN_P=min_p, ONE_BLOCK=label == "V=12", BLOCK=12 if label == "V=12" else 1024, **shape
            )
            yield f"weigh {dtype} {label} min_p={min_p}", jit.weigh_kernel, signature, constexprs
        signature = {"x_ptr": FLOATS[dtype], "out_ptr": "*i64", "rows": "i32", "V": "i32"}
        yield f"argmax {dtype} {label}", jit.argmax_kernel, signature, {k: v for k, v in shape.items() if k != "SEARCH"}
        signature = {"x_ptr": FLOATS[dtype], "use_ptr": "*i8", "out_ptr": "*u8", "rows": "i32", "V": "i32"}
        yield f"scan {dtype} {label}", jit.scan_kernel, signature, {k: v for k, v in shape.items() if k != "SEARCH"}
        signature = {
            "logits": groups.Logits(data=FLOATS[dtype], words=FLOATS[dtype], V="i32", W="i32"),
            "rule": groups.RelaxedRows(
                drafts="*i64",
                accepted="*i8",
                top1="*i64",
                rows="i32",
                positions="i32",
                logit_positions="i32",
                k="i32",
                delta="fp32",
            ),
        }
        yield (
            f"relaxed {dtype} {label}",
            jit.relaxed_kernel,
            signature,
            {k: v for k, v in shape.items() if k != "SEARCH"},
        )
        for recovery in (False, True):
            signature = {
                "draws": groups.Draws(
                    weights="*fp32",
                    uniforms="*fp64",
                    tokens="*i64",
                    V="i32",
                    rows="i32",
                    positions="i32",
                    weight_rows="i32",
                ),
                "recovering": groups.RecoveryRows(
                    probs=FLOATS[dtype] if recovery else "*fp32",
                    scale="*fp32" if recovery else "*fp64",
                    use_q="*i8" if recovery else "*i64",
                    excluded="*i64",
                ),
            }
            yield (
                f"draw {dtype} {label} recovery={recovery}",
                jit.draw_kernel,
                signature,
                dict(RECOVERY=recovery, **{k: v for k, v in shape.items() if k != "SEARCH"}),
            )
        for mask, min_p, shared, relaxed, sampled, block in verify_flags(dtype):
            signature = {
                "logits": groups.Logits(data=FLOATS[dtype], words="*i32" if mask else FLOATS[dtype], V="i32", W="i32"),
                "requests": groups.Requests(
                    temperature="*fp32",
                    top_k="*i64",
                    top_p="*fp32",
                    min_p="*fp32",
                    seeds="*i64",
                    thinking="*i8" if relaxed else "*i64",
                ),
                "drafts": groups.Drafts(tokens="*i64", probs="*fp32" if sampled else FLOATS[dtype], B="i32", K="i32"),
                "outputs": groups.Outputs(first="*i64", recovered="*i64", bonus="*i64", candidates="*i64"),
                "settings": groups.Settings(greedy_below="fp32", rtol="fp32", relaxed_k="i32", relaxed_delta="fp32"),
                "seed_low": "i32",
                "seed_high": "i32",
            }
            flags = groups.constexprs(
                groups.Flags,
                HAS_MIN_P=min_p,
                SHARED_SEED=shared,
                SEED_GIVEN=shared and not mask,
                HAS_RELAXED=relaxed,
                SAMPLED=sampled,
                BLOCK_VERIFICATION=block,
            )
            tiling = groups.constexprs(groups.Shape, **(blocks[label] if block else {**shape, **whole[label]}))
            yield (
                f"verify {dtype} {label} mask={mask} min_p={min_p} shared={shared} relaxed={relaxed} sampled={sampled}"
                + (" block=True" if block else ""),
                jit.verify_kernel,
                signature,
                {"FLAGS": flags, "SHAPE": tiling},
            )


#: Each kernel once, at the launch shape of a large vocabulary, with every code path of the whole-call
#: kernel switched on (masks, min-p, sampled drafts; relaxed rows; a seed tensor, an int seed: shared
#: without a mask).
REPRESENTATIVE = (
    "weigh fp32 V=128256 min_p=True",
    "argmax bf16 V=128256",
    "scan bf16 V=128256",
    "relaxed fp32 V=128256",
    "draw bf16 V=128256 recovery=True",
    "verify bf16 V=128256 mask=True min_p=True shared=False relaxed=False sampled=True",
    "verify fp32 V=128256 mask=True min_p=True shared=True relaxed=True sampled=False",
    "verify fp32 V=128256 mask=False min_p=True shared=True relaxed=False sampled=True",  # an int seed
    "verify bf16 V=128256 mask=True min_p=True shared=False relaxed=False sampled=True block=True",
)


def _compile_one(job: tuple[str, int]) -> str:
    """Compile the variant named `name` for sm_`capability` (in a worker process); returns the line to print."""
    name, capability = job
    kernel, signature, constexprs = next((k, s, c) for n, k, s, c in variants() if n == name)
    signature = {**signature, **{key: "constexpr" for key in constexprs}}
    compiled = triton.compile(
        ASTSource(kernel, signature=signature, constexprs=constexprs), target=GPUTarget("cuda", capability, 32)
    )
    assert compiled.asm.get("cubin"), f"{name}: no cubin for sm_{capability}"
    return f"compiled {name} for sm_{capability}"


def chosen(capabilities: list[int], selection: str) -> list[tuple[str, int]]:
    """(variant name, capability) for each compile: every variant ("all"), the REPRESENTATIVE ones, or every
    variant but those ("rest": what a run of the representative ones leaves)."""
    names = [name for name, *_ in variants()]
    if selection == "representative":
        names = [name for name in names if name in REPRESENTATIVE]
    elif selection == "rest":
        names = [name for name in names if name not in REPRESENTATIVE]
    return [(name, capability) for name in names for capability in capabilities]


def compile_all(capabilities: list[int], selection: str = "all", jobs: int = 1) -> int:
    """Compile the chosen variants for each capability in `jobs` processes (a variant of the whole-call
    kernel takes about 20 s of one core: the compiles are independent); returns the count."""
    work = chosen(capabilities, selection)
    if jobs <= 1:
        for line in map(_compile_one, work):
            print(line, flush=True)
        return len(work)
    with multiprocessing.get_context("spawn").Pool(jobs) as pool:
        for line in pool.imap_unordered(_compile_one, work):
            print(line, flush=True)
    return len(work)


if __name__ == "__main__":
    started = time.time()
    caps = [int(c) for c in sys.argv[1:] if c.isdigit()] or [90, 80]
    selection = next((flag[2:] for flag in sys.argv[1:] if flag in ("--representative", "--rest")), "all")
    workers = min(len(os.sched_getaffinity(0)), 4)
    total = compile_all(caps, selection, jobs=workers)
    print(f"{total} kernel variants compiled in {time.time() - started:.1f} s ({workers} processes)")
