/* CPU kernels for specverify: logits -> truncated target weights in one pass per row (weigh_rows), the
 * inverse-CDF draw (sample_rows), the recovery draw of sampled mode (recover_rows), a NaN-safe argmax.
 *
 * A row is processed while it is in cache: its max, then w = exp((x - max) / T) (a vectorised exp), the
 * kept-set threshold, then the weights below it zeroed and block sums written. Weights are non-negative
 * float32, so their bit patterns order like their values. A small top-k is found with a heap of the k
 * largest (its nucleus from those k sorted values); a larger top-k by radix selection (a counting
 * histogram over the row, then the chosen bucket's values gathered and resolved); the nucleus by a search
 * on the weights' bits, a few vectorised passes that each narrow a bracket around it to a fifth, then the
 * bracket's values gathered and resolved (nucleus_threshold). A row without top-k sifts for it instead
 * (nucleus_sifted): fewer passes, the cuts placed where the weight crosses the target by interpolation,
 * the result kept where sums with bounded error certify it is nucleus_threshold's, else nucleus_threshold
 * decides. The exp runs 64 values at a time, without its clamps where they change nothing (exp_chunk).
 * Sums run in double in a fixed lane order, so results do not depend on threads, batch layout or the
 * instruction set. Rows are independent: built with OpenMP, a call spreads them over the calling thread's
 * team; built without, the caller splits a batch between threads (ctypes releases the GIL). Inputs may be
 * float32, bfloat16 or float16, converted exactly a row at a time.
 *
 * The verifier's chain calls go through draw_rows instead, which never writes the weights out: each row
 * is weighed (weigh_kept: a greedy row's argmax alone; a top-k row from its k largest raw logits, only the
 * candidates near the k-th exponentiated, held as a short list of (id, weight); any other row densely in
 * a buffer of the thread's, in cache) and drawn at once with its keyed uniform, so that the logits are
 * read about once. Sampled mode keeps each drafted position's weights for recover_kept_rows (the short
 * list, or the dense row where the kept set is large). Every path gives the bits of the dense one. A call
 * of few rows (B = 1: 5 rows on 2 threads) weighs its last rows with the whole team, a share of each row a
 * thread (team_rows), rather than leaving one thread a row more than the others.
 */
#define _POSIX_C_SOURCE 200112L /* posix_memalign under -std=c99 */
#include <stdint.h>
#include <string.h>
#include <float.h>
#include <math.h>
#include <stdlib.h>
#ifdef _OPENMP
#include <omp.h>
#endif

/* Below this many values a call stays on one thread. */
#define PARALLEL_WORK 65536

/* Hot loops are compiled for AVX-512, AVX2 and plain x86-64, the best chosen at load time (GCC's
 * function multiversioning, on x86-64 Linux); elsewhere they are compiled once for the target. The AVX2
 * build is x86-64-v3 (AVX2 with FMA) where GCC names that level (12 and later): the exp's polynomial in
 * fused multiply-adds is a quarter faster, and contracted as the AVX-512 build contracts it in 512-bit
 * vectors and scalars, so that both give the same weights there. (-mavx512f does not enable FMA for
 * 256-bit vectors: where GCC finishes a loop's last 8 values in them, the AVX-512 build rounds those
 * without FMA; see exp_row.) */
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 12 && defined(__x86_64__) && defined(__linux__)
#define CLONES __attribute__((target_clones("avx512f", "arch=x86-64-v3", "default")))
#elif defined(__GNUC__) && defined(__x86_64__) && defined(__linux__)
#define CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define CLONES
#endif
/* A helper of the clones' float loops, inlined into each clone so that it is built for the clone's
 * instruction set: one that is not inlined is built for plain x86-64 (no FMA, four-float vectors), and its
 * weights differ in the last bit. */
#define IN_CLONE static inline __attribute__((always_inline))

/* ---- The calls' arguments: each entry point takes one of these structs (native/__init__.py mirrors each
 * as a ctypes Structure, field for field, and checks their sizes at load: specverify_struct_sizes). A
 * pointer field points at the first element of the call's slice; its shape comment says what it holds. An
 * entry point returns 0, or the size in bytes of an allocation it could not make (its outputs then
 * unfinished), which the Python layer raises as MemoryError. ---- */

/* A chain call's logits rows and the rules that weigh them: request b's rows are b * per_position + j. */
struct chain_rows {
    const void *logits;       /* [requests * per_position, n] of dtype, contiguous */
    const float *temperature; /* float32 [requests] */
    const int64_t *top_k;     /* int64 [requests]; <= 0 or >= n: no limit */
    const float *top_p;       /* float32 [requests]; >= 1: no nucleus */
    const float *min_p;       /* float32 [requests], or NULL: no min-p */
    int64_t dtype;            /* FLOAT32, BFLOAT16 or FLOAT16: the logits' element type */
    int64_t requests;         /* B of this slice */
    int64_t per_position;     /* K + 1: rows per request */
    int64_t n;                /* V: values per row */
    int64_t block;            /* tokens per block of the two-level CDF */
    double rtol;              /* relative tolerance of the kept-set boundaries (contract.BOUNDARY_RTOL) */
    float greedy_below;       /* a temperature below it makes a row greedy (contract.GREEDY_TEMPERATURE) */
};

/* The keys of a call's requests (request_seed): s_b = seeds[b * seeds_step] (0 where seeds is NULL) +
 * offset + b * row_stride, mod 2^64. */
struct request_keys {
    const int64_t *seeds; /* int64 [requests] (seeds_step 1), int64 [1] (one seed shared: step 0), or NULL */
    int64_t seeds_step;   /* 1 per request, 0 shared */
    uint64_t offset;      /* added to every key base (a shared int seed and the slice's start) */
    uint64_t row_stride;  /* added per request: 0, or ROW_STRIDE for a shared seed */
};

/* The weights draw_rows keeps for the recovery of sampled mode, per row (b * per_position + j): a short
 * list of count >= 0 (id, weight) pairs, ids ascending, or count -1 and the whole row in dense. */
struct kept_rows {
    int64_t *count;       /* int64 [rows]: kept tokens, or -1 for a dense row */
    int32_t *ids;         /* int32 [rows, capacity]: the kept tokens, ascending */
    float *weights;       /* float32 [rows, capacity]: their weights */
    float *dense;         /* float32 [rows, n]: a row's weights where count is -1 */
    double *block_sums;   /* float64 [rows, ceil(n / block)]: the kept weights' block sums */
    int64_t capacity;     /* the most tokens a short list holds */
};

/* weigh_rows: the truncated weights of SPEC §2, row by row. */
struct weigh_args {
    const void *logits;       /* [.., n] of dtype: output row r weighs logits row source[r] (r where NULL) */
    const int64_t *source;    /* int64 [rows], -1: skip the row; or NULL */
    const float *temperature; /* float32 [rows] */
    const int64_t *top_k;     /* int64 [rows] */
    const float *top_p;       /* float32 [rows] */
    const float *min_p;       /* float32 [rows], or NULL */
    float *weights;           /* float32 [rows, n] out */
    double *block_sums;       /* float64 [rows, ceil(n / block)] out */
    int64_t dtype;            /* the logits' element type */
    int64_t rows;             /* output rows of this slice */
    int64_t n;                /* V */
    int64_t block;            /* tokens per block */
    double rtol;              /* as in chain_rows */
    float greedy_below;       /* as in chain_rows */
};

/* argmax_rows: the index of each row's largest value. */
struct argmax_args {
    const void *values; /* [rows, n] of dtype */
    int64_t *out;       /* int64 [rows] out */
    int64_t dtype;      /* the values' element type */
    int64_t rows;       /* rows of this slice */
    int64_t n;          /* values per row */
};

/* scan_rows: each row's value check. */
struct scan_args {
    const void *values;    /* [rows, n] of dtype */
    const uint8_t *in_use; /* uint8 [rows], 0: not read; or NULL: every row */
    uint8_t *flags;        /* uint8 [rows] out */
    int64_t dtype;         /* the values' element type */
    int64_t rows;          /* rows of this slice */
    int64_t n;             /* values per row */
};

/* sample_rows: the inverse-CDF draw of each row of kept weights. */
struct sample_args {
    const float *weights;      /* float32 [rows, n] */
    const double *block_sums;  /* float64 [rows, ceil(n / block)] */
    const double *uniforms;    /* float64 [rows] */
    int64_t *out;              /* int64 [rows] out */
    int64_t rows;              /* rows of this slice */
    int64_t n;                 /* V */
    int64_t block;             /* tokens per block */
};

/* recover_rows: the recovery draw of sampled mode from weights written out. */
struct recover_args {
    const float *weights;      /* float32 [requests, weight_positions, n] */
    const double *weight_sums; /* float64 [requests, weight_positions, ceil(n / block)] */
    const double *mass;        /* float64 [requests, positions]: the weights' sums */
    const void *draft_probs;   /* [requests, positions, n] of draft_dtype */
    const int64_t *draft;      /* int64 [requests, positions] */
    const int32_t *mode;       /* int32 [requests, positions]: FROM_TARGET, FROM_RESIDUAL or WITHOUT_DRAFT */
    const double *uniforms;    /* float64 [requests, positions] */
    int64_t *out;              /* int64 [requests, positions] out */
    int64_t draft_dtype;       /* draft_probs' element type */
    int64_t requests;          /* requests of this slice */
    int64_t positions;         /* drafted positions per request */
    int64_t weight_positions;  /* weight rows per request (positions or positions + 1) */
    int64_t n;                 /* V */
    int64_t block;             /* tokens per block */
};

/* draw_rows: the target draws of a chain call's rows, with the argmax-mode verdicts or what sampled
 * mode's ratio test and recovery need. */
struct draw_args {
    struct chain_rows rows;    /* the logits and their rules */
    struct request_keys keys;  /* the requests' key bases */
    uint64_t salt;             /* the target stream's salt (rng.stream_salt(STREAM_TARGET)) */
    int64_t *tokens;           /* int64 [requests * per_position] out: the draws; where bonus is set,
                                  [requests, per_position - 1]: the drafted positions' */
    int64_t *bonus;            /* int64 [requests] out: the last position's draws; or NULL (in tokens) */
    const int64_t *proposed;   /* int64 [requests, per_position - 1]: the drafts as given (with first) */
    int64_t *first;            /* int64 [requests] out: the first position not accepted; NULL: no verdicts */
    const int64_t *draft;      /* int64 [requests, per_position - 1], -1 where none; NULL: argmax mode */
    uint64_t accept_salt;      /* with draft: the ratio test's stream salt (STREAM_ACCEPT) */
    float *at_draft;           /* float32 [requests, per_position - 1] out (with draft): w(d) */
    double *accept_uniforms;   /* float64 [requests, per_position - 1] out (with draft): the test's uniforms */
    struct kept_rows kept;     /* out (with draft): the weights for the recovery */
};

/* recover_kept_rows: the recovery draw of sampled mode from what draw_rows kept. */
struct recover_kept_args {
    struct kept_rows kept;     /* position j of request b at row b * (positions + 1) + j */
    struct request_keys keys;  /* the requests' key bases */
    uint64_t salt;             /* the residual stream's salt (STREAM_RESIDUAL) */
    const double *mass;        /* float64 [requests, positions]: the kept weights' sums */
    const void *draft_probs;   /* [requests, positions, n] of draft_dtype */
    const int64_t *draft;      /* int64 [requests, positions], -1 where none */
    const int32_t *mode;       /* int32 [requests, positions] */
    int64_t *out;              /* int64 [requests, positions] out */
    int64_t draft_dtype;       /* draft_probs' element type */
    int64_t requests;          /* requests of this slice */
    int64_t positions;         /* drafted positions per request */
    int64_t n;                 /* V */
    int64_t block;             /* tokens per block */
};

/* draw_sampled_verdicts: a sampled-mode chain call, draws to verdicts. */
struct sampled_verdict_args {
    struct chain_rows rows;    /* the logits and their rules */
    struct request_keys keys;  /* the requests' key bases */
    uint64_t salt;             /* STREAM_TARGET's salt */
    uint64_t accept_salt;      /* STREAM_ACCEPT's salt */
    uint64_t residual_salt;    /* STREAM_RESIDUAL's salt */
    const int64_t *proposed;   /* int64 [requests, per_position - 1]: the drafts as given */
    const void *draft_probs;   /* [requests, per_position - 1, n] of draft_dtype */
    float *dense;              /* float32 [requests * per_position, n]: room for dense kept rows */
    int64_t *bonus;            /* int64 [requests] out: the bonus draws (the last position's) */
    int64_t *recovered;        /* int64 [requests, per_position - 1] out */
    int64_t *first;            /* int64 [requests] out */
    int64_t draft_dtype;       /* draft_probs' element type */
    int64_t capacity;          /* the most tokens a short kept list holds */
};

/* relaxed_rows: the relaxed acceptance of thinking rows. */
struct relaxed_args {
    const void *logits;       /* [requests, logit_positions, n] of dtype */
    const int64_t *draft;     /* int64 [requests, positions], -1: none */
    uint8_t *accepted;        /* uint8 [requests, positions] out */
    int64_t *top1;            /* int64 [requests, positions] out */
    int64_t dtype;            /* the logits' element type */
    int64_t requests;         /* requests of this slice */
    int64_t positions;        /* drafted positions per request */
    int64_t logit_positions;  /* logits rows per request */
    int64_t n;                /* V */
    int64_t k;                /* the top-k a draft must be in */
    double delta;             /* how far below the top-1's probability a draft may be */
};

/* The size of each argument struct, in the order native/__init__.py lists them, written to sizes[12]. */
void specverify_struct_sizes(int64_t *sizes) {
    const size_t each[] = {sizeof(struct chain_rows), sizeof(struct request_keys), sizeof(struct kept_rows),
                           sizeof(struct weigh_args), sizeof(struct argmax_args), sizeof(struct scan_args),
                           sizeof(struct sample_args), sizeof(struct recover_args), sizeof(struct draw_args),
                           sizeof(struct recover_kept_args), sizeof(struct sampled_verdict_args),
                           sizeof(struct relaxed_args)};
    for (size_t i = 0; i < sizeof each / sizeof *each; i++) sizes[i] = (int64_t)each[i];
}

/* ---- Allocation: every buffer through `allocate`, which records a refusal instead of handing back NULL
 * unnoticed. ---- */

/* The largest allocation the kernels make, in bytes: a test lowers it (specverify_refuse_allocations_above)
 * to see a refusal reach Python as a MemoryError. */
static uint64_t allocation_limit = UINT64_MAX;

void specverify_refuse_allocations_above(uint64_t bytes) {
    allocation_limit = bytes;
}

/* Bytes every allocation is aligned to: a cache line, and the widest vector. malloc aligns a large block
 * to 16 bytes (glibc maps it after a 16-byte header), and 64-byte vectors stored across two cache lines
 * made the exp pass over a row in draw_rows' buffer about 1.8x slower. */
#define ALIGNMENT 64

/* bytes (never 0, where an allocator may give NULL) aligned to ALIGNMENT, or NULL with bytes written to
 * *refused (atomically: the threads of a parallel region share it). Freed by free. */
static void *allocate(uint64_t bytes, int64_t *refused) {
    void *memory = NULL;
    if (bytes > allocation_limit || posix_memalign(&memory, ALIGNMENT, bytes ? (size_t)bytes : 1)) memory = NULL;
    if (!memory) {
#pragma omp atomic write
        *refused = (int64_t)bytes;
    }
    return memory;
}

static inline uint32_t bits_of(float value) {
    uint32_t bits;
    memcpy(&bits, &value, sizeof bits);
    return bits;
}

static inline float float_of(uint32_t bits) {
    float value;
    memcpy(&value, &bits, sizeof value);
    return value;
}

/* Element types a kernel can read its inputs in. */
enum { FLOAT32 = 0, BFLOAT16 = 1, FLOAT16 = 2 };

/* An IEEE half as float, exactly: its exponent and mantissa moved into a float's place and re-biased by
 * 2^112 (which also turns half subnormals into normal floats); infinities and NaN keep an all-ones
 * exponent. Branch-free, so loops over it vectorise. */
static inline float half_to_float(uint16_t half) {
    const uint32_t sign = (uint32_t)(half & 0x8000u) << 16, rest = half & 0x7fffu;
    const uint32_t magnitude = rest >= 0x7c00u ? (rest << 13) | 0x7f800000u : bits_of(float_of(rest << 13) * 0x1p112f);
    return float_of(sign | magnitude);
}

/* Row r of an [rows, n] matrix of `dtype` elements as float32: the row itself for float32, else its
 * exact conversion written into `buffer` (room for n floats). */
static inline const float *float_row(const void *matrix, int dtype, int64_t r, int64_t n, float *buffer) {
    if (dtype == FLOAT32) return (const float *)matrix + r * n;
    const uint16_t *row = (const uint16_t *)matrix + r * n;
    if (dtype == BFLOAT16)
        for (int64_t i = 0; i < n; i++) buffer[i] = float_of((uint32_t)row[i] << 16);
    else
        for (int64_t i = 0; i < n; i++) buffer[i] = half_to_float(row[i]);
    return buffer;
}

/* The larger of a value and a running maximum: `value` only where it is greater, so that a NaN value never
 * wins (a comparison with NaN is false) and a maximum started at -inf is never NaN. */
static inline float larger(float value, float best) {
    return value > best ? value : best;
}

/* Running maxima of a streaming max scan, as a plain float array: the compiler keeps them in the widest
 * vectors of the instruction set it builds for (four AVX-512 registers, eight AVX2 or sixteen SSE ones),
 * so that the scan runs at the vector units' throughput on every clone. */
#define STREAM_LANES 64

/* Four float lanes as one vector (GCC/Clang vector extensions: one SSE or NEON register; wider vectors
 * are lowered badly where the target lacks them, so loops keep several of them in flight), for the max
 * of each chunk of a row, where the lanes must be reduced chunk by chunk (a plain array reduced that
 * often is not vectorised well). */
#define LANES 4
typedef float floats4 __attribute__((vector_size(4 * LANES)));
typedef int32_t ints4 __attribute__((vector_size(4 * LANES)));

static inline floats4 load4(const float *at) {
    floats4 v;
    memcpy(&v, at, sizeof v);
    return v;
}

/* Lanes of `when` where the mask is set, else lanes of `otherwise`. */
static inline floats4 select4(ints4 mask, floats4 when, floats4 otherwise) {
    return (floats4)((mask & (ints4)when) | (~mask & (ints4)otherwise));
}

/* Lane by lane, the larger of a and b (b where a is NaN). */
static inline floats4 max4(floats4 a, floats4 b) {
    return select4(a > b, a, b);
}

/* Values per chunk of chunk_max (a multiple of 8 * LANES). */
#define CHUNK 64

/* The largest of the CHUNK values from `at`, NaN skipped (-inf when there is none). Eight vectors in
 * flight, each starting at -inf, so that the loop runs at the vector units' throughput, not at the
 * latency of one compare-and-select chain. */
IN_CLONE float chunk_max(const float *at) {
    floats4 lanes[8];
    for (int v = 0; v < 8; v++) lanes[v] = (floats4){0} - INFINITY;
    for (int i = 0; i < CHUNK; i += 8 * LANES)
        for (int v = 0; v < 8; v++) lanes[v] = max4(load4(at + i + v * LANES), lanes[v]);
    for (int v = 0; v < 4; v++) lanes[v] = max4(lanes[v], lanes[v + 4]);
    floats4 top = max4(max4(lanes[0], lanes[1]), max4(lanes[2], lanes[3])); /* no lane is NaN */
    top = max4(top, (floats4){top[2], top[3], top[0], top[1]});
    return top[0] > top[1] ? top[0] : top[1];
}

/* Values per block of the stripes: stripe `lane` of a block holds its values lane, lane + STREAM_LANES,
 * lane + 2 * STREAM_LANES, ... (STRIPE_BLOCK / STREAM_LANES of them), so that the maxima of a block's
 * STREAM_LANES stripes are one streaming scan of STREAM_LANES running maxima (lane_maxima). */
#define STRIPE_BLOCK 4096

/* The running maxima of values [start, end) of the row: lanes[lane] is the largest of start + lane,
 * start + lane + STREAM_LANES, ... (NaN skipped; -inf where there is none). One streaming scan. */
IN_CLONE void lane_maxima(const float *row, int64_t start, int64_t end, float *lanes) {
    for (int lane = 0; lane < STREAM_LANES; lane++) lanes[lane] = -INFINITY;
    int64_t i = start;
    for (; i + STREAM_LANES <= end; i += STREAM_LANES)
        for (int lane = 0; lane < STREAM_LANES; lane++) lanes[lane] = larger(row[i + lane], lanes[lane]);
    for (int lane = 0; i + lane < end; lane++) lanes[lane] = larger(row[i + lane], lanes[lane]);
}

/* The largest of STREAM_LANES running maxima. */
static inline float lanes_max(const float *lanes) {
    float best = -INFINITY;
    for (int lane = 0; lane < STREAM_LANES; lane++) best = larger(lanes[lane], best);
    return best;
}

/* The values of the row in [low, high) (both >= 0, so that their bits order like them: an unsigned range
 * test on the bits) copied in row order to scratch (room for n values, then n bytes of flags); returns
 * how many. A vectorised pass writes a flag per value; groups of 8 values without one are passed over. */
IN_CLONE int64_t gather_between(const float *row, int64_t n, float low, float high, float *scratch) {
    uint8_t *flags = (uint8_t *)(scratch + n);
    const uint32_t from = bits_of(low), span = bits_of(high) - from;
    for (int64_t i = 0; i < n; i++) flags[i] = bits_of(row[i]) - from < span;
    int64_t count = 0, i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t any;
        memcpy(&any, flags + i, sizeof any);
        if (!any) continue;
        for (int t = 0; t < 8; t++) { /* (branch-free: which values pass is unpredictable) */
            scratch[count] = row[i + t];
            count += flags[i + t];
        }
    }
    for (; i < n; i++) {
        scratch[count] = row[i];
        count += flags[i];
    }
    return count;
}

/* The largest value t among values[0..count) such that `above` plus the weight of {v >= t} reaches the
 * target, where a value weighs itself (mass != 0) or 1; the values' bits above bit shift + 9 are all
 * `prefix`. Radix selection on the next 10 bits from bit `shift` down (shift 20, 10 or 0; for values in
 * [0, 1], bits 20-29 are the exponent's low 7 bits and 3 bits of mantissa), a level at a time: a histogram
 * summed in double, the bucket where the running weight reaches the target, its values kept (in place in
 * `values`). Where rounding leaves the target unreached at a level, the lowest bucket is kept. Where
 * `reached` is not NULL, the sums of the last level go there: reached[0] the running weight above the
 * chosen bucket (`above` plus the buckets over it), reached[1] the chosen bucket's weight. */
static float refine_threshold(float *values, int64_t count, int mass, double above, double target, uint32_t prefix,
                              int shift, double *reached) {
    double hist[1024];
    for (; shift >= 0; shift -= 10) {
        memset(hist, 0, sizeof hist);
        for (int64_t i = 0; i < count; i++) hist[(bits_of(values[i]) >> shift) & 1023u] += mass ? (double)values[i] : 1.0;
        int chosen = 1023;
        while (chosen > 0 && above + hist[chosen] < target) above += hist[chosen--];
        if (reached) {
            reached[0] = above;
            reached[1] = hist[chosen];
        }
        int64_t kept = 0;
        for (int64_t i = 0; i < count; i++) { /* (branch-free, in place: kept <= i) */
            values[kept] = values[i];
            kept += ((bits_of(values[i]) >> shift) & 1023u) == (uint32_t)chosen;
        }
        count = kept;
        prefix = (prefix << 10) | (uint32_t)chosen;
    }
    return float_of(prefix);
}

/* The k-th largest value of a row of weights in [0, 1] (0 < k <= n; ties count each). Radix selection: a
 * histogram of bits 20-29 (in two tables, to halve the chains of dependent adds), the values of the
 * bucket holding the k-th gathered (gather_between) into scratch (scratch_size(n)), then
 * refine_threshold. */
static float kth_largest(const float *row, int64_t n, int64_t k, float *scratch) {
    int64_t even[1024], odd[1024];
    memset(even, 0, sizeof even);
    memset(odd, 0, sizeof odd);
    int64_t i = 0;
    for (; i + 1 < n; i += 2) {
        even[(bits_of(row[i]) >> 20) & 1023u]++;
        odd[(bits_of(row[i + 1]) >> 20) & 1023u]++;
    }
    if (i < n) even[(bits_of(row[i]) >> 20) & 1023u]++;
    int64_t above = 0;
    uint32_t chosen = 1023;
    while (chosen > 0 && above + even[chosen] + odd[chosen] < k) {
        above += even[chosen] + odd[chosen];
        chosen--;
    }
    const int64_t count = gather_between(row, n, float_of(chosen << 20), float_of((chosen + 1) << 20), scratch);
    return refine_threshold(scratch, count, 0, (double)above, (double)k, chosen, 10, NULL);
}

/* The weight of the row's values >= cut, summed in double in sixteen lanes (vectorised), the lanes then
 * added in lane order: the same bits for the same row and cut on every machine. */
IN_CLONE double weight_at_least(const float *row, int64_t n, float cut) {
    double lanes[16] = {0};
    int64_t i = 0;
    for (; i + 15 < n; i += 16)
        for (int lane = 0; lane < 16; lane++) lanes[lane] += row[i + lane] >= cut ? row[i + lane] : 0.0f;
    double sum = 0.0;
    for (; i < n; i++) sum += row[i] >= cut ? row[i] : 0.0f;
    for (int lane = 0; lane < 16; lane++) sum += lanes[lane];
    return sum;
}

/* Cuts of one pass of the nucleus search (estimate_at_cuts spells out one lane array for each of them). */
#define CUTS 4
/* Values per lane of estimate_at_cuts' float sums before they are added into double. */
#define ESTIMATE_RUN 64

/* Estimates of the weight of the row's values >= each of CUTS cuts, in one pass: per cut, sixteen float
 * lanes (vectorised) of ESTIMATE_RUN values each, added into double lanes, so that each estimate is within
 * ESTIMATE_ERROR of the weight, relative. */
#define ESTIMATE_ERROR ((ESTIMATE_RUN + 1) * 0x1p-24)
IN_CLONE void estimate_at_cuts(const float *row, int64_t n, const float *cut, double *weight) {
    double wide[CUTS][16] = {{0}};
    const float a = cut[0], b = cut[1], c = cut[2], d = cut[3];
    int64_t i = 0;
    while (i + 16 * ESTIMATE_RUN <= n) {
        float first[16] = {0}, second[16] = {0}, third[16] = {0}, fourth[16] = {0};
        for (const int64_t end = i + 16 * ESTIMATE_RUN; i < end; i += 16)
            for (int lane = 0; lane < 16; lane++) {
                const float v = row[i + lane];
                first[lane] += v >= a ? v : 0.0f;
                second[lane] += v >= b ? v : 0.0f;
                third[lane] += v >= c ? v : 0.0f;
                fourth[lane] += v >= d ? v : 0.0f;
            }
        for (int lane = 0; lane < 16; lane++) {
            wide[0][lane] += first[lane];
            wide[1][lane] += second[lane];
            wide[2][lane] += third[lane];
            wide[3][lane] += fourth[lane];
        }
    }
    for (int j = 0; j < CUTS; j++) {
        weight[j] = 0.0;
        for (int64_t t = i; t < n; t++) weight[j] += row[t] >= cut[j] ? row[t] : 0.0f;
        for (int lane = 0; lane < 16; lane++) weight[j] += wide[j][lane];
    }
}

/* estimate_at_cuts at two cuts a and b (the same lanes and runs, within ESTIMATE_ERROR). */
IN_CLONE void estimate_at_two(const float *row, int64_t n, float a, float b, double *weight) {
    double wide[2][16] = {{0}};
    int64_t i = 0;
    while (i + 16 * ESTIMATE_RUN <= n) {
        float first[16] = {0}, second[16] = {0};
        for (const int64_t end = i + 16 * ESTIMATE_RUN; i < end; i += 16)
            for (int lane = 0; lane < 16; lane++) {
                const float v = row[i + lane];
                first[lane] += v >= a ? v : 0.0f;
                second[lane] += v >= b ? v : 0.0f;
            }
        for (int lane = 0; lane < 16; lane++) {
            wide[0][lane] += first[lane];
            wide[1][lane] += second[lane];
        }
    }
    weight[0] = weight[1] = 0.0;
    for (int64_t t = i; t < n; t++) {
        weight[0] += row[t] >= a ? row[t] : 0.0f;
        weight[1] += row[t] >= b ? row[t] : 0.0f;
    }
    for (int lane = 0; lane < 16; lane++) {
        weight[0] += wide[0][lane];
        weight[1] += wide[1][lane];
    }
}

/* A nucleus bracket holding at most this many values (by its weight over its lowest value) is listed. */
#define BRACKET_VALUES 2048

/* The nucleus threshold of a row of weights in [0, 1] (not NaN): the largest value t >= floor such that
 * the weight of {v >= t} reaches top_p times the weight of {v >= floor} (weights summed exactly, by
 * weight_at_least; 0 where the row weighs nothing). A search on the values' bits (which order like them)
 * narrows a bracket [low, high) with weight(>= low) >= target > weight(>= high): each pass over the row
 * (in cache) estimates the weight at CUTS cuts evenly spaced in the bracket's bits (estimate_at_cuts) and
 * keeps the part between the two cuts around the target (a fifth of its bits at most), a cut whose
 * estimate is within ESTIMATE_ERROR of the target judged on its exact weight, so that the bracket holds
 * the threshold whatever the rounding. The first pass starts at (1 - top_p) * total / n: no value below it
 * is the threshold (together such values weigh less than what the nucleus leaves out). Once the bracket
 * holds at most about BRACKET_VALUES values (or a value or two), the weight above it is summed exactly and
 * its values are listed into scratch (scratch_size(n)) and resolved by refine_threshold. */
IN_CLONE float nucleus_threshold(const float *row, int64_t n, float floor, double top_p, float *scratch) {
    const double total = weight_at_least(row, n, floor);
    if (!(total > 0.0)) return 0.0f;
    const double target = top_p * total;
    uint32_t low = bits_of(floor), high = bits_of(1.0f) + 1u;
    double weight_low = total, weight_high = 0.0;
    const uint32_t lowest = bits_of((float)((1.0 - top_p) * total / (double)n));
    for (int pass = 0; high - low > CUTS && weight_low - weight_high > BRACKET_VALUES * (double)float_of(low); pass++) {
        /* the cuts: from `lowest` on in the first pass (it the first of them), else inside the bracket */
        const int from_lowest = pass == 0 && lowest > low && lowest < high - CUTS;
        const uint32_t from = from_lowest ? lowest : low, parts = from_lowest ? CUTS : CUTS + 1;
        float cut[CUTS];
        double weight[CUTS];
        for (uint32_t j = 0; j < CUTS; j++)
            cut[j] = float_of(from + (uint32_t)((uint64_t)(high - from) * (j + !from_lowest) / parts));
        estimate_at_cuts(row, n, cut, weight);
        for (int j = 0; j < CUTS; j++) {
            if (fabs(weight[j] - target) <= ESTIMATE_ERROR * (weight[j] > target ? weight[j] : target))
                weight[j] = weight_at_least(row, n, cut[j]);
            if (weight[j] >= target) {
                low = bits_of(cut[j]);
                weight_low = weight[j];
            } else {
                high = bits_of(cut[j]);
                weight_high = weight[j];
                break;
            }
        }
    }
    const double above = weight_at_least(row, n, float_of(high));
    const int64_t count = gather_between(row, n, float_of(low), float_of(high), scratch);
    const float threshold = refine_threshold(scratch, count, 1, above, target, 0u, 20, NULL);
    return threshold > float_of(low) ? threshold : float_of(low); /* (rounding left the target unreached) */
}

/* ---- The nucleus of a row without top-k, by sifting (nucleus_sifted): nucleus_threshold's threshold in
 * fewer passes over the row, certified by sums whose error is bounded, else nucleus_threshold's own. ---- */

/* Test hooks of the sifting search (tests/kernels/test_native_sift.py): whether rows sift (1, the default)
 * or go to nucleus_threshold alone (0); how many sifted rows were not certified and took nucleus_threshold's
 * threshold, read and reset. */
static int64_t sifting = 1, sift_fallbacks = 0;

void specverify_sift(int64_t on) {
    sifting = on;
}

int64_t specverify_sift_fallbacks(void) {
    return __atomic_exchange_n(&sift_fallbacks, 0, __ATOMIC_RELAXED);
}

/* Narrowing passes of a sifting search at most before its bracket is listed, however many values it holds. */
#define SIFT_PASSES 8

/* The bracket [low, high) of a sifting search on the weights' bits, with estimates of the weight at or
 * above each end: weight_low >= target > weight_high, up to the estimates' errors (a cut within them of
 * the target moves neither end); the row's estimated weight and the target, top_p times it. */
struct sift_bracket {
    uint32_t low, high;
    double weight_low, weight_high, total, target;
};

/* A search's first bracket: [(1 - top_p) * total / n, 1], a little wider (the values below weigh less
 * than what the nucleus leaves out, so no threshold lies there); total: the row's estimated weight. */
static inline struct sift_bracket sift_start(int64_t n, double top_p, double total) {
    const float lowest = (float)((1.0 - top_p) * total / (double)n * 0.999);
    return (struct sift_bracket){.low = bits_of(lowest), .high = bits_of(1.0f) + 1u, .weight_low = total,
                                 .weight_high = 0.0, .total = total, .target = top_p * total};
}

/* Whether the bracket may hold more than about BRACKET_VALUES values (its weight over its lowest value),
 * and more than CUTS bit patterns. */
static inline int sift_open(const struct sift_bracket *s) {
    return s->high - s->low > CUTS && s->weight_low - s->weight_high > BRACKET_VALUES * (double)float_of(s->low);
}

/* Where in the bracket (0: its low end, 1: its high end) the weight meets the target, taking the log of
 * the weight below a cut as linear in the cut's bits (the tail below the threshold thins out about
 * exponentially), or the weight itself where the weight below the low end is not known to be positive. */
static inline double sift_guess(const struct sift_bracket *s) {
    const double below_low = s->total - s->weight_low, below_high = s->total - s->weight_high;
    const double below_target = s->total - s->target;
    double guess = (s->weight_low - s->target) / (s->weight_low - s->weight_high);
    if (below_low > 0.0 && below_target > below_low && below_high > below_target)
        guess = log(below_target / below_low) / log(below_high / below_low);
    return guess > 0.0 ? (guess < 1.0 ? guess : 1.0) : 0.0;
}

/* The cuts of a pass, ascending inside the bracket; returns how many: on the first pass (interpolate 0)
 * CUTS, evenly spaced in its bits; then two, 1/32 of the bracket either side of sift_guess (a close guess
 * narrows the bracket 16-fold; a pass of two cuts costs about 60% of one of four, and though some rows
 * take a pass more, the rows measured took 8% less time, one kind 2% more). */
static inline int sift_cuts(const struct sift_bracket *s, int interpolate, float *cut) {
    const double width = (double)(s->high - s->low);
    const double guess = interpolate ? sift_guess(s) : 0.0;
    const double at[CUTS] = {0.2, 0.4, 0.6, 0.8}, near[2] = {guess - 1.0 / 32, guess + 1.0 / 32};
    const int cuts = interpolate ? 2 : CUTS;
    for (int j = 0; j < cuts; j++) {
        const double place = (interpolate ? near[j] : at[j]) * width;
        const double inside = place < 1.0 ? 1.0 : place < width - 1.0 ? place : width - 1.0;
        cut[j] = float_of(s->low + (uint32_t)inside);
    }
    return cuts;
}

/* The weight of the row's values at or above each of a pass's cuts, estimated (estimate_at_two for two,
 * else estimate_at_cuts). */
IN_CLONE void estimate_at(const float *row, int64_t n, int cuts, const float *cut, double *weight) {
    if (cuts == 2)
        estimate_at_two(row, n, cut[0], cut[1], weight);
    else
        estimate_at_cuts(row, n, cut, weight);
}

/* The bracket's ends moved to the cuts whose estimated weights are surely on either side of the target. */
static inline void sift_update(struct sift_bracket *s, int cuts, const float *cut, const double *weight) {
    const double slack = 1.0 + 3.0 * ESTIMATE_ERROR; /* the estimates' and the target's */
    for (int j = 0; j < cuts; j++) {
        if (weight[j] >= s->target * slack && bits_of(cut[j]) > s->low) {
            s->low = bits_of(cut[j]);
            s->weight_low = weight[j];
        }
        if (weight[j] * slack < s->target && bits_of(cut[j]) < s->high) {
            s->high = bits_of(cut[j]);
            s->weight_high = weight[j];
        }
    }
}

/* One pass of the search: the weight estimated at the cuts (estimate_at), the bracket narrowed
 * (sift_update). */
IN_CLONE void sift_narrow(const float *row, int64_t n, int interpolate, struct sift_bracket *s) {
    float cut[CUTS];
    double weight[CUTS];
    const int cuts = sift_cuts(s, interpolate, cut);
    estimate_at(row, n, cuts, cut, weight);
    sift_update(s, cuts, cut, weight);
}

/* Values per step of list_bracket (a multiple of 16). */
#define LIST_STEP 64

/* 64 byte flags (each 0 or 1) as the bits of one word, flag j at bit j: each 8 flags, read as one
 * little-endian word, gathered by one multiply. */
static inline uint64_t mask_of_flags(const uint8_t *flags) {
    uint64_t group[8], mask = 0;
    memcpy(group, flags, sizeof group);
    for (int g = 0; g < 8; g++) mask |= (group[g] * 0x0102040810204080ull >> 56) << (8 * g);
    return mask;
}

/* The values of LIST_STEP from `at` whose bits are in [from, from + span) appended in order to list[count..];
 * returns the new count. Byte flags (vectorised), gathered into a 64-bit mask (mask_of_flags), whose set
 * bits are walked: no branch on which values pass. */
IN_CLONE int64_t list_step(const float *at, uint32_t from, uint32_t span, float *list, int64_t count) {
    uint8_t in[LIST_STEP];
    for (int j = 0; j < LIST_STEP; j++) in[j] = bits_of(at[j]) - from < span;
    for (uint64_t mask = mask_of_flags(in); mask; mask &= mask - 1) list[count++] = at[__builtin_ctzll(mask)];
    return count;
}

/* The values of the row in [low, high) (both >= 0) listed in row order into list (room for n), the row's
 * weight and the weight of its values >= high summed in double into sums[0] and sums[1]; returns how many
 * are listed. A step per LIST_STEP values: the two weights in sixteen double lanes each and whether any
 * value is in the bracket (each loop vectorised), list_step only where one is. */
IN_CLONE int64_t list_bracket(const float *row, int64_t n, float low, float high, float *list, double *sums) {
    const uint32_t from = bits_of(low), span = bits_of(high) - from;
    double all[16] = {0}, above[16] = {0};
    int64_t count = 0, i = 0;
    for (; i + LIST_STEP <= n; i += LIST_STEP) {
        int any = 0;
        for (int v = 0; v < LIST_STEP; v += 16)
            for (int lane = 0; lane < 16; lane++) all[lane] += row[i + v + lane];
        for (int v = 0; v < LIST_STEP; v += 16)
            for (int lane = 0; lane < 16; lane++) above[lane] += row[i + v + lane] >= high ? row[i + v + lane] : 0.0f;
        for (int j = 0; j < LIST_STEP; j++) any |= bits_of(row[i + j]) - from < span;
        if (any) count = list_step(row + i, from, span, list, count);
    }
    sums[0] = sums[1] = 0.0;
    for (; i < n; i++) {
        sums[0] += row[i];
        sums[1] += row[i] >= high ? row[i] : 0.0f;
        list[count] = row[i];
        count += bits_of(row[i]) - from < span;
    }
    for (int lane = 0; lane < 16; lane++) {
        sums[0] += all[lane];
        sums[1] += above[lane];
    }
    return count;
}

/* The search's threshold from the `count` values of its final bracket listed in `listed` (list_bracket's
 * order; reordered here) and list_bracket's sums of the n values' row (sums[0] its weight, sums[1] the
 * weight above the bracket), or -1 where it is not certain: the target top_p times the row's weight, the
 * values resolved by refine_threshold, whose last sums give the weight above the threshold t and at it. t
 * is nucleus_threshold's threshold for sure where those sums miss the target by more than SIFT_MARGIN of
 * the row's weight (see nucleus_sifted). */
#define SIFT_MARGIN(n) ((4.0 * (double)(n) + 16384.0) * 0x1p-53)
static inline float sift_certified(const struct sift_bracket *s, int64_t n, double top_p, float *listed, int64_t count,
                                   const double *sums) {
    const float low = float_of(s->low), high = float_of(s->high);
    const double target = top_p * sums[0], margin = SIFT_MARGIN(n) * sums[0];
    double reached[2];
    const float threshold = refine_threshold(listed, count, 1, sums[1], target, 0u, 20, reached);
    const int inside = sums[0] > 0.0 && threshold >= low && threshold < high;
    return inside && reached[0] < target - margin && reached[0] + reached[1] >= target + margin ? threshold : -1.0f;
}

/* The search's threshold from its final bracket, or -1 where it is not certain: the bracket's values
 * listed into scratch (scratch_size(n)) with the row's weight and the weight above the bracket
 * (list_bracket), then sift_certified. */
IN_CLONE float sift_resolve(const float *row, int64_t n, const struct sift_bracket *s, double top_p, float *scratch) {
    double sums[2];
    const int64_t count = list_bracket(row, n, float_of(s->low), float_of(s->high), scratch, sums);
    return sift_certified(s, n, top_p, scratch, count, sums);
}

/* nucleus_threshold(row, n, 0, top_p, scratch) of a row of weights in [0, 1] whose largest is 1 (its max
 * logit finite), from an estimate of the row's weight (exp_row's): a search that narrows a bracket around
 * the threshold in passes of estimated weights (sift_narrow: the first at CUTS cuts evenly, the next at two
 * around the interpolated crossing), then lists the bracket's values and resolves them with sums in double
 * (sift_resolve). Why the same t: every double sum of k non-negative terms either search forms (its
 * row's weight, a weight above a cut, a running weight of refine_threshold's histograms) is within k ulp
 * of the exact sum's (k <= n + 3100), and the two targets, top_p times two sums of the row, within
 * n / 8 + 66 ulp of each other; so where the weight at or above t and the weight above t, as this search
 * sums them, miss its target by more than SIFT_MARGIN ((4n + 16384) ulp of the row's weight), the exact
 * weights miss nucleus_threshold's target by more than its own error: it classifies every cut as the
 * exact weights do (its bracket holds t: a cut at or below t is reached, one above it is not) and its
 * radix selection over that bracket stops at t's bucket at every level. Elsewhere nucleus_threshold
 * decides. */
IN_CLONE float nucleus_sifted(const float *row, int64_t n, double top_p, double estimate, float *scratch) {
    struct sift_bracket s = sift_start(n, top_p, estimate);
    for (int pass = 0; pass < SIFT_PASSES && sift_open(&s); pass++) sift_narrow(row, n, pass > 0, &s);
    const float threshold = sift_resolve(row, n, &s, top_p, scratch);
    if (threshold >= 0.0f) return threshold;
    __atomic_fetch_add(&sift_fallbacks, 1, __ATOMIC_RELAXED);
    return nucleus_threshold(row, n, 0.0f, top_p, scratch);
}

static void sift_down(float *heap, int64_t size, int64_t at) {
    for (;;) {
        int64_t smallest = at, left = 2 * at + 1, right = left + 1;
        if (left < size && heap[left] < heap[smallest]) smallest = left;
        if (right < size && heap[right] < heap[smallest]) smallest = right;
        if (smallest == at) return;
        const float swap = heap[at];
        heap[at] = heap[smallest];
        heap[smallest] = swap;
        at = smallest;
    }
}

/* Put value into the min-heap of the k largest so far if it beats the k-th (heap[0]). */
static inline void offer(float value, int64_t k, float *heap) {
    if (value > heap[0]) {
        heap[0] = value;
        sift_down(heap, k, 0);
    }
}

/* The number of stripes of a row of n values. */
static inline int64_t stripes_of(int64_t n) {
    return (n + STRIPE_BLOCK - 1) / STRIPE_BLOCK * STREAM_LANES;
}

/* Parts of a stripe with maxima of their own (stripe_maxima): part q of a block's stripes is its rows
 * [q, q + 1) * STRIPE_BLOCK / STRIPE_PARTS, so that a listing visits only the parts that can hold a value. */
#define STRIPE_PARTS 4

/* The room a row's scratch buffer needs, in floats: n values, then the stripe maxima and their parts'
 * (stripes_of, STRIPE_PARTS times that) or the flags of gather_between (n bytes). */
static inline int64_t scratch_size(int64_t n) {
    const int64_t maxima = stripes_of(n) * (1 + STRIPE_PARTS), flags = n / 4 + 1;
    return n + (maxima > flags ? maxima : flags);
}

/* The largest value of each stripe of the row, NaN skipped (-inf for a stripe without a
 * value), written to stripe_top[stripes_of(n)], and of each part of each stripe, written to part_top: the
 * STREAM_LANES maxima of part q of block b at (b * STRIPE_PARTS + q) * STREAM_LANES. */
IN_CLONE void stripe_maxima(const float *row, int64_t n, float *stripe_top, float *part_top) {
    float lanes[STREAM_LANES]; /* (a local array: written through part_top, the scan would store every step) */
    const int64_t part = STRIPE_BLOCK / STRIPE_PARTS;
    for (int64_t start = 0; start < n; start += STRIPE_BLOCK) {
        float *tops = stripe_top + start / STRIPE_BLOCK * STREAM_LANES;
        float *parts = part_top + start / STRIPE_BLOCK * STRIPE_PARTS * STREAM_LANES;
        for (int q = 0; q < STRIPE_PARTS; q++) {
            const int64_t from = start + q * part, to = from + part < n ? from + part : n;
            lane_maxima(row, from, to, lanes);
            memcpy(parts + q * STREAM_LANES, lanes, sizeof lanes);
        }
        for (int lane = 0; lane < STREAM_LANES; lane++) tops[lane] = parts[lane];
        for (int q = 1; q < STRIPE_PARTS; q++)
            for (int lane = 0; lane < STREAM_LANES; lane++) tops[lane] = larger(parts[q * STREAM_LANES + lane], tops[lane]);
    }
}

/* The k largest values of the row (weights or raw logits; NaN never enters), left in heap[0..k) (a
 * min-heap: heap[0] is the k-th largest). Chunks of CHUNK values none of which beats the k-th so far
 * (most of them, once the heap has filled) are skipped after one vectorised max. */
static inline void largest_k(const float *row, int64_t n, int64_t k, float *heap) {
    for (int64_t i = 0; i < k; i++) heap[i] = -INFINITY;
    int64_t i = 0;
    for (; i + CHUNK <= n; i += CHUNK) {
        if (!(chunk_max(row + i) > heap[0])) continue;
        for (int64_t j = i; j < i + CHUNK; j++) offer(row[j], k, heap);
    }
    for (; i < n; i++) offer(row[i], k, heap);
}

static int descending(const void *a, const void *b) {
    const float x = *(const float *)a, y = *(const float *)b;
    return (x < y) - (x > y);
}

/* Below this top_k, a heap of the k largest beats radix selection. */
#define HEAP_LIMIT 4096

/* The nucleus threshold of a top-k-truncated row from its k largest weights, sorted[0..k) in descending
 * order, where at_least of the row's weights are >= the k-th (more than k when values tie with it): the
 * smallest weight of the shortest prefix whose mass reaches top_p (within rtol) of the kept mass; the k-th
 * when only its ties beyond the k complete it. Sums in double, in a fixed order. */
static float nucleus_of_largest(const float *sorted, int64_t k, int64_t at_least, float top_p, double rtol) {
    const float kth = sorted[k - 1];
    double kept = (double)(at_least - k) * kth;
    for (int64_t i = k - 1; i >= 0; i--) kept += sorted[i];
    const double target = (double)top_p * kept * (1.0 - rtol);
    double acc = 0.0;
    for (int64_t i = 0; i < k; i++) {
        acc += sorted[i];
        if (acc >= target) return sorted[i];
    }
    return kth;
}

/* The kept-set threshold of one row: max(k-th largest, nucleus threshold on the top-k-renormalised row).
 * estimate: the row's weight within ESTIMATE_ERROR where its largest weight is 1 (its max logit finite),
 * else -1; a row without top-k then sifts for its nucleus (nucleus_sifted). */
CLONES static float row_threshold(const float *row, int64_t n, int64_t k, float top_p, double rtol, float *scratch,
                                  double estimate) {
    const int limited = k > 0 && k < n;
    if (!limited && top_p >= 1.0f) return 0.0f;
    if (!limited && estimate >= 0.5 && sifting)
        return nucleus_sifted(row, n, (double)top_p * (1.0 - rtol), estimate, scratch);
    if (limited && k <= HEAP_LIMIT) {
        largest_k(row, n, k, scratch);
        const float kth = scratch[0];
        if (top_p >= 1.0f) return kth;
        int64_t at_least = 0; /* more than k when values tie with the k-th beyond the heap */
        for (int64_t i = 0; i < n; i++) at_least += row[i] >= kth;
        qsort(scratch, (size_t)k, sizeof *scratch, descending);
        return nucleus_of_largest(scratch, k, at_least, top_p, rtol);
    }
    float threshold = limited ? kth_largest(row, n, k, scratch) : 0.0f;
    if (top_p < 1.0f) {
        const float nucleus = nucleus_threshold(row, n, threshold, (double)top_p * (1.0 - rtol), scratch);
        if (nucleus > threshold) threshold = nucleus;
    }
    return threshold;
}

/* exp(y) for y <= 0 in float32, within about 1 ulp, exact at 0 (exp(0) == 1) and without libm calls, so
 * that a loop over it vectorises: Cody-Waite reduction y = n ln2 + r, a degree-7 polynomial for e^r
 * (Cephes' expf) and 2^n written into the exponent bits, in two steps below 2^-126 so that subnormal
 * results come out as torch's exp gives them. From -104 down (and NaN) the result is 0; y above 88 is
 * clamped there. The reduction and the polynomial are exp_reduced's, shared with exp_normal. */
#define EXP_SHIFTER 12582912.0f /* 1.5 * 2^23: adding it rounds to an integer, kept in the low bits */

/* e^r of the reduction y = n ln2 + r, where shifted = y / ln2 + EXP_SHIFTER holds n in its low bits. */
IN_CLONE float exp_reduced(float y, float shifted) {
    const float n = shifted - EXP_SHIFTER;
    const float r = (y - n * 0.693359375f) - n * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    return p * r * r + r + 1.0f;
}

IN_CLONE float exp_nonpositive(float y) {
    y = y > -104.0f ? y : -104.0f;
    y = y < 88.0f ? y : 88.0f;
    const float shifted = y * 1.44269504088896341f + EXP_SHIFTER;
    const float p = exp_reduced(y, shifted);
    /* 2^n below the normal floats: 2^(n + 64) times 2^-64; at -104, 2^-150 times e^r < 1 rounds to 0 */
    const int subnormal = y < -87.0f;
    const uint32_t biased = bits_of(shifted) - bits_of(EXP_SHIFTER) + (subnormal ? 191u : 127u);
    return p * float_of(biased << 23) * (subnormal ? 5.42101086e-20f : 1.0f);
}

/* exp_nonpositive(y) for y in [-87, 0], bit for bit (there the clamps and the subnormal step change
 * nothing: a product with 1.0f is exact), in about two thirds of its operations. */
IN_CLONE float exp_normal(float y) {
    const float shifted = y * 1.44269504088896341f + EXP_SHIFTER;
    const float p = exp_reduced(y, shifted);
    return p * float_of((bits_of(shifted) - bits_of(EXP_SHIFTER) + 127u) << 23);
}

/* Values per step of the exp loops (exp_chunk). */
#define EXP_CHUNK 64

/* w[i] = exp_nonpositive((x[i] - top) * inverse) for the EXP_CHUNK values from x (w may be x), by
 * exp_normal where every y of the chunk is in [-87, 0] (the common case), else by exp_nonpositive. A
 * temperature of 1 (inverse 1) skips the product, which is exact. */
IN_CLONE void exp_chunk(const float *x, float top, float inverse, float *w) {
    int normal = 1;
    if (inverse == 1.0f)
        for (int i = 0; i < EXP_CHUNK; i++) w[i] = x[i] - top;
    else
        for (int i = 0; i < EXP_CHUNK; i++) w[i] = (x[i] - top) * inverse;
    for (int i = 0; i < EXP_CHUNK; i++) normal &= w[i] >= -87.0f && w[i] <= 0.0f;
    if (normal)
        for (int i = 0; i < EXP_CHUNK; i++) w[i] = exp_normal(w[i]);
    else
        for (int i = 0; i < EXP_CHUNK; i++) w[i] = exp_nonpositive(w[i]);
}

/* row[i] = exp_nonpositive((x[i] - top) * inverse) for the row's n values (row may be x), by exp_chunk;
 * returns their sum within ESTIMATE_ERROR (float lanes of ESTIMATE_RUN values each, added into double).
 * The values after the last chunk go through a loop of their own, as the whole row once did: the AVX-512
 * build vectorises its last 8 values in 256-bit registers, where GCC does not contract to FMA (-mavx512f
 * does not enable FMA there), so that they round unlike the scalar and 512-bit code; a sum in that loop
 * would make it scalar and change them. */
IN_CLONE double exp_row(const float *x, int64_t n, float top, float inverse, float *row) {
    double wide[16] = {0}, sum = 0.0;
    int64_t i = 0;
    while (i + EXP_CHUNK <= n) {
        float lanes[16] = {0};
        for (int step = 0; step < ESTIMATE_RUN * 16 / EXP_CHUNK && i + EXP_CHUNK <= n; step++, i += EXP_CHUNK) {
            exp_chunk(x + i, top, inverse, row + i);
            for (int v = 0; v < EXP_CHUNK; v += 16)
                for (int lane = 0; lane < 16; lane++) lanes[lane] += row[i + v + lane];
        }
        for (int lane = 0; lane < 16; lane++) wide[lane] += lanes[lane];
    }
    for (int64_t t = i; t < n; t++) row[t] = exp_nonpositive((x[t] - top) * inverse);
    for (; i < n; i++) sum += row[i];
    for (int lane = 0; lane < 16; lane++) sum += wide[lane];
    return sum;
}

/* The largest value of the row, NaN skipped (a comparison with NaN is false); -inf when there is none. */
IN_CLONE float row_max(const float *row, int64_t n) {
    float lanes[STREAM_LANES];
    lane_maxima(row, 0, n, lanes);
    return lanes_max(lanes);
}

/* The threads of the calling thread's team (1 without OpenMP). */
static inline int64_t team_size(void) {
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}

/* Part `part` of `parts` of a row's argmax scan: over its share of the row's blocks of STRIPE_BLOCK values
 * (in order), the largest value (*best, NaN skipped, -inf when none) and the start of the first block
 * that holds it (*from; 0 when none). */
IN_CLONE void largest_block(const float *row, int64_t n, int64_t part, int64_t parts, float *best, int64_t *from) {
    const int64_t blocks = (n + STRIPE_BLOCK - 1) / STRIPE_BLOCK;
    float lanes[STREAM_LANES];
    *best = -INFINITY;
    *from = 0;
    for (int64_t k = blocks * part / parts; k < blocks * (part + 1) / parts; k++) {
        const int64_t start = k * STRIPE_BLOCK;
        lane_maxima(row, start, start + STRIPE_BLOCK < n ? start + STRIPE_BLOCK : n, lanes);
        const float top = lanes_max(lanes);
        if (top > *best) {
            *best = top;
            *from = start;
        }
    }
}

/* The row's argmax from the largest_block results of its `parts` parts, met in order (the first part
 * holding the largest wins), then that block searched for its first occurrence; 0 when nothing beats -inf. */
static int64_t first_of_largest(const float *row, const float *best, const int64_t *from, int64_t parts) {
    float top = -INFINITY;
    int64_t at = 0;
    for (int64_t part = 0; part < parts; part++)
        if (best[part] > top) {
            top = best[part];
            at = from[part];
        }
    if (!(top > -INFINITY)) return 0;
    while (!(row[at] == top)) at++;
    return at;
}

/* Index of the row's largest value: lowest index on ties, NaN never wins, 0 when nothing beats -inf.
 * One streaming scan remembers the first block of STRIPE_BLOCK values that holds the largest; that block
 * alone (in cache) is then searched for its first occurrence. */
IN_CLONE int64_t row_argmax(const float *row, int64_t n) {
    float best;
    int64_t from;
    largest_block(row, n, 0, 1, &best, &from);
    return first_of_largest(row, &best, &from, 1);
}

/* Zero the weights below the threshold (and NaN) and write the sum of each block of `block` kept
 * weights: sixteen float lanes per block (vectorised), added in double. */
IN_CLONE void keep_at_least(float *row, int64_t n, float threshold, int64_t block, double *sums) {
    for (int64_t start = 0, b = 0; start < n; start += block, b++) {
        const int64_t end = start + block < n ? start + block : n;
        float lanes[16] = {0};
        int64_t i = start;
        for (; i + 15 < end; i += 16)
            for (int lane = 0; lane < 16; lane++) {
                const float kept = row[i + lane] >= threshold ? row[i + lane] : 0.0f;
                row[i + lane] = kept;
                lanes[lane] += kept;
            }
        double sum = 0.0;
        for (; i < end; i++) {
            row[i] = row[i] >= threshold ? row[i] : 0.0f;
            sum += row[i];
        }
        for (int lane = 0; lane < 16; lane++) sum += lanes[lane];
        sums[b] = sum;
    }
}

/* The larger of a kept-set threshold and the min-p ratio (min_p: NULL for none), which the largest weight
 * of 1 makes an absolute threshold. */
static inline float at_least_min_p(float threshold, const float *min_p, double rtol) {
    const float ratio = min_p ? (float)((double)*min_p * (1.0 - rtol)) : 0.0f;
    return ratio > threshold ? ratio : threshold;
}

/* One row's truncated weights (SPEC §2, not greedy), dense: row[i] = exp((x[i] - max x) / T) (the largest
 * exactly 1; a non-finite max counts as 0), zero below max(k-th largest, nucleus threshold on the
 * top-k-renormalised row, min_p) (min_p: NULL for none), and the sums of each block of `block` kept weights
 * written to sums[ceil(n / block)]. x may be row itself (converted in place of the weights); scratch:
 * scratch_size(n) floats. */
IN_CLONE void weigh_dense(const float *x, int64_t n, float temperature, int64_t k, float top_p, const float *min_p,
                               double rtol, int64_t block, float *row, float *scratch, double *sums) {
    const float largest = row_max(x, n), top = isfinite(largest) ? largest : 0.0f;
    const double estimate = exp_row(x, n, top, 1.0f / temperature, row);
    const float threshold = row_threshold(row, n, k, top_p, rtol, scratch, isfinite(largest) ? estimate : -1.0);
    keep_at_least(row, n, at_least_min_p(threshold, min_p, rtol), block, sums);
}

/* One output row r of weigh_rows (scratch: scratch_size(n) floats). */
IN_CLONE void weigh_row(const struct weigh_args *a, int64_t r, int64_t blocks, float *scratch) {
    const int64_t n = a->n, block = a->block, from = a->source ? a->source[r] : r;
    float *row = a->weights + r * n;
    double *sums = a->block_sums + r * blocks;
    if (from < 0) { /* a skipped row: its sums zeroed, its weights left as they were */
        memset(sums, 0, (size_t)blocks * sizeof *sums);
        return;
    }
    const float *x = float_row(a->logits, (int)a->dtype, from, n, row); /* converted in place of the weights */
    if (a->temperature[r] < a->greedy_below) {
        const int64_t best = row_argmax(x, n);
        memset(row, 0, (size_t)n * sizeof *row);
        memset(sums, 0, (size_t)blocks * sizeof *sums);
        row[best] = 1.0f;
        sums[best / block] = 1.0;
        return;
    }
    weigh_dense(x, n, a->temperature[r], a->top_k[r], a->top_p[r], a->min_p ? a->min_p + r : NULL, a->rtol, block, row,
                scratch, sums);
}

/* The truncated target weights of SPEC §2 from raw logits, one row at a time while it is in cache:
 * w = exp((x - max x) / T), the largest exactly 1 (a non-finite max counts as 0), then every weight below
 * max(k-th largest, nucleus threshold on the top-k-renormalised row, min_p) zeroed, and NaN ones.
 * Rows with temperature below greedy_below become one-hot at their argmax (lowest index on ties, NaN
 * never wins). top_k <= 0 or >= n: no limit; top_p >= 1: no nucleus; min_p may be NULL. Output row r
 * weighs logits row source[r] (r itself when source is NULL), and a negative source skips it: its block
 * sums are zeroed and its weights left as they were (the rows of a tree walk that has stopped). Writes the
 * weights and the sum of each block of kept weights (struct weigh_args). */
CLONES int64_t weigh_rows(const struct weigh_args *a) {
    const int64_t n = a->n, rows = a->rows, blocks = (n + a->block - 1) / a->block;
    int64_t weighed = rows, refused = 0; /* threads only where more than one row is weighed */
    if (a->source)
        for (int64_t r = weighed = 0; r < rows; r++) weighed += a->source[r] >= 0;
#pragma omp parallel if (weighed > 1 && weighed * n >= PARALLEL_WORK)
    {
    float *scratch = allocate((uint64_t)scratch_size(n) * sizeof *scratch, &refused);
#pragma omp for schedule(dynamic)
    for (int64_t r = 0; r < rows; r++)
        if (scratch) weigh_row(a, r, blocks, scratch);
    free(scratch);
    }
    return refused;
}

/* Index of the largest value of each row (struct argmax_args): lowest index on ties, NaN never wins (0 if
 * nothing beats -inf). */
CLONES int64_t argmax_rows(const struct argmax_args *a) {
    const int64_t n = a->n, rows = a->rows;
    const int dtype = (int)a->dtype;
    int64_t refused = 0;
#pragma omp parallel if (rows > 1 && rows * n >= PARALLEL_WORK)
    {
    float *buffer = dtype == FLOAT32 ? NULL : allocate((uint64_t)n * sizeof *buffer, &refused);
#pragma omp for schedule(dynamic)
    for (int64_t r = 0; r < rows; r++)
        if (dtype == FLOAT32 || buffer) a->out[r] = row_argmax(float_row(a->values, dtype, r, n, buffer), n);
    free(buffer);
    }
    return refused;
}

/* One row's scan: bit 1 of `flags` when it holds NaN (magnitude bits above +inf's) or +inf, bit 2 when
 * it holds a value other than -inf. Integer compares on the bit patterns of `bits`-bit elements,
 * or-reduced over the row (vectorised); plus_inf, minus_inf: the type's patterns of +inf and -inf. */
#define SCAN_ROW(bits, row, n, plus_inf, minus_inf)                                                   \
    do {                                                                                              \
        const uint##bits##_t plus = (plus_inf), minus = (minus_inf), sign = minus ^ plus;               \
        uint##bits##_t bad = 0, some = 0;                                                             \
        for (int64_t i = 0; i < (n); i++) {                                                           \
            const uint##bits##_t v = (row)[i];                                                        \
            bad |= (uint##bits##_t)(((v & (uint##bits##_t)~sign) > plus) | (v == plus));              \
            some |= (uint##bits##_t)(v != minus);                                                     \
        }                                                                                             \
        flags = (uint8_t)((bad ? 1 : 0) | (some ? 2 : 0));                                            \
    } while (0)

/* For each row of values in use (in_use[r] != 0; every row when in_use is NULL; struct scan_args):
 * flags[r] = 1 if it holds NaN or +inf, | 2 if it holds a value other than -inf; 0 for a row not in use.
 * One streaming pass over the rows in use, spread over threads. Allocates nothing: returns 0. */
CLONES int64_t scan_rows(const struct scan_args *a) {
    const void *values = a->values;
    const int64_t n = a->n, rows = a->rows;
#pragma omp parallel for schedule(static) if (rows > 1 && rows * n >= PARALLEL_WORK)
    for (int64_t r = 0; r < rows; r++) {
        uint8_t flags = 0;
        if (a->in_use && !a->in_use[r]) {
            a->flags[r] = 0;
            continue;
        }
        if (a->dtype == FLOAT32)
            SCAN_ROW(32, (const uint32_t *)values + r * n, n, 0x7f800000u, 0xff800000u);
        else if (a->dtype == BFLOAT16)
            SCAN_ROW(16, (const uint16_t *)values + r * n, n, 0x7f80u, 0xff80u);
        else
            SCAN_ROW(16, (const uint16_t *)values + r * n, n, 0x7c00u, 0xfc00u);
        a->flags[r] = flags;
    }
    return 0;
}

/* The block of a two-level inverse-CDF draw: the first block with positive sum whose cumulative sum
 * passes target (rounding falls back to the last positive one; -1 when none is positive); the sum of
 * the blocks before it goes to *before. */
static inline int64_t choose_block(const double *sums, int64_t blocks, double target, double *before) {
    int64_t last_positive = -1;
    double passed = 0.0, at_last = 0.0;
    for (int64_t b = 0; b < blocks; b++) {
        if (!(sums[b] > 0.0)) continue;
        if (passed + sums[b] > target) {
            *before = passed;
            return b;
        }
        last_positive = b;
        at_last = passed;
        passed += sums[b];
    }
    *before = at_last;
    return last_positive;
}

/* The residual weight of a token: max(0, w * scale - q). */
static inline float residual_term(float w, float q, float scale) {
    const float v = w * scale - q;
    return v > 0.0f ? v : 0.0f;
}

/* The first of count ascending ids that is >= i (count when none). */
static inline int64_t first_at_least(const int32_t *ids, int64_t count, int64_t i) {
    int64_t low = 0, high = count;
    while (low < high) {
        const int64_t mid = (low + high) / 2;
        if (ids[mid] < i)
            low = mid + 1;
        else
            high = mid;
    }
    return low;
}

/* The weight of token i in a row held densely (ids NULL: w[n]) or sparsely (count (id, weight) pairs, ids
 * ascending; 0 for a token not held). */
static inline float weight_at(const float *w, const int32_t *ids, int64_t count, int64_t i) {
    if (!ids) return w[i];
    const int64_t at = first_at_least(ids, count, i);
    return at < count && ids[at] == i ? w[at] : 0.0f;
}

/* The token a two-level inverse-CDF walk reaches with one uniform: the block whose cumulative sum passes
 * uniform * (the sum of the block sums), then the token inside it, by the terms the sums were made of:
 * w, or max(0, w * scale - q) where q is given; `excluded` (or none: -1) is passed over. Only a positive
 * term can be drawn (rounding falls back to the last one); 0 when no block is positive. The row is dense
 * (ids NULL: w and q [n]) or sparse (w and q [count] of the tokens ids[count], ascending; every other
 * token's term is 0), the same walk either way. */
static inline int64_t draw(const float *w, const int32_t *ids, int64_t count, const float *q, float scale,
                           int64_t excluded, int64_t n, int64_t block, const double *sums, double uniform) {
    const int64_t blocks = (n + block - 1) / block;
    double total = 0.0, before = 0.0;
    for (int64_t b = 0; b < blocks; b++) total += sums[b];
    const double target = uniform * total;
    const int64_t chosen = choose_block(sums, blocks, target, &before);
    if (chosen < 0) return 0;
    const int64_t start = chosen * block, end = start + block < n ? start + block : n;
    int64_t token = 0;
    double acc = before;
    for (int64_t j = ids ? first_at_least(ids, count, start) : start; j < (ids ? count : end); j++) {
        const int64_t i = ids ? ids[j] : j;
        if (i >= end) break;
        const float v = q ? residual_term(w[j], q[j], scale) : w[j];
        if (!(v > 0.0f) || i == excluded) continue;
        token = i;
        acc += v;
        if (acc > target) break;
    }
    return token;
}

/* Inverse-CDF draw per row from kept weights with one uniform (see draw; struct sample_args), the block
 * sums as weigh_rows writes them. Allocates nothing: returns 0. */
CLONES int64_t sample_rows(const struct sample_args *a) {
    const int64_t n = a->n, block = a->block, blocks = (n + block - 1) / block, rows = a->rows;
#pragma omp parallel for schedule(dynamic) if (rows > 1 && rows * block >= PARALLEL_WORK)
    for (int64_t r = 0; r < rows; r++)
        a->out[r] = draw(a->weights + r * n, NULL, 0, NULL, 1.0f, -1, n, block, a->block_sums + r * blocks, a->uniforms[r]);
    return 0;
}

/* Recovery modes of sampled verification, per position. */
enum { FROM_TARGET = 0, FROM_RESIDUAL = 1, WITHOUT_DRAFT = 2 };

/* Sum of the residual weights of each block of `block` tokens (sixteen float lanes, added in double).
 * Returns the total. */
static inline double residual_block_sums(const float *w, const float *q, int64_t n, float scale, int64_t block,
                                         double *sums) {
    double total = 0.0;
    for (int64_t start = 0, b = 0; start < n; start += block, b++) {
        const int64_t end = start + block < n ? start + block : n;
        float lanes[16] = {0};
        int64_t i = start;
        for (; i + 15 < end; i += 16)
            for (int lane = 0; lane < 16; lane++) lanes[lane] += residual_term(w[i + lane], q[i + lane], scale);
        double sum = 0.0;
        for (; i < end; i++) sum += residual_term(w[i], q[i], scale);
        for (int lane = 0; lane < 16; lane++) sum += lanes[lane];
        sums[b] = sum;
        total += sum;
    }
    return total;
}

/* The sums of each block of `block` tokens of a row held sparsely: count (id, value) pairs, ids ascending,
 * every other token 0; a pair's term is its value w, or max(0, w * scale - q) where q[count] is given.
 * The same float lanes and double additions, in the same order, as the dense sums of keep_at_least and
 * residual_block_sums (a token that is not held adds +0 to its lane there, which changes no sum), so the
 * sums are bit for bit those of the dense row. Writes sums[ceil(n / block)]; returns their total. */
static inline double kept_block_sums(const int32_t *ids, const float *w, const float *q, float scale, int64_t count, int64_t n,
                              int64_t block, double *sums) {
    const int64_t blocks = (n + block - 1) / block;
    double total = 0.0;
    for (int64_t b = 0, j = 0; b < blocks; b++) {
        const int64_t start = b * block, end = start + block < n ? start + block : n;
        const int64_t in_lanes = start + (end - start) / 16 * 16; /* tokens before it go to lanes */
        float lanes[16] = {0};
        double sum = 0.0;
        for (; j < count && ids[j] < end; j++) {
            const float term = q ? residual_term(w[j], q[j], scale) : w[j];
            if (ids[j] < in_lanes)
                lanes[(ids[j] - start) % 16] += term;
            else
                sum += term;
        }
        for (int lane = 0; lane < 16; lane++) sum += lanes[lane];
        sums[b] = sum;
        total += sum;
    }
    return total;
}

/* One position's recovery draw (see recover_rows) from its weights, dense (ids NULL: w and q [n]) or
 * sparse (w and q [count] at the tokens ids[count], ascending; the residual of a token not held is
 * max(0, -q) = 0), with their block sums weight_sums, their total mass, the draft token d and the
 * position's mode; sums: room for ceil(n / block) doubles. */
CLONES static int64_t recover(const float *w, const int32_t *ids, int64_t count, const float *q, const double *weight_sums,
                       double mass, int64_t d, int32_t mode, double uniform, int64_t n, int64_t block, double *sums) {
    const int64_t blocks = (n + block - 1) / block;
    const float scale = (float)(1.0 / mass);
    int use_q = mode == FROM_RESIDUAL;
    const int64_t excluded = mode == WITHOUT_DRAFT ? d : -1;
    double residual = 0.0;
    if (use_q)
        residual = ids ? kept_block_sums(ids, w, q, scale, count, n, block, sums)
                       : residual_block_sums(w, q, n, scale, block, sums);
    if (!(residual > 0.0)) {
        use_q = 0;
        memcpy(sums, weight_sums, (size_t)blocks * sizeof *sums);
        if (excluded >= 0) {
            const double left = sums[excluded / block] - weight_at(w, ids, count, excluded);
            sums[excluded / block] = left > 0.0 ? left : 0.0;
        }
    }
    return draw(w, ids, count, use_q ? q : NULL, scale, excluded, n, block, sums, uniform);
}

/* The recovery draw of sampled verification (SPEC §3.2) for each position, without materialising the
 * residual: token i with probability proportional to max(0, p~_i - q_i) where p~ = w / mass
 * (FROM_RESIDUAL; an all-zero residual falls back to p~), to p~ without the drafted token
 * (WITHOUT_DRAFT: q(d) == 0), or to p~ (FROM_TARGET: no draft). One uniform per position, inverse CDF in
 * two levels (draw). The weights of position j of request r are row r * weight_positions + j of the
 * weights and of their block sums (struct recover_args). */
CLONES int64_t recover_rows(const struct recover_args *a) {
    const int64_t n = a->n, block = a->block, blocks = (n + block - 1) / block, positions = a->positions;
    const int64_t rows = a->requests * positions;
    const int draft_dtype = (int)a->draft_dtype;
    int64_t refused = 0;
#pragma omp parallel if (rows > 1 && rows * n >= PARALLEL_WORK)
    {
    double *sums = allocate((uint64_t)blocks * sizeof *sums, &refused);
    float *buffer = draft_dtype == FLOAT32 ? NULL : allocate((uint64_t)n * sizeof *buffer, &refused);
    const int ready = sums && (draft_dtype == FLOAT32 || buffer);
#pragma omp for schedule(dynamic)
    for (int64_t r = 0; r < rows; r++) {
        if (!ready) continue;
        const int64_t weight_row = (r / positions) * a->weight_positions + r % positions;
        const float *w = a->weights + weight_row * n, *q = float_row(a->draft_probs, draft_dtype, r, n, buffer);
        a->out[r] = recover(w, NULL, 0, q, a->weight_sums + weight_row * blocks, a->mass[r], a->draft[r], a->mode[r],
                            a->uniforms[r], n, block, sums);
    }
    free(sums);
    free(buffer);
    }
    return refused;
}

/* Margin below the k-th largest scaled logit y = (x - max x) / T within which tokens stay candidates for
 * the kept set of a top-k row: exp_nonpositive is within a few ulp of exp (relative 1e-6 at most) where
 * y >= SPARSE_LOWEST, so a token more than this below the k-th in y weighs less than each of the k
 * largest, whatever the rounding. */
#define CANDIDATE_MARGIN 1e-3f
/* The k-th largest y from which a top-k row is weighed sparsely (below, subnormal weights: dense). */
#define SPARSE_LOWEST -80.0f

/* A thread's buffers for the rows of draw_rows, allocated once per call and thread (row_buffers_of). */
struct row_buffers {
    float *row;      /* [n]: the weights of a dense row no output holds */
    float *kept;     /* [n]: a short list's weights (first, a top-k row's listed logits) */
    float *scratch;  /* [scratch_size(n)]: heaps, stripe maxima, sorted candidates */
    int32_t *ids;    /* [n]: a short list's ids */
    double *sums;    /* [ceil(n / block)]: the block sums of a row no output holds */
};

/* Stage of weigh_kept, a greedy row: one-hot at its argmax, as a short list of one. */
IN_CLONE int64_t weigh_greedy(const float *x, int64_t n, int64_t block, int32_t *ids, float *kept, double *sums) {
    const int64_t best = row_argmax(x, n);
    memset(sums, 0, (size_t)((n + block - 1) / block) * sizeof *sums);
    sums[best / block] = 1.0;
    ids[0] = (int32_t)best;
    kept[0] = 1.0f;
    return 1;
}

/* How many of values[0..count) are >= bound (one vectorised pass; count < 2^31: a 32-bit tally fills twice
 * the lanes of a 64-bit one). */
IN_CLONE int64_t count_at_least(const float *values, int64_t count, float bound) {
    int32_t reached = 0;
    for (int64_t i = 0; i < count; i++) reached += values[i] >= bound;
    return reached;
}

/* Bisection steps of stripe_floor at most (each one count_at_least over the stripe maxima). */
#define FLOOR_STEPS 24

/* Stage of weigh_kept, a floor for the k-th largest logit of a top-k row from its stripe maxima
 * (stripe_top[stripes], largest `top`): a value that at least k stripe maxima reach, so at least k logits
 * (the k-th largest is >= it), and not many more (bisection until at most k + k / 8 + 1 do, or
 * FLOOR_STEPS); `lowest` itself where fewer than k maxima reach it. */
IN_CLONE float stripe_floor(const float *stripe_top, int64_t stripes, int64_t k, float top, float lowest) {
    float below = lowest > -FLT_MAX ? lowest : -FLT_MAX, above = top;
    if (count_at_least(stripe_top, stripes, below) < k) return below;
    if (count_at_least(stripe_top, stripes, above) >= k) return above;
    for (int step = 0; step < FLOOR_STEPS; step++) { /* count(>= below) >= k > count(>= above) */
        const float middle = below + (above - below) * 0.5f;
        if (!(middle > below && middle < above)) break;
        const int64_t reached = count_at_least(stripe_top, stripes, middle);
        if (reached < k) {
            above = middle;
            continue;
        }
        below = middle;
        if (reached <= k + k / 8 + 1) break;
    }
    return below;
}

/* The lanes whose flag (a byte, 0 or 1) is set among flags[STREAM_LANES], in order, into lanes; returns
 * how many (the set bits of mask_of_flags, walked). */
IN_CLONE int lanes_flagged(const uint8_t *flags, int *lanes) {
    int used = 0;
    for (uint64_t mask = mask_of_flags(flags); mask; mask &= mask - 1) lanes[used++] = __builtin_ctzll(mask);
    return used;
}

/* The tokens in [from, to) (rows of STREAM_LANES values from `from`, at most STRIPE_BLOCK / STRIPE_PARTS
 * values) at the given lanes whose y = (x - top) * inverse is >= lowest, appended in order to ids and
 * their logits to values from `count` on; returns the new count. At one lane, its rows in order; at more,
 * marked lane by lane in a bitmap of the part's rows (loops of fixed length: no mispredicted exits), then
 * listed row by row. */
IN_CLONE int64_t list_part(const float *x, int64_t from, int64_t to, const int *lanes, int used, float top,
                           float inverse, float lowest, int32_t *ids, float *values, int64_t count) {
    const int64_t rows = (to - from + STREAM_LANES - 1) / STREAM_LANES;
    if (used == 1) { /* one lane (most parts): its rows in order, appended without a branch */
        for (int64_t row = 0; row < rows; row++) {
            const int64_t i = from + row * STREAM_LANES + lanes[0], at = i < to ? i : to - 1;
            ids[count] = (int32_t)i;
            values[count] = x[at];
            count += i < to && (x[at] - top) * inverse >= lowest;
        }
        return count;
    }
    uint64_t marks[STRIPE_BLOCK / STRIPE_PARTS / STREAM_LANES] = {0};
    for (int u = 0; u < used; u++)
        for (int64_t row = 0; row < rows; row++) {
            const int64_t i = from + row * STREAM_LANES + lanes[u];
            marks[row] |= (uint64_t)(i < to && (x[i] - top) * inverse >= lowest) << lanes[u];
        }
    for (int64_t row = 0; row < rows; row++)
        for (uint64_t bits = marks[row]; bits; bits &= bits - 1) {
            const int64_t i = from + row * STREAM_LANES + __builtin_ctzll(bits);
            ids[count] = (int32_t)i;
            values[count++] = x[i];
        }
    return count;
}

/* Stage of weigh_kept, the candidates: the tokens whose y = (x - top) * inverse is >= lowest, listed in
 * order into ids (and their logits into values); returns how many. Block by block: a flag for each part
 * of each stripe whose maximum can hold one (part_top, stripe_maxima; one vectorised pass over the
 * block's STRIPE_PARTS * STREAM_LANES maxima), then part by part the values at the flagged lanes, row by
 * row. */
IN_CLONE int64_t list_candidates(const float *x, int64_t n, float top, float inverse, float lowest,
                                 const float *part_top, int32_t *ids, float *values) {
    const int64_t part = STRIPE_BLOCK / STRIPE_PARTS;
    int64_t count = 0;
    for (int64_t start = 0; start < n; start += STRIPE_BLOCK) {
        const float *tops = part_top + start / STRIPE_BLOCK * STRIPE_PARTS * STREAM_LANES;
        uint8_t reach[STRIPE_PARTS * STREAM_LANES];
        for (int i = 0; i < STRIPE_PARTS * STREAM_LANES; i++) reach[i] = (tops[i] - top) * inverse >= lowest;
        for (int q = 0; q < STRIPE_PARTS; q++) {
            int lanes[STREAM_LANES];
            const int used = lanes_flagged(reach + q * STREAM_LANES, lanes);
            const int64_t from = start + q * part, to = from + part < n ? from + part : n;
            if (used) count = list_part(x, from, to, lanes, used, top, inverse, lowest, ids, values, count);
        }
    }
    return count;
}

/* Stage of weigh_kept, the listed ids whose token's y = (x - top) * inverse is >= lowest, moved to the
 * front in order, their logits into values; returns how many. */
IN_CLONE int64_t keep_candidates(int32_t *ids, const float *x, int64_t count, float top, float inverse, float lowest,
                                 float *values) {
    int64_t held = 0;
    for (int64_t j = 0; j < count; j++) {
        const float value = x[ids[j]];
        ids[held] = ids[j];
        values[held] = value;
        held += (value - top) * inverse >= lowest;
    }
    return held;
}

/* The key of a float (not NaN) whose unsigned order is the floats' descending order (-0 after +0). */
static inline uint32_t descending_key(float value) {
    const uint32_t bits = bits_of(value);
    return bits & 0x80000000u ? bits : ~(bits | 0x80000000u);
}

static inline float float_of_descending_key(uint32_t key) {
    return float_of(key & 0x80000000u ? key : ~key & 0x7fffffffu);
}

/* Below this many values, sort_descending inserts them one by one (the radix passes cost more). */
#define INSERTION_SORT_LIMIT 32

/* values[0..count) (no NaN) sorted in descending order: a radix sort on the keys, a byte a pass, through
 * spare (room for count floats), the four bytes' counts taken in one pass and a byte that every key shares
 * passed over (the listed logits of a row lie close together: their top byte is mostly one); by insertion
 * below INSERTION_SORT_LIMIT values. */
static void sort_descending(float *values, int64_t count, float *spare) {
    if (count < INSERTION_SORT_LIMIT) {
        for (int64_t i = 1; i < count; i++) {
            const float value = values[i];
            int64_t at = i;
            for (; at > 0 && values[at - 1] < value; at--) values[at] = values[at - 1];
            values[at] = value;
        }
        return;
    }
    uint32_t *keys = (uint32_t *)values, *other = (uint32_t *)spare;
    int64_t start[4][256] = {{0}};
    for (int64_t i = 0; i < count; i++) {
        keys[i] = descending_key(values[i]);
        for (int digit = 0; digit < 4; digit++) start[digit][keys[i] >> 8 * digit & 255]++;
    }
    for (int digit = 0, shift = 0; digit < 4; digit++, shift += 8) {
        int64_t *at = start[digit];
        if (at[keys[0] >> shift & 255] == count) continue; /* one byte for all: the order stands */
        for (int64_t byte = 0, before = 0; byte < 256; byte++) {
            const int64_t here = at[byte];
            at[byte] = before;
            before += here;
        }
        for (int64_t i = 0; i < count; i++) other[at[keys[i] >> shift & 255]++] = keys[i];
        uint32_t *swap = keys;
        keys = other;
        other = swap;
    }
    for (int64_t i = 0; i < count; i++) values[i] = float_of_descending_key(keys[i]); /* (keys may be spare) */
}

/* Stage of weigh_kept, the kept-set threshold of a top-k row from its candidates' weights sorted[count]
 * in descending order (the k largest among them): the k-th, the nucleus on the top-k-renormalised row,
 * min_p (NULL: none), as the dense path computes them. */
IN_CLONE float candidates_threshold(const float *sorted, int64_t count, int64_t k, float top_p, const float *min_p,
                                    double rtol) {
    float threshold = sorted[k - 1];
    if (top_p < 1.0f) {
        int64_t at_least = k;
        while (at_least < count && sorted[at_least] >= threshold) at_least++;
        threshold = nucleus_of_largest(sorted, k, at_least, top_p, rtol);
    }
    if (min_p) {
        const float ratio = (float)((double)*min_p * (1.0 - rtol));
        if (ratio > threshold) threshold = ratio;
    }
    return threshold;
}

/* Stage of weigh_kept, the kept set: the listed (id, weight) pairs at or above the threshold, moved to the
 * front in order; returns how many. */
static inline int64_t keep_listed(int32_t *ids, float *kept, int64_t count, float threshold) {
    int64_t held = 0;
    for (int64_t j = 0; j < count; j++)
        if (kept[j] >= threshold) {
            ids[held] = ids[j];
            kept[held++] = kept[j];
        }
    return held;
}

/* One top-k row (0 < k < n) weighed sparsely, or -1 where it cannot be: its k-th largest raw logit (exp
 * is monotone, so the k largest logits are the tokens of the k largest weights) among the tokens at or
 * above a floor of it (stripe_floor, list_candidates), the candidates within CANDIDATE_MARGIN of the k-th
 * in y (they hold every weight >= the k-th), only they exponentiated,
 * the threshold and the kept set from them exactly as the dense path computes them from the whole row.
 * -1 where the k-th weight is below e^SPARSE_LOWEST, the row has no finite value, or more than capacity
 * tokens are kept. Otherwise the kept set in ids / kept (ascending ids) and its block sums in sums. */
IN_CLONE int64_t weigh_top_k(const float *x, int64_t n, float temperature, int64_t k, float top_p, const float *min_p,
                             double rtol, int64_t block, int64_t capacity, struct row_buffers *buffers, double *sums) {
    const int64_t stripes = stripes_of(n);
    float *scratch = buffers->scratch, *kept = buffers->kept, *stripe_top = scratch + n, *part_top = stripe_top + stripes;
    int32_t *ids = buffers->ids;
    stripe_maxima(x, n, stripe_top, part_top);
    const float top = row_max(stripe_top, stripes), inverse = 1.0f / temperature;
    if (!isfinite(top)) return -1;
    /* the tokens at or above a floor (less the margin): where the k-th logit reaches the floor, they hold
     * the k-th and every candidate; where it does not (fewer than k logits reach it), the dense path */
    const float floor_logit = stripe_floor(stripe_top, stripes, k, top, top + SPARSE_LOWEST * temperature);
    const float floor_y = (floor_logit - top) * inverse;
    int64_t count = list_candidates(x, n, top, inverse, floor_y - CANDIDATE_MARGIN, part_top, ids, kept);
    if (count < k) return -1;
    sort_descending(kept, count, scratch); /* the listed logits, largest first (the maxima no longer needed) */
    const float kth_y = (kept[k - 1] - top) * inverse, lowest = kth_y - CANDIDATE_MARGIN;
    if (!(kth_y >= SPARSE_LOWEST && kth_y >= floor_y)) return -1;
    /* the candidates' weights in descending order: the sorted list's first entries (y is monotone in x) */
    float *sorted = scratch;
    for (int64_t j = 0; j < count && (kept[j] - top) * inverse >= lowest; j++)
        sorted[j] = exp_nonpositive((kept[j] - top) * inverse);
    count = keep_candidates(ids, x, count, top, inverse, lowest, kept);
    for (int64_t j = 0; j < count; j++) kept[j] = exp_nonpositive((kept[j] - top) * inverse);
    const float threshold = candidates_threshold(sorted, count, k, top_p, min_p, rtol);
    const int64_t held = keep_listed(ids, kept, count, threshold);
    if (held > capacity) return -1;
    kept_block_sums(ids, kept, NULL, 1.0f, held, n, block, sums);
    return held;
}

/* One row's truncated weights as weigh_rows makes them, held sparsely where that can be done without a
 * pass of exp over the row: a greedy row is one-hot at its argmax (weigh_greedy), a row with
 * 0 < k <= HEAP_LIMIT is weighed from its k largest logits (weigh_top_k). Request b's rules (struct
 * chain_rows). Returns the number of tokens kept, their ids (ascending) in buffers->ids and weights in
 * buffers->kept (at most `capacity`), or -1 where the row was weighed densely into row[n] (weigh_dense;
 * x may be row). Writes the block sums to sums[ceil(n / block)], bit for bit those of the dense row. */
CLONES static int64_t weigh_kept(const float *x, const struct chain_rows *rules, int64_t b, int64_t capacity, float *row,
                                 struct row_buffers *buffers, double *sums) {
    const int64_t n = rules->n, block = rules->block, k = rules->top_k[b];
    const float temperature = rules->temperature[b], top_p = rules->top_p[b];
    const float *min_p = rules->min_p ? rules->min_p + b : NULL;
    if (temperature < rules->greedy_below) return weigh_greedy(x, n, block, buffers->ids, buffers->kept, sums);
    if (k > 0 && k < n && k <= HEAP_LIMIT && k <= capacity) {
        const int64_t held = weigh_top_k(x, n, temperature, k, top_p, min_p, rules->rtol, block, capacity, buffers, sums);
        if (held >= 0) return held;
    }
    weigh_dense(x, n, temperature, k, top_p, min_p, rules->rtol, block, row, buffers->scratch, sums);
    return -1;
}

/* The sum of exp_nonpositive((x[i] - top) * inverse) over [start, end) as keep_at_least sums a block of
 * weights: sixteen float lanes, the tail in double, then the lanes. A step of EXP_CHUNK values whose y
 * are all in [-87, 0] is weighed by exp_normal (as exp_chunk does, without storing the weights). */
IN_CLONE double exp_block_sum(const float *x, int64_t start, int64_t end, float top, float inverse) {
    float lanes[16] = {0}, y[EXP_CHUNK];
    int64_t i = start;
    for (; i + EXP_CHUNK <= end; i += EXP_CHUNK) {
        int normal = 1;
        for (int j = 0; j < EXP_CHUNK; j++) y[j] = (x[i + j] - top) * inverse;
        for (int j = 0; j < EXP_CHUNK; j++) normal &= y[j] >= -87.0f && y[j] <= 0.0f;
        if (normal)
            for (int v = 0; v < EXP_CHUNK; v += 16)
                for (int lane = 0; lane < 16; lane++) lanes[lane] += exp_normal(y[v + lane]);
        else
            for (int v = 0; v < EXP_CHUNK; v += 16)
                for (int lane = 0; lane < 16; lane++) lanes[lane] += exp_nonpositive(y[v + lane]);
    }
    for (; i + 15 < end; i += 16)
        for (int lane = 0; lane < 16; lane++) lanes[lane] += exp_nonpositive((x[i + lane] - top) * inverse);
    double sum = 0.0;
    for (; i < end; i++) sum += exp_nonpositive((x[i] - top) * inverse);
    for (int lane = 0; lane < 16; lane++) sum += lanes[lane];
    return sum;
}

/* The block sums of the blocks in [start, end) (start a multiple of block) of an untruncated row's
 * weights w = exp((x - top) / T) (exp_block_sum, as keep_at_least sums them), without writing them out. */
IN_CLONE void untruncated_sums(const float *x, int64_t n, int64_t start, int64_t end, float top, float inverse,
                               int64_t block, double *sums) {
    for (int64_t from = start; from < end; from += block)
        sums[from / block] = exp_block_sum(x, from, from + block < n ? from + block : n, top, inverse);
}

/* The token draw gives on an untruncated row from its block sums (untruncated_sums): the weights of the
 * one block the draw lands in written to row (x may be row), then draw. */
IN_CLONE int64_t draw_from_sums(const float *x, int64_t n, float top, float inverse, int64_t block, double uniform,
                                float *row, const double *sums) {
    const int64_t blocks = (n + block - 1) / block;
    double total = 0.0, before;
    for (int64_t b = 0; b < blocks; b++) total += sums[b];
    const int64_t chosen = choose_block(sums, blocks, uniform * total, &before);
    if (chosen >= 0)
        for (int64_t i = chosen * block, end = i + block < n ? i + block : n; i < end; i++)
            row[i] = exp_nonpositive((x[i] - top) * inverse);
    return draw(row, NULL, 0, NULL, 1.0f, -1, n, block, sums, uniform);
}

/* The draw of an untruncated row (temperature only: no top-k, top-p or min-p; not greedy) without writing
 * its weights out: the block sums of w = exp((x - max) / T), as weigh_dense and keep_at_least make them,
 * in one pass over the logits (untruncated_sums), then draw_from_sums; returns the token draw gives on the
 * whole row. sums: ceil(n / block) doubles. */
IN_CLONE int64_t draw_untruncated(const float *x, int64_t n, float temperature, int64_t block, double uniform,
                                  float *row, double *sums) {
    float top = row_max(x, n);
    top = isfinite(top) ? top : 0.0f;
    untruncated_sums(x, n, 0, n, top, 1.0f / temperature, block, sums);
    return draw_from_sums(x, n, top, 1.0f / temperature, block, uniform, row, sums);
}

/* SplitMix64's finaliser (rng.mix64). */
static inline uint64_t mix64(uint64_t x) {
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

/* rng.keyed_uniform of one key with a stream's salt (rng.stream_salt): 53 bits of mix64(mix64(key) ^ salt)
 * as a double in [0, 1), bit for bit. */
static inline double keyed_uniform(uint64_t key, uint64_t salt) {
    return (double)(mix64(mix64(key) ^ salt) >> 11) * 0x1p-53;
}

/* Element i of row r of an [rows, n] matrix of `dtype` elements, as float32 (exactly). */
static inline float element_of(const void *matrix, int dtype, int64_t r, int64_t n, int64_t i) {
    if (dtype == FLOAT32) return ((const float *)matrix)[r * n + i];
    const uint16_t bits = ((const uint16_t *)matrix)[r * n + i];
    return dtype == BFLOAT16 ? float_of((uint32_t)bits << 16) : half_to_float(bits);
}

/* The key base s_b of request b (SPEC §4; struct request_keys): seeds[b * seeds_step] (0 where seeds is
 * NULL) + offset + b * row_stride, mod 2^64. Per-request seeds: seeds_step 1, offset and row_stride 0; one
 * seed shared by the batch: seeds_step 0 (or seeds NULL and the seed as the offset) and row_stride
 * ROW_STRIDE. */
static inline uint64_t request_seed(const struct request_keys *keys, int64_t b) {
    return (keys->seeds ? (uint64_t)keys->seeds[b * keys->seeds_step] : 0u) + keys->offset + (uint64_t)b * keys->row_stride;
}

/* The argmax-mode verdicts of `requests` requests (SPEC §3.1, §3.3) from their draws at the drafted
 * positions, tokens [requests, stride] (stride per_position, or per_position - 1 where the bonus draws lie
 * apart): request b accepts its drafts proposed[b, j] (as given: an id outside [0, n) and every position
 * after it is padding, never accepted) while they equal y_bj; first[b] is the first position not accepted
 * (per_position - 1 when all are). */
static void first_rejections(const int64_t *proposed, const int64_t *tokens, int64_t stride, int64_t requests,
                             int64_t per_position, int64_t n, int64_t *first) {
    const int64_t drafted = per_position - 1;
    for (int64_t b = 0; b < requests; b++) {
        int64_t j = 0;
        for (; j < drafted; j++) {
            const int64_t d = proposed[b * drafted + j];
            if (d < 0 || d >= n || d != tokens[b * stride + j]) break;
        }
        first[b] = j;
    }
}

/* Where the draw of row r of draw_rows goes: tokens[r], or where the bonus draws lie apart (a->bonus),
 * bonus[b] for the last position of request b and tokens[b, j] of [requests, per_position - 1] before it. */
static inline int64_t *draw_slot(const struct draw_args *a, int64_t r) {
    const int64_t per_position = a->rows.per_position, b = r / per_position, j = r % per_position;
    if (!a->bonus) return a->tokens + r;
    return j == per_position - 1 ? a->bonus + b : a->tokens + b * (per_position - 1) + j;
}

/* A thread's row_buffers for rows of n values in blocks (all NULL where one was refused: the refusal is
 * in *refused). */
static struct row_buffers row_buffers_of(int64_t n, int64_t blocks, int64_t *refused) {
    struct row_buffers buffers = {
        .row = allocate((uint64_t)n * sizeof(float), refused),
        .kept = allocate((uint64_t)n * sizeof(float), refused),
        .scratch = allocate((uint64_t)scratch_size(n) * sizeof(float), refused),
        .ids = allocate((uint64_t)n * sizeof(int32_t), refused),
        .sums = allocate((uint64_t)blocks * sizeof(double), refused),
    };
    return buffers;
}

static int row_buffers_ready(const struct row_buffers *buffers) {
    return buffers->row && buffers->kept && buffers->scratch && buffers->ids && buffers->sums;
}

static void free_row_buffers(struct row_buffers *buffers) {
    free(buffers->row);
    free(buffers->kept);
    free(buffers->scratch);
    free(buffers->ids);
    free(buffers->sums);
}

/* Whether request b's rows keep every token (temperature only: no top-k, top-p or min-p). */
static inline int untruncated(const struct chain_rows *rules, int64_t b) {
    const int64_t k = rules->top_k[b];
    return (k <= 0 || k >= rules->n) && rules->top_p[b] >= 1.0f && (!rules->min_p || rules->min_p[b] <= 0.0f);
}

/* Stage of draw_row, the hand-over of a drafted position of sampled mode: the weight of its draft token
 * (0 where none), the ratio test's uniform (key s_b + j, accept_salt) and the kept weights, a short list
 * (count >= 0) copied to the row's place in a->kept, or a dense row already there (count -1). */
static inline void hand_over(const struct draw_args *a, int64_t r, int64_t position, uint64_t key, int64_t count,
                             const float *w, const int32_t *held) {
    const int64_t d = a->draft[position], n = a->rows.n, capacity = a->kept.capacity;
    a->at_draft[position] = d >= 0 && d < n ? weight_at(w, held, count, d) : 0.0f;
    a->accept_uniforms[position] = keyed_uniform(key, a->accept_salt);
    a->kept.count[r] = count;
    if (count < 0) return;
    memcpy(a->kept.ids + r * capacity, held, (size_t)count * sizeof *held);
    memcpy(a->kept.weights + r * capacity, w, (size_t)count * sizeof *w);
}

/* The key of row r = b * per_position + j of a chain call: s_b + j (request_seed). */
static inline uint64_t row_key(const struct draw_args *a, int64_t r) {
    return request_seed(&a->keys, r / a->rows.per_position) + (uint64_t)(r % a->rows.per_position);
}

/* Whether row r's weights go to sampled mode's recovery draw (a drafted position's row). */
static inline int recovers_row(const struct draw_args *a, int64_t r) {
    return a->draft && r % a->rows.per_position < a->rows.per_position - 1;
}

/* Where row r's dense weights go: the recovery's row of a->kept.dense, else `own` (a thread's buffer). */
static inline float *weights_of_row(const struct draw_args *a, int64_t r, float *own) {
    return recovers_row(a, r) ? a->kept.dense + r * a->rows.n : own;
}

/* Where row r's block sums go: sampled mode's a->kept.block_sums, else `own` (a thread's buffer). */
static inline double *sums_of_row(const struct draw_args *a, int64_t r, double *own) {
    const int64_t blocks = (a->rows.n + a->rows.block - 1) / a->rows.block;
    return a->draft ? a->kept.block_sums + r * blocks : own;
}

/* Whether row r is drawn by draw_untruncated: temperature only, not greedy, not handed over. */
static inline int drawn_untruncated(const struct draw_args *a, int64_t r) {
    const int64_t b = r / a->rows.per_position;
    return !recovers_row(a, r) && untruncated(&a->rows, b) && !(a->rows.temperature[b] < a->rows.greedy_below);
}

/* Stage of draw_row: the draw from row r's kept weights (a short list of count (held, w), or the dense row
 * w where count is -1) with the keyed uniform of s_b + j, then the hand-over of sampled mode's drafted
 * positions (hand_over). */
IN_CLONE void finish_row(const struct draw_args *a, int64_t r, int64_t count, const float *w, const int32_t *held,
                         const double *sums) {
    const struct chain_rows *rules = &a->rows;
    const uint64_t key = row_key(a, r);
    *draw_slot(a, r) = draw(w, held, count, NULL, 1.0f, -1, rules->n, rules->block, sums, keyed_uniform(key, a->salt));
    const int64_t b = r / rules->per_position, j = r % rules->per_position;
    if (recovers_row(a, r)) hand_over(a, r, b * (rules->per_position - 1) + j, key, count, w, held);
}

/* One row r = b * per_position + j of draw_rows, in stages: its logits as float32; weigh (temperature only
 * and not handed on: the block sums alone, draw_untruncated; else weigh_kept, sparse where it can); draw
 * and hand over (finish_row). */
IN_CLONE void draw_row(const struct draw_args *a, int64_t r, struct row_buffers *buffers) {
    const struct chain_rows *rules = &a->rows;
    const int64_t n = rules->n, b = r / rules->per_position;
    float *row = weights_of_row(a, r, buffers->row);
    double *sums = sums_of_row(a, r, buffers->sums);
    const float *x = float_row(rules->logits, (int)rules->dtype, r, n, row); /* converted in place of the weights */
    if (drawn_untruncated(a, r)) {
        const double uniform = keyed_uniform(row_key(a, r), a->salt);
        *draw_slot(a, r) = draw_untruncated(x, n, rules->temperature[b], rules->block, uniform, row, sums);
        return;
    }
    const int64_t count = weigh_kept(x, rules, b, a->kept.capacity, row, buffers, sums);
    finish_row(a, r, count, count < 0 ? row : buffers->kept, count < 0 ? NULL : buffers->ids, sums);
}

/* Whether row r of a chain call is greedy (its request's temperature below greedy_below). */
static inline int greedy_row(const struct chain_rows *rules, int64_t r) {
    return rules->temperature[r / rules->per_position] < rules->greedy_below;
}

/* At most this many (row, part) tasks of split_greedy_rows. */
#define SPLIT_TASKS 256

/* Parts to split each greedy row of an argmax-mode draw_rows call into (1: not split): one a thread, where
 * few float32 rows would leave the team unevenly loaded (5 rows on 2 threads: one thread argmaxes 3). */
static int64_t greedy_parts(const struct draw_args *a, int64_t rows) {
    const int64_t team = team_size();
    const int few = team > 1 && rows < 4 * team && rows * team <= SPLIT_TASKS && rows * a->rows.n >= PARALLEL_WORK;
    if (!few || a->draft != NULL || a->rows.dtype != FLOAT32) return 1;
    for (int64_t r = 0; r < rows; r += a->rows.per_position)
        if (greedy_row(&a->rows, r)) return team;
    return 1;
}

/* The tokens of the greedy rows of draw_rows (its argmax mode, float32 logits), each row's argmax scan
 * split into `parts` tasks (largest_block) met by first_of_largest: row_argmax's token. Run by every
 * thread of draw_rows' team; best, from: room for rows * parts results. */
IN_CLONE void split_greedy_rows(const struct draw_args *a, int64_t rows, int64_t parts, float *best, int64_t *from) {
    const struct chain_rows *rules = &a->rows;
    const int64_t n = rules->n;
#pragma omp for schedule(static)
    for (int64_t t = 0; t < rows * parts; t++)
        if (greedy_row(rules, t / parts))
            largest_block((const float *)rules->logits + t / parts * n, n, t % parts, parts, best + t, from + t);
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; r++)
        if (greedy_row(rules, r))
            *draw_slot(a, r) =
                first_of_largest((const float *)rules->logits + r * n, best + r * parts, from + r * parts, parts);
}

/* ---- The last rows of a call with few rows, each weighed by the whole team (team_rows): the five rows of
 * a B = 1, K = 4 call would leave one of two threads three rows; instead each thread weighs two and half of
 * the fifth. A part is a share of the row's blocks (part_of_row); its max, exp, nucleus search and block
 * sums run on every part at once, met at barriers where a stage needs the whole row's result (team_wait);
 * part 0 resolves the search and draws. The tokens and hand-overs are draw_row's, bit for bit: the parts'
 * running maxima met lane by lane in row order are lane_maxima's; the weights are elementwise, each part
 * starting at a multiple of the block (a multiple of EXP_CHUNK), the last ending where the row does; the
 * block sums are summed block by block as before; the threshold is nucleus_sifted's (its estimates only
 * steer the search, and its certificate holds for sums of the same terms in any order) or
 * nucleus_threshold's. ---- */

/* At most this many threads weigh one row together. */
#define TEAM_PARTS 8

/* What the team's threads share while they weigh a row together; each part writes its own entries. */
struct team_row {
    float *row;                            /* [n]: part 0's row buffer (a row no output holds) */
    double *sums;                          /* [ceil(n / block)]: part 0's block sums buffer (likewise) */
    int ready[TEAM_PARTS];                 /* whether each part's buffers were allocated */
    float lanes[TEAM_PARTS][STREAM_LANES]; /* each part's running maxima (lane_maxima) */
    double estimate[TEAM_PARTS];           /* each part's estimated weight (exp_row) */
    double weight[2][TEAM_PARTS][CUTS];    /* each part's estimates at a pass's cuts, by the pass's parity */
    const float *listed[TEAM_PARTS];       /* each part's values in the search's last bracket (its scratch) */
    int64_t count[TEAM_PARTS];             /* how many */
    double listed_sums[TEAM_PARTS][2];     /* each part's list_bracket sums */
    float threshold;                       /* the kept set's threshold, from part 0 */
};

/* Test hooks of the team's rows (tests/kernels/test_native_team.py): whether a call's last rows may be
 * weighed by the team (1, the default) or each by one thread (0); how many rows the team weighed, read and
 * reset. */
static int64_t teaming = 1, team_weighed = 0;

void specverify_team(int64_t on) {
    teaming = on;
}

int64_t specverify_team_rows(void) {
    return __atomic_exchange_n(&team_weighed, 0, __ATOMIC_RELAXED);
}

/* Every thread of the team waits here for the others (a team of one goes on). */
static inline void team_wait(void) {
#pragma omp barrier
}

/* This thread's part and the team's parts (0 and 1 without OpenMP). */
static inline int64_t team_part(void) {
#ifdef _OPENMP
    return omp_get_thread_num();
#else
    return 0;
#endif
}

static inline int64_t team_parts(void) {
#ifdef _OPENMP
    return omp_get_num_threads();
#else
    return 1;
#endif
}

/* Part `part` of `parts` of a row of n values: [*start, *end), whole blocks of `block`. */
static inline void part_of_row(int64_t n, int64_t block, int64_t part, int64_t parts, int64_t *start, int64_t *end) {
    const int64_t blocks = (n + block - 1) / block, stop = blocks * (part + 1) / parts * block;
    *start = blocks * part / parts * block;
    *end = stop < n ? stop : n;
}

/* The row's largest value, row_max's: each part's running maxima (lane_maxima), met lane by lane in row
 * order. */
IN_CLONE float team_max(const float *x, int64_t start, int64_t end, int64_t part, int64_t parts, struct team_row *t) {
    lane_maxima(x, start, end, t->lanes[part]);
    team_wait();
    float lanes[STREAM_LANES];
    memcpy(lanes, t->lanes[0], sizeof lanes);
    for (int64_t p = 1; p < parts; p++)
        for (int lane = 0; lane < STREAM_LANES; lane++) lanes[lane] = larger(t->lanes[p][lane], lanes[lane]);
    return lanes_max(lanes);
}

/* Part 0's stage of team_nucleus: the parts' values in the last bracket joined in row order into its
 * scratch and their sums added, then sift_certified; nucleus_threshold's threshold where that is not
 * certain. */
static inline float team_resolve(const struct sift_bracket *s, const float *row, int64_t n, double top_p,
                                 int64_t parts, float *scratch, const struct team_row *t) {
    double sums[2] = {0.0, 0.0};
    int64_t count = 0;
    for (int64_t p = 0; p < parts; p++) {
        memmove(scratch + count, t->listed[p], (size_t)t->count[p] * sizeof *scratch);
        count += t->count[p];
        sums[0] += t->listed_sums[p][0];
        sums[1] += t->listed_sums[p][1];
    }
    const float threshold = sift_certified(s, n, top_p, scratch, count, sums);
    if (threshold >= 0.0f) return threshold;
    __atomic_fetch_add(&sift_fallbacks, 1, __ATOMIC_RELAXED);
    return nucleus_threshold(row, n, 0.0f, top_p, scratch);
}

/* nucleus_sifted's threshold of the row of n weights: each pass's estimates summed over the parts, the
 * last bracket's values listed by each part (list_bracket), joined and resolved by part 0
 * (sift_certified), nucleus_threshold's where that is not certain. Every part returns it. */
IN_CLONE float team_nucleus(const float *row, int64_t n, int64_t start, int64_t end, double top_p, double estimate,
                            int64_t part, int64_t parts, float *scratch, struct team_row *t) {
    struct sift_bracket s = sift_start(n, top_p, estimate);
    for (int pass = 0; pass < SIFT_PASSES && sift_open(&s); pass++) {
        float cut[CUTS];
        double weight[CUTS] = {0};
        const int cuts = sift_cuts(&s, pass > 0, cut);
        estimate_at(row + start, end - start, cuts, cut, t->weight[pass & 1][part]);
        team_wait();
        for (int64_t p = 0; p < parts; p++)
            for (int j = 0; j < cuts; j++) weight[j] += t->weight[pass & 1][p][j];
        sift_update(&s, cuts, cut, weight);
    }
    t->listed[part] = scratch;
    t->count[part] = list_bracket(row + start, end - start, float_of(s.low), float_of(s.high), scratch, t->listed_sums[part]);
    team_wait();
    if (part == 0) t->threshold = team_resolve(&s, row, n, top_p, parts, scratch, t);
    team_wait();
    return t->threshold;
}

/* row_threshold's threshold of a row without top-k (0 without a nucleus; nucleus_sifted's where its largest
 * weight is 1, by team_nucleus; else nucleus_threshold's, part 0's), then min-p's (at_least_min_p). */
IN_CLONE float team_threshold(const float *row, int64_t n, int64_t start, int64_t end, float top_p, const float *min_p,
                              double rtol, double estimate, int64_t part, int64_t parts, float *scratch,
                              struct team_row *t) {
    float threshold = 0.0f;
    if (top_p < 1.0f && estimate >= 0.5 && sifting) {
        threshold = team_nucleus(row, n, start, end, (double)top_p * (1.0 - rtol), estimate, part, parts, scratch, t);
    } else if (top_p < 1.0f) {
        if (part == 0) t->threshold = nucleus_threshold(row, n, 0.0f, (double)top_p * (1.0 - rtol), scratch);
        team_wait();
        threshold = t->threshold;
    }
    return at_least_min_p(threshold, min_p, rtol);
}

/* Row r of draw_rows (float32, no top-k) weighed densely by the team, weigh_dense's weights and block sums
 * (each part its share: team_max, exp_row, team_threshold, keep_at_least), then drawn and handed over by
 * part 0 (finish_row). scratch: the thread's (scratch_size(n)). */
IN_CLONE void team_dense_row(const struct draw_args *a, int64_t r, int64_t part, int64_t parts, float *scratch,
                             struct team_row *t) {
    const struct chain_rows *rules = &a->rows;
    const int64_t n = rules->n, block = rules->block, b = r / rules->per_position;
    const float *x = (const float *)rules->logits + r * n, *min_p = rules->min_p ? rules->min_p + b : NULL;
    float *row = weights_of_row(a, r, t->row);
    double *sums = sums_of_row(a, r, t->sums);
    int64_t start, end;
    part_of_row(n, block, part, parts, &start, &end);
    const float largest = team_max(x, start, end, part, parts, t), top = isfinite(largest) ? largest : 0.0f;
    t->estimate[part] = exp_row(x + start, end - start, top, 1.0f / rules->temperature[b], row + start);
    team_wait();
    double estimate = 0.0;
    for (int64_t p = 0; p < parts; p++) estimate += t->estimate[p];
    const float threshold = team_threshold(row, n, start, end, rules->top_p[b], min_p, rules->rtol,
                                           isfinite(largest) ? estimate : -1.0, part, parts, scratch, t);
    keep_at_least(row + start, end - start, threshold, block, sums + start / block);
    team_wait();
    if (part == 0) finish_row(a, r, -1, row, NULL, sums);
}

/* Row r of draw_rows drawn untruncated by the team (draw_untruncated's token): each part the block sums
 * of its share (untruncated_sums), part 0 the draw (draw_from_sums). */
IN_CLONE void team_untruncated_row(const struct draw_args *a, int64_t r, int64_t part, int64_t parts,
                                   struct team_row *t) {
    const struct chain_rows *rules = &a->rows;
    const int64_t n = rules->n, block = rules->block, b = r / rules->per_position;
    const float *x = (const float *)rules->logits + r * n, inverse = 1.0f / rules->temperature[b];
    double *sums = sums_of_row(a, r, t->sums);
    int64_t start, end;
    part_of_row(n, block, part, parts, &start, &end);
    float top = team_max(x, start, end, part, parts, t);
    top = isfinite(top) ? top : 0.0f;
    untruncated_sums(x, n, start, end, top, inverse, block, sums);
    team_wait();
    if (part == 0)
        *draw_slot(a, r) = draw_from_sums(x, n, top, inverse, block, keyed_uniform(row_key(a, r), a->salt), t->row, sums);
}

/* The first of the rows that draw_rows' team weighs together, one at a time (team_rows): the last
 * rows % parts rows of a call of fewer than 4 float32 rows a thread where each of them is weighed densely or
 * untruncated (not greedy, no top-k) and holds at least 4 blocks a part; `rows` where there are none. */
static int64_t first_team_row(const struct draw_args *a, int64_t rows, int64_t parts) {
    const struct chain_rows *rules = &a->rows;
    const int64_t left = rows % parts, n = rules->n, block = rules->block;
    const int few = parts > 1 && parts <= TEAM_PARTS && rows < 4 * parts && left > 0;
    if (!few || !teaming || rules->dtype != FLOAT32 || block % EXP_CHUNK != 0 || n < 4 * parts * block) return rows;
    for (int64_t r = rows - left; r < rows; r++) {
        const int64_t k = rules->top_k[r / rules->per_position];
        if (greedy_row(rules, r) || (k > 0 && k < n)) return rows;
    }
    return rows - left;
}

/* Rows [first, rows) of draw_rows, each weighed by the whole team (team_dense_row, team_untruncated_row),
 * with part 0's row buffers; run by every thread of the team, after its other rows. Where a thread's
 * buffers were refused, no thread weighs them (the call reports the refusal). */
IN_CLONE void team_rows(const struct draw_args *a, int64_t first, int64_t rows, struct row_buffers *buffers,
                        struct team_row *t) {
    const int64_t part = team_part(), parts = team_parts();
    int ready = 1;
    t->ready[part] = row_buffers_ready(buffers);
    if (part == 0) {
        t->row = buffers->row;
        t->sums = buffers->sums;
    }
    team_wait();
    for (int64_t p = 0; p < parts; p++) ready &= t->ready[p];
    for (int64_t r = first; ready && r < rows; r++) {
        if (part == 0) __atomic_fetch_add(&team_weighed, 1, __ATOMIC_RELAXED);
        if (drawn_untruncated(a, r))
            team_untruncated_row(a, r, part, parts, t);
        else
            team_dense_row(a, r, part, parts, buffers->scratch, t);
    }
}

/* The target draws of the stochastic rows of a verifier call (SPEC §2, §4; struct draw_args), the weights
 * never written out unless asked for: per row, its truncated weights as weigh_rows makes them, then the
 * inverse-CDF draw with the keyed uniform of key s_b + j (request_seed) and the target stream's salt, the
 * tokens sample_rows would give (draw_row). For argmax-mode verification (first not NULL), also the
 * first rejection of each request (first_rejections). For sampled verification (draft not NULL), also,
 * at every drafted position, the weight of its draft token, the uniform of the ratio test, and every
 * row's block sums and kept weights for recover_kept_rows. */
CLONES int64_t draw_rows(const struct draw_args *a) {
    const struct chain_rows *rules = &a->rows;
    const int64_t n = rules->n, blocks = (n + rules->block - 1) / rules->block;
    const int64_t rows = rules->requests * rules->per_position, parts = greedy_parts(a, rows);
    float part_best[SPLIT_TASKS];
    int64_t part_from[SPLIT_TASKS], refused = 0;
    struct team_row team;
#pragma omp parallel if (rows > 1 && rows * n >= PARALLEL_WORK)
    {
    if (parts > 1) split_greedy_rows(a, rows, parts, part_best, part_from);
    struct row_buffers buffers = row_buffers_of(n, blocks, &refused);
    const int ready = row_buffers_ready(&buffers);
    const int64_t first_team = first_team_row(a, rows, team_parts());
#pragma omp for schedule(dynamic)
    for (int64_t r = 0; r < first_team; r++)
        if (ready && !(parts > 1 && greedy_row(rules, r))) draw_row(a, r, &buffers);
    if (first_team < rows) team_rows(a, first_team, rows, &buffers, &team);
    free_row_buffers(&buffers);
    }
    if (a->first && !refused) {
        const int64_t stride = a->bonus ? rules->per_position - 1 : rules->per_position;
        first_rejections(a->proposed, a->tokens, stride, rules->requests, rules->per_position, n, a->first);
    }
    return refused;
}

/* One position r = b * positions + j of recover_kept_rows (sums: ceil(n / block) doubles; q: room for the
 * kept tokens' draft probabilities). */
IN_CLONE int64_t recover_kept_row(const struct recover_kept_args *a, int64_t r, double *sums, float *q) {
    const int64_t n = a->n, block = a->block, blocks = (n + block - 1) / block, capacity = a->kept.capacity;
    const int64_t b = r / a->positions, j = r % a->positions, weight_row = b * (a->positions + 1) + j;
    const int64_t count = a->kept.count[weight_row];
    const int draft_dtype = (int)a->draft_dtype;
    const double uniform = keyed_uniform(request_seed(&a->keys, b) + (uint64_t)j, a->salt);
    const double *weight_sums = a->kept.block_sums + weight_row * blocks;
    if (count < 0) {
        const float *dense_q = float_row(a->draft_probs, draft_dtype, r, n, draft_dtype == FLOAT32 ? NULL : q);
        return recover(a->kept.dense + weight_row * n, NULL, 0, dense_q, weight_sums, a->mass[r], a->draft[r], a->mode[r],
                       uniform, n, block, sums);
    }
    const int32_t *ids = a->kept.ids + weight_row * capacity;
    for (int64_t t = 0; t < count; t++) q[t] = element_of(a->draft_probs, draft_dtype, r, n, ids[t]);
    return recover(a->kept.weights + weight_row * capacity, ids, count, q, weight_sums, a->mass[r], a->draft[r],
                   a->mode[r], uniform, n, block, sums);
}

/* recover_rows on the weights draw_rows left for the recovery (struct recover_kept_args), a sparse row
 * reading q only at its kept tokens. The uniform of position j is keyed by s_b + j (request_seed) and the
 * residual stream's salt. */
CLONES int64_t recover_kept_rows(const struct recover_kept_args *a) {
    const int64_t n = a->n, blocks = (n + a->block - 1) / a->block, rows = a->requests * a->positions;
    int64_t refused = 0;
#pragma omp parallel if (rows > 1 && rows * n >= PARALLEL_WORK)
    {
    double *sums = allocate((uint64_t)blocks * sizeof *sums, &refused);
    float *q = allocate((uint64_t)n * sizeof *q, &refused);
#pragma omp for schedule(dynamic)
    for (int64_t r = 0; r < rows; r++)
        if (sums && q) a->out[r] = recover_kept_row(a, r, sums, q);
    free(sums);
    free(q);
    }
    return refused;
}

/* The small per-position buffers of draw_sampled_verdicts (verdict_buffers_of), [requests, drafted] unless
 * said, and the kept weights of every row. */
struct verdict_buffers {
    int64_t *draft;      /* the drafts, padding as -1 */
    int64_t *targets;    /* the target draws y (not an output of sampled mode) */
    int64_t *drawn;      /* the recovery draws */
    int32_t *mode;       /* each position's recovery mode */
    uint8_t *accepted;   /* the ratio test's verdicts */
    float *at_draft;     /* w(d) */
    double *accept;      /* the ratio test's uniforms */
    double *mass;        /* the kept weights' sums */
    struct kept_rows kept; /* [rows, ..]: what draw_rows keeps for the recovery (dense: the caller's) */
};

/* The verdict_buffers of a call of `requests` requests of `per_position` rows (NULL pointers where one
 * was refused: the refusal is in *refused). */
static struct verdict_buffers verdict_buffers_of(const struct sampled_verdict_args *a, int64_t *refused) {
    const struct chain_rows *rules = &a->rows;
    const uint64_t rows = (uint64_t)(rules->requests * rules->per_position), capacity = (uint64_t)a->capacity;
    const uint64_t positions = (uint64_t)(rules->requests * (rules->per_position - 1)), blocks = (uint64_t)((rules->n + rules->block - 1) / rules->block);
    struct verdict_buffers buffers = {
        .draft = allocate(positions * sizeof(int64_t), refused),
        .targets = allocate(positions * sizeof(int64_t), refused),
        .drawn = allocate(positions * sizeof(int64_t), refused),
        .mode = allocate(positions * sizeof(int32_t), refused),
        .accepted = allocate(positions, refused),
        .at_draft = allocate(positions * sizeof(float), refused),
        .accept = allocate(positions * sizeof(double), refused),
        .mass = allocate(positions * sizeof(double), refused),
        .kept = {
            .count = allocate(rows * sizeof(int64_t), refused),
            .ids = allocate(rows * capacity * sizeof(int32_t), refused),
            .weights = allocate(rows * capacity * sizeof(float), refused),
            .dense = a->dense,
            .block_sums = allocate(rows * blocks * sizeof(double), refused),
            .capacity = a->capacity,
        },
    };
    return buffers;
}

static void free_verdict_buffers(struct verdict_buffers *buffers) {
    free(buffers->draft);
    free(buffers->targets);
    free(buffers->drawn);
    free(buffers->mode);
    free(buffers->accepted);
    free(buffers->at_draft);
    free(buffers->accept);
    free(buffers->mass);
    free(buffers->kept.count);
    free(buffers->kept.ids);
    free(buffers->kept.weights);
    free(buffers->kept.block_sums);
}

/* Stage of draw_sampled_verdicts, the drafts: proposed [requests, drafted] as given, an id outside [0, n)
 * and every position after it written as -1 (padding) to draft. */
static void pad_drafts(const int64_t *proposed, int64_t requests, int64_t drafted, int64_t n, int64_t *draft) {
    for (int64_t b = 0; b < requests; b++)
        for (int64_t j = 0, open = 1; j < drafted; j++) {
            const int64_t d = proposed[b * drafted + j];
            open = open && d >= 0 && d < n;
            draft[b * drafted + j] = open ? d : -1;
        }
}

/* Stage of draw_sampled_verdicts, the ratio test at every drafted position (SPEC §3.2): reject iff
 * u * q(d) >= p~(d), with p~(d) = w(d) / mass in float32 (mass: the row's block sums added in block order)
 * and q(d) <= 0 counted as 1 (then the recovery leaves d out). Writes mass, accepted, mode (FROM_TARGET
 * where there is no draft) and first (the first position not accepted; drafted when all are). */
IN_CLONE void judge_drafts(const struct sampled_verdict_args *a, struct verdict_buffers *v) {
    const struct chain_rows *rules = &a->rows;
    const int64_t requests = rules->requests, per_position = rules->per_position, drafted = per_position - 1;
    const int64_t n = rules->n, blocks = (n + rules->block - 1) / rules->block;
    for (int64_t b = 0; b < requests; b++) {
        a->first[b] = drafted;
        for (int64_t j = 0; j < drafted; j++) {
            const int64_t at = b * drafted + j, d = v->draft[at];
            const double *sums = v->kept.block_sums + (b * per_position + j) * blocks;
            double total = 0.0;
            for (int64_t t = 0; t < blocks; t++) total += sums[t];
            v->mass[at] = total;
            const double p_draft = (double)(v->at_draft[at] / (float)total);
            const double q_draft = d >= 0 ? (double)element_of(a->draft_probs, (int)a->draft_dtype, at, n, d) : 0.0;
            const int blind = q_draft <= 0.0;
            v->accepted[at] = d >= 0 && !(v->accept[at] * (blind ? 1.0 : q_draft) >= p_draft);
            v->mode[at] = d < 0 ? FROM_TARGET : blind ? WITHOUT_DRAFT : FROM_RESIDUAL;
            if (!v->accepted[at] && a->first[b] == drafted) a->first[b] = j;
        }
    }
}

/* Stage of draw_sampled_verdicts and draw_block_verdicts, the draws: the drafts padded (pad_drafts), then
 * draw_rows' draws, and the kept weights, draft weights and accept uniforms of every drafted position, into
 * v. Returns draw_rows' refusal (0 when it allocated all it needed). */
static int64_t draw_for_verdicts(const struct sampled_verdict_args *a, struct verdict_buffers *v) {
    const struct chain_rows *rules = &a->rows;
    pad_drafts(a->proposed, rules->requests, rules->per_position - 1, rules->n, v->draft);
    const struct draw_args draws = {.rows = *rules, .keys = a->keys, .salt = a->salt, .tokens = v->targets,
                                    .bonus = a->bonus, .draft = v->draft, .accept_salt = a->accept_salt,
                                    .at_draft = v->at_draft, .accept_uniforms = v->accept, .kept = v->kept};
    return draw_rows(&draws);
}

/* The sampled-mode verdicts of a chain call (SPEC §3.2) in one call (struct sampled_verdict_args), in
 * stages: the drafts padded (pad_drafts); draw_rows' draws and kept weights of every row; the ratio test
 * at each drafted position (judge_drafts); the recovery of recover_kept_rows at every drafted position
 * (from p~ where there is no draft); then recovered: the draft where accepted, else the recovery. */
CLONES int64_t draw_sampled_verdicts(const struct sampled_verdict_args *a) {
    const struct chain_rows *rules = &a->rows;
    const int64_t requests = rules->requests, drafted = rules->per_position - 1;
    int64_t refused = 0;
    struct verdict_buffers v = verdict_buffers_of(a, &refused);
    if (!refused) refused = draw_for_verdicts(a, &v);
    if (!refused) {
        judge_drafts(a, &v);
        const struct recover_kept_args recovery = {
            .kept = v.kept, .keys = a->keys, .salt = a->residual_salt, .mass = v.mass, .draft_probs = a->draft_probs,
            .draft = v.draft, .mode = v.mode, .out = v.drawn, .draft_dtype = a->draft_dtype, .requests = requests,
            .positions = drafted, .n = rules->n, .block = rules->block};
        refused = recover_kept_rows(&recovery);
    }
    if (!refused)
        for (int64_t at = 0; at < requests * drafted; at++) a->recovered[at] = v.accepted[at] ? v.draft[at] : v.drawn[at];
    free_verdict_buffers(&v);
    return refused;
}

/* ---- Block verification (SPEC §3.6): draw_block_verdicts, the fused path of verification="block". It
 * shares draw_sampled_verdicts' draws and kept weights (draw_for_verdicts); only the judge differs. Every
 * value of the rule is computed as stages.rules.block_verdict computes it (float64, p~(d) the float32 weight
 * over the float32 mass), the scalar rule outside the clones so that no product is fused into an add; the
 * draws are recover_rows' on q scaled by the float32 1 / P_j, bit for bit. ---- */

/* What the block judge of a call holds per request (block_state_of), float64 unless said. */
struct block_state {
    double *joint;    /* [requests, drafted + 1]: P_0 .. P_drafted (entries past a request's drafts unused) */
    double *p_draft;  /* [requests, drafted]: p~(d), the float32 weight over the float32 mass */
    double *q_draft;  /* [requests, drafted]: q(d), 1 where q(d) <= 0 (judged without a distribution) */
    double *residual; /* [requests, drafted]: R_j, where the judge drew at position j */
    int64_t *gamma;   /* int64 [requests]: the drafts before the first -1 */
    int64_t *low;     /* int64 [requests]: the lowest position drawn so far (gamma before any) */
    int64_t *tau;     /* int64 [requests]: the longest kept prefix, -1 while not known */
};

/* A thread's buffers for the draws of the block judge. */
struct block_scratch {
    double *sums; /* [ceil(n / block)]: a residual's block sums */
    float *q;     /* [n]: a position's draft probabilities times 1 / P_j */
    int64_t *tau; /* int64 [requests]: the thread's own copy of block_state's tau (judge_in_rounds) */
    int64_t *low; /* int64 [requests]: ... and of its low */
};

/* The block_state of a call of `positions` = requests * drafted drafted positions (NULL pointers where one
 * was refused: the refusal is in *refused). */
static struct block_state block_state_of(int64_t requests, int64_t positions, int64_t *refused) {
    const uint64_t each = (uint64_t)positions * sizeof(double);
    struct block_state state = {
        .joint = allocate(each + (uint64_t)requests * sizeof(double), refused),
        .p_draft = allocate(each, refused),
        .q_draft = allocate(each, refused),
        .residual = allocate(each, refused),
        .gamma = allocate((uint64_t)requests * sizeof(int64_t), refused),
        .low = allocate((uint64_t)requests * sizeof(int64_t), refused),
        .tau = allocate((uint64_t)requests * sizeof(int64_t), refused),
    };
    return state;
}

static void free_block_state(struct block_state *state) {
    free(state->joint);
    free(state->p_draft);
    free(state->q_draft);
    free(state->residual);
    free(state->gamma);
    free(state->low);
    free(state->tau);
}

/* Stage of draw_block_verdicts, the joint ratios of request b: at each drafted position j, the kept
 * weights' mass (v->mass: the block sums added in block order) and mode (v->mode) as judge_drafts makes
 * them, p~(d) and q(d) (stages.rules.draft_probabilities) and P_{j+1} = min(1, P_j p~(d) / q(d)), P_0 = 1
 * (joint_ratios); s->gamma[b], the drafts before the row's first -1 (the drafts are padded). */
static void block_ratios(const struct sampled_verdict_args *a, struct verdict_buffers *v, struct block_state *s,
                         int64_t b) {
    const int64_t per_position = a->rows.per_position, drafted = per_position - 1, n = a->rows.n;
    const int64_t blocks = (n + a->rows.block - 1) / a->rows.block;
    double *joint = s->joint + b * per_position;
    joint[0] = 1.0;
    s->gamma[b] = 0;
    for (int64_t j = 0; j < drafted; j++) {
        const int64_t at = b * drafted + j, d = v->draft[at];
        const double *sums = v->kept.block_sums + (b * per_position + j) * blocks;
        double total = 0.0;
        for (int64_t t = 0; t < blocks; t++) total += sums[t];
        v->mass[at] = total;
        const double q_draft = d >= 0 ? (double)element_of(a->draft_probs, (int)a->draft_dtype, at, n, d) : 0.0;
        s->p_draft[at] = (double)(v->at_draft[at] / (float)total);
        s->q_draft[at] = q_draft <= 0.0 ? 1.0 : q_draft;
        v->mode[at] = d < 0 ? FROM_TARGET : q_draft <= 0.0 ? WITHOUT_DRAFT : FROM_RESIDUAL;
        const double ratio = joint[j] * s->p_draft[at] / s->q_draft[at];
        joint[j + 1] = ratio < 1.0 ? ratio : 1.0;
        s->gamma[b] += d >= 0;
    }
}

/* One drafted position's kept weights as draw_rows left them (struct kept_rows), for the block judge. */
struct kept_position {
    const float *w;            /* float32 [n] where dense, else [count]: the weights of the tokens ids */
    const int32_t *ids;        /* int32 [count], ascending; NULL where dense */
    int64_t count;             /* the tokens held sparsely (0 where dense) */
    const double *weight_sums; /* float64 [ceil(n / block)]: the weights' block sums */
    double mass;               /* their total, added in block order */
};

/* residual_block_sums of q times inverse: each product rounded to float32 and stored in scaled[n] (where
 * the draw then reads it; scaled may be q itself), the sums those residual_block_sums makes of scaled, bit
 * for bit: a product that is also stored is never fused into the subtraction (GCC fuses a product into an
 * add only where every use of it is one). Returns the total. */
IN_CLONE double scaled_residual_sums(const float *w, const float *q, float inverse, float *scaled, int64_t n,
                                     float scale, int64_t block, double *sums) {
    double total = 0.0;
    for (int64_t start = 0, b = 0; start < n; start += block, b++) {
        const int64_t end = start + block < n ? start + block : n;
        float lanes[16] = {0};
        int64_t i = start;
        for (; i + 15 < end; i += 16) { /* (the stores last: no load of q or w after one, whatever aliases) */
            float product[16];
            for (int lane = 0; lane < 16; lane++) product[lane] = q[i + lane] * inverse;
            for (int lane = 0; lane < 16; lane++) lanes[lane] += residual_term(w[i + lane], product[lane], scale);
            for (int lane = 0; lane < 16; lane++) scaled[i + lane] = product[lane];
        }
        double sum = 0.0;
        for (; i < end; i++) {
            const float product = q[i] * inverse;
            sum += residual_term(w[i], product, scale);
            scaled[i] = product;
        }
        for (int lane = 0; lane < 16; lane++) sum += lanes[lane];
        sums[b] = sum;
        total += sum;
    }
    return total;
}

/* The draw of recover (mode FROM_RESIDUAL) from the residual max(0, w / mass - q * inverse) of a position's
 * kept weights, bit for bit recover's on q scaled beforehand (torch's `draft_probs.float() * inverse`): the
 * same sums and walk. q: [n] where dense (scaled here, into scaled[n]), [count] where sparse (already
 * scaled: inverse 1). Writes the residual's mass (the total of its block sums; 0 where it is empty, the
 * draw then from p~) to *residual. sums: room for ceil(n / block) doubles. */
CLONES static int64_t residual_walk(const struct kept_position *k, const float *q, float inverse, float *scaled,
                                    double uniform, int64_t n, int64_t block, double *sums, double *residual) {
    const float scale = (float)(1.0 / k->mass);
    if (k->ids) {
        *residual = kept_block_sums(k->ids, k->w, q, scale, k->count, n, block, sums);
    } else if (inverse == 1.0f) {
        *residual = residual_block_sums(k->w, q, n, scale, block, sums);
    } else {
        *residual = scaled_residual_sums(k->w, q, inverse, scaled, n, scale, block, sums);
        q = scaled;
    }
    if (*residual > 0.0) return draw(k->w, k->ids, k->count, q, scale, -1, n, block, sums, uniform);
    *residual = 0.0;
    return draw(k->w, k->ids, k->count, NULL, scale, -1, n, block, k->weight_sums, uniform);
}

/* 1 / P_j as the factor of q in max(0, p~ - q / P_j), as stages.rules._inverse makes it: float64, clamped
 * at float32's largest finite value, then rounded to float32; 1 where P_j is 0. */
static inline float inverse_of(double joint) {
    if (!(joint > 0.0)) return 1.0f;
    const double inverse = 1.0 / joint;
    return (float)(inverse < 0x1.fffffep127 ? inverse : 0x1.fffffep127);
}

/* q at drafted position `at` (draft_probs [.., n] of draft_dtype) for residual_walk, into buffer (n floats)
 * where it is not the float32 row itself: where sparse, at the kept tokens ids[count] only, each times
 * `inverse` rounded to float32 (*inverse then 1); where dense, the row (residual_walk scales it). */
static const float *draft_row(const struct sampled_verdict_args *a, int64_t at, const struct kept_position *k,
                              float *inverse, float *buffer) {
    const int dtype = (int)a->draft_dtype;
    const int64_t n = a->rows.n;
    if (!k->ids) return float_row(a->draft_probs, dtype, at, n, buffer);
    for (int64_t t = 0; t < k->count; t++) buffer[t] = element_of(a->draft_probs, dtype, at, n, k->ids[t]) * *inverse;
    *inverse = 1.0f;
    return buffer;
}

/* Stage of judge_block, the token the stages draw at drafted position j of request b (block_verdict's
 * recovery_draw) with the residual stream's uniform of key s_b + j, from max(0, p~ - q / P_j)
 * (FROM_RESIDUAL; p~ where that is empty), p~ without d (WITHOUT_DRAFT) or p~ (FROM_TARGET: padding); and
 * R_j (kept_prefixes' residual mass) to s->residual: P_j times the residual's mass, or P_j (1 - p~(d)). */
static int64_t block_draw(const struct sampled_verdict_args *a, const struct verdict_buffers *v,
                          struct block_state *s, int64_t b, int64_t j, struct block_scratch *t) {
    const int64_t n = a->rows.n, block = a->rows.block, blocks = (n + block - 1) / block, capacity = v->kept.capacity;
    const int64_t drafted = a->rows.per_position - 1, at = b * drafted + j, row = b * (drafted + 1) + j;
    const double uniform = keyed_uniform(request_seed(&a->keys, b) + (uint64_t)j, a->residual_salt);
    const double joint = s->joint[row];
    const int64_t count = v->kept.count[row];
    const struct kept_position k = {
        .w = count < 0 ? v->kept.dense + row * n : v->kept.weights + row * capacity,
        .ids = count < 0 ? NULL : v->kept.ids + row * capacity,
        .count = count < 0 ? 0 : count,
        .weight_sums = v->kept.block_sums + row * blocks,
        .mass = v->mass[at],
    };
    if (v->mode[at] != FROM_RESIDUAL) {
        const double left = 1.0 - s->p_draft[at];
        s->residual[at] = joint * (left > 0.0 ? left : 0.0);
        return recover(k.w, k.ids, k.count, NULL, k.weight_sums, k.mass, v->draft[at], v->mode[at], uniform, n, block,
                       t->sums);
    }
    float inverse = inverse_of(joint);
    const float *q = draft_row(a, at, &k, &inverse, t->q);
    double residual;
    const int64_t token = residual_walk(&k, q, inverse, t->q, uniform, n, block, t->sums, &residual);
    s->residual[at] = joint * residual;
    return token;
}

/* Whether request b keeps the prefix of its first i >= 1 drafts (SPEC §3.6, kept_prefixes), on the coin of
 * draft i - 1: all gamma drafts iff u q(d) < P_{gamma-1} p~(d) (§3.2's test); a shorter prefix iff P_i == 1
 * or u (R_i + 1 - P_i) < R_i (R_i drawn before: block_draw). Not inlined into a clone: no product is fused
 * into an add. */
static __attribute__((noinline)) int prefix_kept(const struct verdict_buffers *v, const struct block_state *s,
                                                int64_t b, int64_t i, int64_t drafted) {
    const double u = v->accept[b * drafted + i - 1], *joint = s->joint + b * (drafted + 1);
    if (i == s->gamma[b]) {
        const int64_t last = b * drafted + i - 1;
        return u * s->q_draft[last] < joint[i - 1] * s->p_draft[last];
    }
    const double residual = s->residual[b * drafted + i];
    return joint[i] >= 1.0 || u * (residual + 1.0 - joint[i]) < residual;
}

/* Stage of draw_block_verdicts, each request's judge before any draw: its joint ratios (block_ratios);
 * tau = gamma where every draft is kept (or there is none), else not known yet (-1); nothing drawn yet. */
static void start_blocks(const struct sampled_verdict_args *a, struct verdict_buffers *v, struct block_state *s) {
    for (int64_t b = 0; b < a->rows.requests; b++) {
        block_ratios(a, v, s, b);
        const int64_t gamma = s->gamma[b];
        s->low[b] = gamma;
        s->tau[b] = gamma == 0 || prefix_kept(v, s, b, gamma, a->rows.per_position - 1) ? gamma : -1;
    }
}

/* Whether round `round` of judge_blocks draws drafted position j of request b: a padding position (p~ on
 * the residual stream, where the stages draw it) in the first round; else the `chunk` positions below the
 * lowest drawn of a request whose tau is not known. */
static inline int block_drawn_in(const struct block_state *s, int64_t b, int64_t j, int64_t round, int64_t chunk) {
    if (j >= s->gamma[b]) return round == 0;
    return s->tau[b] < 0 && j < s->low[b] && j >= s->low[b] - chunk;
}

/* Stage of judge_blocks after a round's draws, request b (its tau not known yet): its prefixes ending at
 * the `chunk` positions just drawn, judged from the longest down until one is kept (prefix 0 always is). */
static void judge_request(const struct verdict_buffers *v, struct block_state *s, int64_t b, int64_t chunk,
                          int64_t drafted) {
    const int64_t lowest = s->low[b] > chunk ? s->low[b] - chunk : 0;
    for (int64_t i = s->low[b] - 1; i >= lowest && s->tau[b] < 0; i--)
        if (i == 0 || prefix_kept(v, s, b, i, drafted)) s->tau[b] = i;
    s->low[b] = lowest;
}

/* Stage of judge_blocks, request b alone, lazily: the padding's draws, then one position at a time from
 * its longest prefix down, each judged at once (judge_request), until a prefix is kept. */
static void judge_alone(const struct sampled_verdict_args *a, struct verdict_buffers *v, struct block_state *s,
                        int64_t b, struct block_scratch *t) {
    const int64_t drafted = a->rows.per_position - 1;
    for (int64_t round = 0; round == 0 || s->tau[b] < 0; round++) {
        for (int64_t j = 0; j < drafted; j++)
            if (block_drawn_in(s, b, j, round, 1)) v->drawn[b * drafted + j] = block_draw(a, v, s, b, j, t);
        if (s->tau[b] < 0) judge_request(v, s, b, 1, drafted);
    }
}

/* Stage of judge_blocks, fewer requests than threads: in rounds, each drawing in parallel the `chunk` next
 * positions of every request whose tau is not known (block_drawn_in), then judging them (judge_request),
 * until every tau is known. Run by every thread of the team (t: the thread's scratch; ready: whether it
 * has it): each judges every request after a round's draws, alike, on its own copy of tau and low, so
 * that a round waits once (for its draws), not twice; the first thread's taus are written to s. */
static void judge_in_rounds(const struct sampled_verdict_args *a, struct verdict_buffers *v, struct block_state *s,
                            int64_t chunk, struct block_scratch *t, int ready, const int64_t *refused) {
    const int64_t requests = a->rows.requests, drafted = a->rows.per_position - 1, positions = requests * drafted;
    struct block_state own = *s;
    own.tau = ready ? memcpy(t->tau, s->tau, (size_t)requests * sizeof *t->tau) : s->tau;
    own.low = ready ? memcpy(t->low, s->low, (size_t)requests * sizeof *t->low) : s->low;
    for (int64_t round = 0, open = 1; open; round++) {
#pragma omp for schedule(dynamic)
        for (int64_t at = 0; at < positions; at++)
            if (ready && block_drawn_in(&own, at / drafted, at % drafted, round, chunk))
                v->drawn[at] = block_draw(a, v, &own, at / drafted, at % drafted, t);
        open = 0;
        for (int64_t b = 0; b < requests && ready && !*refused; b++) {
            if (own.tau[b] >= 0) continue;
            judge_request(v, &own, b, chunk, drafted);
            open += own.tau[b] < 0;
        }
    }
#pragma omp master
    if (ready) memcpy(s->tau, own.tau, (size_t)requests * sizeof *s->tau);
}

/* The values the draws of every drafted position of a call would read: n for a dense kept row, its count
 * for a short list (the measure of judge_blocks' work, as rows * n is of the kernels' others). */
static int64_t block_work(const struct sampled_verdict_args *a, const struct verdict_buffers *v) {
    const int64_t per_position = a->rows.per_position, rows = a->rows.requests * per_position;
    int64_t work = 0;
    for (int64_t row = 0; row < rows; row++)
        if (row % per_position < per_position - 1) work += v->kept.count[row] < 0 ? a->rows.n : v->kept.count[row];
    return work;
}

/* Stage of draw_block_verdicts, the verdicts (SPEC §3.6) with the fewest draws: each request judges its
 * prefixes from the longest down, drawing a position (block_draw: its R_j and the stages' draw there, by
 * one pass) only as the prefix ending there is judged, so that no position below its tau is drawn; the
 * requests in parallel, each alone (judge_alone), or where they are fewer than the team's threads, in
 * rounds of enough positions for every thread (judge_in_rounds); one thread where the kept rows are short
 * lists of few tokens in all. */
static int64_t judge_blocks(const struct sampled_verdict_args *a, struct verdict_buffers *v, struct block_state *s) {
    const int64_t requests = a->rows.requests, n = a->rows.n, blocks = (n + a->rows.block - 1) / a->rows.block;
    const int parallel = requests * (a->rows.per_position - 1) > 1 && block_work(a, v) >= PARALLEL_WORK;
    const int64_t team = parallel ? team_size() : 1, chunk = team > requests ? (team + requests - 1) / requests : 1;
    int64_t refused = 0;
#pragma omp parallel if (parallel)
    {
    struct block_scratch t = {.sums = allocate((uint64_t)blocks * sizeof(double), &refused),
                              .q = allocate((uint64_t)n * sizeof(float), &refused),
                              .tau = allocate((uint64_t)requests * sizeof(int64_t), &refused),
                              .low = allocate((uint64_t)requests * sizeof(int64_t), &refused)};
    const int ready = t.sums && t.q && t.tau && t.low;
    if (chunk > 1) {
        judge_in_rounds(a, v, s, chunk, &t, ready, &refused);
    } else {
#pragma omp for schedule(dynamic)
        for (int64_t b = 0; b < requests; b++)
            if (ready) judge_alone(a, v, s, b, &t);
    }
    free(t.sums);
    free(t.q);
    free(t.tau);
    free(t.low);
    }
    return refused;
}

/* The block verdicts of a sampled-mode chain call (SPEC §3.6) in one call, on draw_sampled_verdicts'
 * struct and with its outputs, in stages: draw_for_verdicts' draws and kept weights; each request's joint
 * ratios and whole-block test (start_blocks); the verdicts (judge_blocks). first[b] = tau, the longest kept
 * prefix; recovered: the drafts before tau, the stages' draws from tau on; the bonus draws in bonus. */
int64_t draw_block_verdicts(const struct sampled_verdict_args *a) {
    const int64_t requests = a->rows.requests, drafted = a->rows.per_position - 1;
    int64_t refused = 0;
    struct verdict_buffers v = verdict_buffers_of(a, &refused);
    struct block_state s = block_state_of(requests, requests * drafted, &refused);
    if (!refused) refused = draw_for_verdicts(a, &v);
    if (!refused) {
        start_blocks(a, &v, &s);
        refused = judge_blocks(a, &v, &s);
    }
    for (int64_t b = 0; b < requests && !refused; b++) {
        a->first[b] = s.tau[b];
        for (int64_t j = 0, at = b * drafted; j < drafted; j++, at++)
            a->recovered[at] = j < s.tau[b] ? v.draft[at] : v.drawn[at];
    }
    free_verdict_buffers(&v);
    free_block_state(&s);
    return refused;
}

/* One drafted position r of relaxed_rows: writes its top-1 and its verdict. x: its logits row as float32. */
IN_CLONE void relax_row(const struct relaxed_args *a, int64_t r, const float *x) {
    const int64_t n = a->n, best = row_argmax(x, n), d = a->draft[r];
    a->top1[r] = best;
    a->accepted[r] = 0;
    if (d < 0 || d >= n) return;
    const float top = x[best], at_draft = x[d];
    int64_t rank = 0;
    for (int64_t i = 0; i < d; i++) rank += x[i] >= at_draft;
    for (int64_t i = d + 1; i < n; i++) rank += x[i] > at_draft;
    if (rank >= a->k) return;
    float lanes[16] = {0};
    int64_t i = 0;
    for (; i + 15 < n; i += 16)
        for (int lane = 0; lane < 16; lane++) lanes[lane] += exp_nonpositive(x[i + lane] - top);
    double total = 0.0;
    for (; i < n; i++) total += exp_nonpositive(x[i] - top);
    for (int lane = 0; lane < 16; lane++) total += lanes[lane];
    const double p_draft = exp_nonpositive(at_draft - top) / total, p_top1 = 1.0 / total;
    a->accepted[r] = p_draft > 0.0 && p_draft >= p_top1 - a->delta;
}

/* The relaxed acceptance of thinking rows (SPEC §3.4) for each drafted position, on p = softmax(x) of
 * the masked logits without temperature: accept iff p(d) > 0, d is among the k most likely tokens
 * (ranked by logit, which orders like p exactly; ties go to the lower id) and p(d) >= p(top-1) - delta.
 * Position j of request r is logits row r * logit_positions + j (struct relaxed_args); writes accepted
 * (0/1) and top1 (the argmax: lowest id on ties, NaN never wins). */
CLONES int64_t relaxed_rows(const struct relaxed_args *a) {
    const int64_t n = a->n, positions = a->positions, rows = a->requests * positions;
    const int dtype = (int)a->dtype;
    int64_t refused = 0;
#pragma omp parallel if (rows > 1 && rows * n >= PARALLEL_WORK)
    {
    float *buffer = dtype == FLOAT32 ? NULL : allocate((uint64_t)n * sizeof *buffer, &refused);
#pragma omp for schedule(dynamic)
    for (int64_t r = 0; r < rows; r++)
        if (dtype == FLOAT32 || buffer)
            relax_row(a, r, float_row(a->logits, dtype, (r / positions) * a->logit_positions + r % positions, n, buffer));
    free(buffer);
    }
    return refused;
}
