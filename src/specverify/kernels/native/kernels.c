/* CPU kernels for specverify: logits -> truncated target weights in one pass per row (weigh_rows), the
 * inverse-CDF draw (sample_rows), the recovery draw of sampled mode (recover_rows), a NaN-safe argmax.
 *
 * A row is processed while it is in cache: its max, then w = exp((x - max) / T) (a vectorised exp), the
 * kept-set threshold, then the weights below it zeroed and block sums written. Weights are non-negative
 * float32, so their bit patterns order like their values. A small top-k is found with a heap of the k
 * largest (its nucleus from those k sorted values); a larger top-k by radix selection (a counting
 * histogram over the row, then the chosen bucket's values gathered and resolved); the nucleus by a search
 * on the weights' bits, a few vectorised passes that each narrow a bracket around it to a fifth, then the
 * bracket's values gathered and resolved (nucleus_threshold). Sums run in double in a fixed lane order,
 * so results do not depend on threads, batch layout or the instruction set. Rows are independent: built
 * with OpenMP, a call spreads them over the calling thread's team; built without, the caller splits a
 * batch between threads (ctypes releases the GIL). Inputs may be float32, bfloat16 or float16, converted
 * exactly a row at a time.
 *
 * The verifier's chain calls go through draw_rows instead, which never writes the weights out: each row
 * is weighed (weigh_kept: a greedy row's argmax alone; a top-k row from its k largest raw logits, only the
 * candidates near the k-th exponentiated, held as a short list of (id, weight); any other row densely in
 * a buffer of the thread's, in cache) and drawn at once with its keyed uniform, so that the logits are
 * read about once. Sampled mode keeps each drafted position's weights for recover_kept_rows (the short
 * list, or the dense row where the kept set is large). Every path gives the bits of the dense one.
 */
#include <stdint.h>
#include <string.h>
#include <math.h>
#include <stdlib.h>

/* Below this many values a call stays on one thread. */
#define PARALLEL_WORK 65536

/* Hot loops are compiled for AVX-512, AVX2 and plain x86-64, the best chosen at load time (GCC's
 * function multiversioning, on x86-64 Linux); elsewhere they are compiled once for the target. The AVX2
 * build is x86-64-v3 (AVX2 with FMA) where GCC names that level (12 and later): the exp's polynomial in
 * fused multiply-adds is a quarter faster, and contracted as the AVX-512 build contracts it (GCC enables
 * FMA with AVX-512F), so that both give the same weights. */
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
 * `values`). Where rounding leaves the target unreached at a level, the lowest bucket is kept. */
static float refine_threshold(float *values, int64_t count, int mass, double above, double target, uint32_t prefix,
                              int shift) {
    double hist[1024];
    for (; shift >= 0; shift -= 10) {
        memset(hist, 0, sizeof hist);
        for (int64_t i = 0; i < count; i++) hist[(bits_of(values[i]) >> shift) & 1023u] += mass ? (double)values[i] : 1.0;
        int chosen = 1023;
        while (chosen > 0 && above + hist[chosen] < target) above += hist[chosen--];
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
    return refine_threshold(scratch, count, 0, (double)above, (double)k, chosen, 10);
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
    const float threshold = refine_threshold(scratch, count, 1, above, target, 0u, 20);
    return threshold > float_of(low) ? threshold : float_of(low); /* (rounding left the target unreached) */
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

/* The room a row's scratch buffer needs, in floats: n values, then the stripe maxima (stripes_of) or the
 * flags of gather_between (n bytes). */
static inline int64_t scratch_size(int64_t n) {
    const int64_t stripes = stripes_of(n), flags = n / 4 + 1;
    return n + (stripes > flags ? stripes : flags);
}

/* The first value and the end of stripe s of a row of n values: its values are first, first +
 * STREAM_LANES, ... below end. */
static inline int64_t stripe_start(int64_t s) {
    return s / STREAM_LANES * STRIPE_BLOCK + s % STREAM_LANES;
}

static inline int64_t stripe_end(int64_t s, int64_t n) {
    const int64_t end = (s / STREAM_LANES + 1) * STRIPE_BLOCK;
    return end < n ? end : n;
}

/* The largest value of each stripe of the row (stripe_start), NaN skipped (-inf for a stripe without a
 * value), written to stripe_top[stripes_of(n)]. */
IN_CLONE void stripe_maxima(const float *row, int64_t n, float *stripe_top) {
    float lanes[STREAM_LANES]; /* (a local array: written through stripe_top, the scan would store every step) */
    for (int64_t start = 0; start < n; start += STRIPE_BLOCK) {
        lane_maxima(row, start, start + STRIPE_BLOCK < n ? start + STRIPE_BLOCK : n, lanes);
        memcpy(stripe_top + start / STRIPE_BLOCK * STREAM_LANES, lanes, sizeof lanes);
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

/* largest_k over the stripes of the row (stripe_maxima), with the slots starting at `floor`, a value that
 * at least k of the row's values reach (so the k largest are the values above it and copies of it): only
 * the stripes whose maximum beats the k-th so far are visited (a few, in cache). */
static inline void largest_k_in_stripes(const float *row, int64_t n, int64_t k, float floor, const float *stripe_top,
                                        float *heap) {
    for (int64_t i = 0; i < k; i++) heap[i] = floor;
    for (int64_t s = 0; s < stripes_of(n); s++) {
        if (!(stripe_top[s] > heap[0])) continue;
        for (int64_t i = stripe_start(s), end = stripe_end(s, n); i < end; i += STREAM_LANES) offer(row[i], k, heap);
    }
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

/* The kept-set threshold of one row: max(k-th largest, nucleus threshold on the top-k-renormalised row). */
CLONES static float row_threshold(const float *row, int64_t n, int64_t k, float top_p, double rtol, float *scratch) {
    const int limited = k > 0 && k < n;
    if (!limited && top_p >= 1.0f) return 0.0f;
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
 * clamped there. */
IN_CLONE float exp_nonpositive(float y) {
    y = y > -104.0f ? y : -104.0f;
    y = y < 88.0f ? y : 88.0f;
    const float shifter = 12582912.0f; /* 1.5 * 2^23: adding it rounds to an integer, kept in the low bits */
    const float shifted = y * 1.44269504088896341f + shifter;
    const float n = shifted - shifter;
    const float r = (y - n * 0.693359375f) - n * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    /* 2^n below the normal floats: 2^(n + 64) times 2^-64; at -104, 2^-150 times e^r < 1 rounds to 0 */
    const int subnormal = y < -87.0f;
    const uint32_t biased = bits_of(shifted) - bits_of(shifter) + (subnormal ? 191u : 127u);
    return p * float_of(biased << 23) * (subnormal ? 5.42101086e-20f : 1.0f);
}

/* The largest value of the row, NaN skipped (a comparison with NaN is false); -inf when there is none. */
IN_CLONE float row_max(const float *row, int64_t n) {
    float lanes[STREAM_LANES];
    lane_maxima(row, 0, n, lanes);
    return lanes_max(lanes);
}

/* Index of the row's largest value: lowest index on ties, NaN never wins, 0 when nothing beats -inf.
 * One streaming scan remembers the first block of STRIPE_BLOCK values that holds the largest; that block
 * alone (in cache) is then searched for its first occurrence. */
IN_CLONE int64_t row_argmax(const float *row, int64_t n) {
    float best = -INFINITY, lanes[STREAM_LANES];
    int64_t from = 0;
    for (int64_t start = 0; start < n; start += STRIPE_BLOCK) {
        lane_maxima(row, start, start + STRIPE_BLOCK < n ? start + STRIPE_BLOCK : n, lanes);
        const float top = lanes_max(lanes);
        if (top > best) {
            best = top;
            from = start;
        }
    }
    if (!(best > -INFINITY)) return 0;
    while (!(row[from] == best)) from++;
    return from;
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

/* One row's truncated weights (SPEC §2, not greedy), dense: row[i] = exp((x[i] - max x) / T) (the largest
 * exactly 1; a non-finite max counts as 0), zero below max(k-th largest, nucleus threshold on the
 * top-k-renormalised row, min_p) (min_p: NULL for none), and the sums of each block of `block` kept weights
 * written to sums[ceil(n / block)]. x may be row itself (converted in place of the weights); scratch:
 * scratch_size(n) floats. */
IN_CLONE void weigh_dense(const float *x, int64_t n, float temperature, int64_t k, float top_p, const float *min_p,
                               double rtol, int64_t block, float *row, float *scratch, double *sums) {
    float top = row_max(x, n);
    top = isfinite(top) ? top : 0.0f;
    const float inverse = 1.0f / temperature;
    for (int64_t i = 0; i < n; i++) row[i] = exp_nonpositive((x[i] - top) * inverse);
    float threshold = row_threshold(row, n, k, top_p, rtol, scratch);
    if (min_p) {
        const float ratio = (float)((double)*min_p * (1.0 - rtol));
        if (ratio > threshold) threshold = ratio;
    }
    keep_at_least(row, n, threshold, block, sums);
}

/* The truncated target weights of SPEC §2 from raw logits, one row at a time while it is in cache:
 * w = exp((x - max x) / T), the largest exactly 1 (a non-finite max counts as 0), then every weight below
 * max(k-th largest, nucleus threshold on the top-k-renormalised row, min_p) zeroed, and NaN ones.
 * Rows with temperature below `greedy_below` become one-hot at their argmax (lowest index on ties, NaN
 * never wins). top_k <= 0 or >= n: no limit; top_p >= 1: no nucleus; min_p may be NULL.
 * logits: [.., n] of `dtype` (FLOAT32, BFLOAT16 or FLOAT16); output row r weighs logits row source[r]
 * (r itself when source is NULL), and a negative source skips it: its block sums are zeroed and its
 * weights left as they were (the rows of a tree walk that has stopped). Writes weights [rows, n]
 * float32 and block_sums [rows, ceil(n / block)], the sum of each block of kept weights. */
CLONES void weigh_rows(const void *logits, int dtype, const int64_t *source, int64_t rows, int64_t n,
                       const float *temperature, float greedy_below, const int64_t *top_k, const float *top_p,
                       const float *min_p, double rtol, int64_t block, float *weights, double *block_sums) {
    const int64_t blocks = (n + block - 1) / block;
    int64_t weighed = rows; /* threads only where more than one row is weighed */
    if (source)
        for (int64_t r = weighed = 0; r < rows; r++) weighed += source[r] >= 0;
#pragma omp parallel if (weighed > 1 && weighed * n >= PARALLEL_WORK)
    {
    float *scratch = malloc((size_t)scratch_size(n) * sizeof *scratch);
#pragma omp for schedule(dynamic)
    for (int64_t r = 0; r < rows; r++) {
        float *row = weights + r * n;
        double *sums = block_sums + r * blocks;
        const int64_t from = source ? source[r] : r;
        if (from < 0) {
            memset(sums, 0, (size_t)blocks * sizeof *sums);
            continue;
        }
        const float *x = float_row(logits, dtype, from, n, row); /* converted in place of the weights */
        if (temperature[r] < greedy_below) {
            const int64_t best = row_argmax(x, n);
            memset(row, 0, (size_t)n * sizeof *row);
            memset(sums, 0, (size_t)blocks * sizeof *sums);
            row[best] = 1.0f;
            sums[best / block] = 1.0;
            continue;
        }
        weigh_dense(x, n, temperature[r], top_k[r], top_p[r], min_p ? min_p + r : NULL, rtol, block, row, scratch, sums);
    }
    free(scratch);
    }
}

/* Index of the largest value of each row of values [rows, n] of `dtype`: lowest index on ties, NaN never
 * wins (0 if nothing beats -inf). */
CLONES void argmax_rows(const void *values, int dtype, int64_t rows, int64_t n, int64_t *out) {
#pragma omp parallel if (rows > 1 && rows * n >= PARALLEL_WORK)
    {
    float *buffer = dtype == FLOAT32 ? NULL : malloc((size_t)n * sizeof *buffer);
#pragma omp for schedule(dynamic)
    for (int64_t r = 0; r < rows; r++) out[r] = row_argmax(float_row(values, dtype, r, n, buffer), n);
    free(buffer);
    }
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

/* For each row of values [rows, n] of `dtype` in use (in_use[r] != 0; every row when in_use is NULL):
 * flags[r] = 1 if it holds NaN or +inf, | 2 if it holds a value other than -inf; 0 for a row not in use.
 * One streaming pass over the rows in use, spread over threads. */
CLONES void scan_rows(const void *values, int dtype, int64_t rows, int64_t n, const uint8_t *in_use, uint8_t *flags_out) {
#pragma omp parallel for schedule(static) if (rows > 1 && rows * n >= PARALLEL_WORK)
    for (int64_t r = 0; r < rows; r++) {
        uint8_t flags = 0;
        if (in_use && !in_use[r]) {
            flags_out[r] = 0;
            continue;
        }
        if (dtype == FLOAT32)
            SCAN_ROW(32, (const uint32_t *)values + r * n, n, 0x7f800000u, 0xff800000u);
        else if (dtype == BFLOAT16)
            SCAN_ROW(16, (const uint16_t *)values + r * n, n, 0x7f80u, 0xff80u);
        else
            SCAN_ROW(16, (const uint16_t *)values + r * n, n, 0x7c00u, 0xfc00u);
        flags_out[r] = flags;
    }
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

/* Inverse-CDF draw per row from kept weights with one uniform (see draw). block_sums [rows, ceil(n / block)]
 * as written by weigh_rows; out: ids. */
CLONES void sample_rows(const float *weights, int64_t rows, int64_t n, const double *block_sums, int64_t block,
                        const double *uniforms, int64_t *out) {
    const int64_t blocks = (n + block - 1) / block;
#pragma omp parallel for schedule(dynamic) if (rows > 1 && rows * block >= PARALLEL_WORK)
    for (int64_t r = 0; r < rows; r++)
        out[r] = draw(weights + r * n, NULL, 0, NULL, 1.0f, -1, n, block, block_sums + r * blocks, uniforms[r]);
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
 * two levels (draw). For `requests` requests of `positions` drafted positions each, the
 * weights of position j of request r at row r * weight_positions + j of weights [.., n] float32 and of
 * weight_sums [.., ceil(n / block)] (their block sums); draft_probs [requests, positions, n] of draft_dtype;
 * mass (the weights' sums), uniforms: double, draft, mode: [requests, positions]; out: ids, same shape. */
CLONES void recover_rows(const float *weights, const double *weight_sums, const double *mass, const void *draft_probs,
                         int draft_dtype, const int64_t *draft, const int32_t *mode, const double *uniforms, int64_t requests,
                         int64_t positions, int64_t weight_positions, int64_t n, int64_t block, int64_t *out) {
    const int64_t blocks = (n + block - 1) / block, rows = requests * positions;
#pragma omp parallel if (rows > 1 && rows * n >= PARALLEL_WORK)
    {
    double *sums = malloc((size_t)blocks * sizeof *sums);
    float *buffer = draft_dtype == FLOAT32 ? NULL : malloc((size_t)n * sizeof *buffer);
#pragma omp for schedule(dynamic)
    for (int64_t r = 0; r < rows; r++) {
        const int64_t weight_row = (r / positions) * weight_positions + r % positions;
        const float *w = weights + weight_row * n, *q = float_row(draft_probs, draft_dtype, r, n, buffer);
        out[r] = recover(w, NULL, 0, q, weight_sums + weight_row * blocks, mass[r], draft[r], mode[r], uniforms[r], n,
                         block, sums);
    }
    free(sums);
    free(buffer);
    }
}

/* Margin below the k-th largest scaled logit y = (x - max x) / T within which tokens stay candidates for
 * the kept set of a top-k row: exp_nonpositive is within a few ulp of exp (relative 1e-6 at most) where
 * y >= SPARSE_LOWEST, so a token more than this below the k-th in y weighs less than each of the k
 * largest, whatever the rounding. */
#define CANDIDATE_MARGIN 1e-3f
/* The k-th largest y from which a top-k row is weighed sparsely (below, subnormal weights: dense). */
#define SPARSE_LOWEST -80.0f

/* One row's truncated weights as weigh_rows makes them, held sparsely where that can be done without a
 * pass of exp over the row: a greedy row is one-hot at its argmax, and a row with 0 < k <= HEAP_LIMIT
 * finds the k largest raw logits (exp is monotone, so they are the tokens of the k largest weights) in
 * one streaming pass of stripe maxima (stripe_maxima), the k-th largest of which is a floor for them, then
 * a heap over the few stripes above it (in cache); it weighs only the candidates within CANDIDATE_MARGIN
 * of the k-th: those hold every weight >= the k-th, and the k-th, the nucleus and the kept set are
 * computed from them exactly as the dense path computes them from the whole row. Returns the number of
 * tokens kept, their ids (ascending) in ids[] and weights in kept[] (at most `capacity`: room for n in
 * both), or -1 where the row was weighed densely into row[n] (weigh_dense; x may be row). Writes the block
 * sums to sums[ceil(n / block)], bit for bit those of the dense row. scratch: scratch_size(n) floats;
 * marks: ceil(n / 64) words. */
CLONES static int64_t weigh_kept(const float *x, int64_t n, float temperature, float greedy_below, int64_t k, float top_p,
                          const float *min_p, double rtol, int64_t block, int64_t capacity, float *row, float *scratch,
                          uint64_t *marks, int32_t *ids, float *kept, double *sums) {
    const int64_t blocks = (n + block - 1) / block;
    if (temperature < greedy_below) {
        const int64_t best = row_argmax(x, n);
        memset(sums, 0, (size_t)blocks * sizeof *sums);
        sums[best / block] = 1.0;
        ids[0] = (int32_t)best;
        kept[0] = 1.0f;
        return 1;
    }
    if (k > 0 && k < n && k <= HEAP_LIMIT && k <= capacity) {
        /* the k-th largest stripe maximum: a floor that at least k logits reach */
        const int64_t stripes = stripes_of(n);
        float *stripe_top = scratch + n;
        stripe_maxima(x, n, stripe_top);
        largest_k(stripe_top, stripes, k < stripes ? k : stripes, scratch);
        largest_k_in_stripes(x, n, k, k <= stripes ? scratch[0] : -INFINITY, stripe_top, scratch);
        float top = -INFINITY;
        for (int64_t i = 0; i < k; i++) top = scratch[i] > top ? scratch[i] : top;
        const float inverse = 1.0f / temperature, kth_y = (scratch[0] - top) * inverse;
        if (isfinite(top) && kth_y >= SPARSE_LOWEST) {
            /* the candidates, marked in a bitmap from the stripes that can hold one, then listed in order */
            const float lowest = kth_y - CANDIDATE_MARGIN;
            const int64_t words = (n + 63) / 64;
            memset(marks, 0, (size_t)words * sizeof *marks);
            for (int64_t s = 0; s < stripes; s++) {
                if (!((stripe_top[s] - top) * inverse >= lowest)) continue;
                for (int64_t i = stripe_start(s), end = stripe_end(s, n); i < end; i += STREAM_LANES)
                    marks[i / 64] |= (uint64_t)((x[i] - top) * inverse >= lowest) << (i % 64);
            }
            int64_t count = 0;
            for (int64_t word = 0; word < words; word++)
                for (uint64_t bits = marks[word]; bits; bits &= bits - 1)
                    ids[count++] = (int32_t)(word * 64 + __builtin_ctzll(bits));
            for (int64_t j = 0; j < count; j++) kept[j] = x[ids[j]];
            for (int64_t j = 0; j < count; j++) kept[j] = exp_nonpositive((kept[j] - top) * inverse);
            memcpy(scratch, kept, (size_t)count * sizeof *kept);
            qsort(scratch, (size_t)count, sizeof *scratch, descending);
            float threshold = scratch[k - 1];
            if (top_p < 1.0f) {
                int64_t at_least = k;
                while (at_least < count && scratch[at_least] >= threshold) at_least++;
                threshold = nucleus_of_largest(scratch, k, at_least, top_p, rtol);
            }
            if (min_p) {
                const float ratio = (float)((double)*min_p * (1.0 - rtol));
                if (ratio > threshold) threshold = ratio;
            }
            int64_t held = 0;
            for (int64_t j = 0; j < count; j++)
                if (kept[j] >= threshold) {
                    ids[held] = ids[j];
                    kept[held++] = kept[j];
                }
            if (held <= capacity) {
                kept_block_sums(ids, kept, NULL, 1.0f, held, n, block, sums);
                return held;
            }
        }
    }
    weigh_dense(x, n, temperature, k, top_p, min_p, rtol, block, row, scratch, sums);
    return -1;
}

/* The draw of an untruncated row (temperature only: no top-k, top-p or min-p; not greedy) without writing
 * its weights out: the block sums of w = exp((x - max) / T), as weigh_dense and keep_at_least make them,
 * in one pass over the logits, then the weights of the one block the draw lands in, written to row (x may
 * be row); returns the token draw gives on the whole row. sums: ceil(n / block) doubles. */
IN_CLONE int64_t draw_untruncated(const float *x, int64_t n, float temperature, int64_t block, double uniform,
                                  float *row, double *sums) {
    float top = row_max(x, n);
    top = isfinite(top) ? top : 0.0f;
    const float inverse = 1.0f / temperature;
    const int64_t blocks = (n + block - 1) / block;
    double total = 0.0;
    for (int64_t start = 0, b = 0; start < n; start += block, b++) {
        const int64_t end = start + block < n ? start + block : n;
        float lanes[16] = {0};
        int64_t i = start;
        for (; i + 15 < end; i += 16)
            for (int lane = 0; lane < 16; lane++) lanes[lane] += exp_nonpositive((x[i + lane] - top) * inverse);
        double sum = 0.0;
        for (; i < end; i++) sum += exp_nonpositive((x[i] - top) * inverse);
        for (int lane = 0; lane < 16; lane++) sum += lanes[lane];
        sums[b] = sum;
        total += sum;
    }
    double before;
    const int64_t chosen = choose_block(sums, blocks, uniform * total, &before);
    if (chosen >= 0)
        for (int64_t i = chosen * block, end = i + block < n ? i + block : n; i < end; i++)
            row[i] = exp_nonpositive((x[i] - top) * inverse);
    return draw(row, NULL, 0, NULL, 1.0f, -1, n, block, sums, uniform);
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

/* The key base s_b of request b (SPEC §4): seeds[b * seeds_step] (0 where seeds is NULL) + offset +
 * b * row_stride, mod 2^64. Per-request seeds: seeds_step 1, offset and row_stride 0; one seed shared by
 * the batch: seeds_step 0 (or seeds NULL and the seed as the offset) and row_stride ROW_STRIDE. */
static inline uint64_t request_seed(const int64_t *seeds, int64_t seeds_step, uint64_t offset, uint64_t row_stride,
                                    int64_t b) {
    return (seeds ? (uint64_t)seeds[b * seeds_step] : 0u) + offset + (uint64_t)b * row_stride;
}

/* The argmax-mode verdicts of `requests` requests (SPEC §3.1, §3.3) from their draws tokens [requests,
 * per_position]: request b accepts its drafts proposed[b, j] (as given: an id outside [0, n) and every
 * position after it is padding, never accepted) while they equal y_bj; first[b] is the first position
 * not accepted (per_position - 1 when all are). */
static void first_rejections(const int64_t *proposed, const int64_t *tokens, int64_t requests, int64_t per_position,
                             int64_t n, int64_t *first) {
    const int64_t drafted = per_position - 1;
    for (int64_t b = 0; b < requests; b++) {
        int64_t j = 0;
        for (; j < drafted; j++) {
            const int64_t d = proposed[b * drafted + j];
            if (d < 0 || d >= n || d != tokens[b * per_position + j]) break;
        }
        first[b] = j;
    }
}

/* The target draws of the stochastic rows of a verifier call (SPEC §2, §4), the weights never written out
 * unless asked for: per row, its truncated weights as weigh_rows makes them (weigh_kept: sparse where it
 * can, else dense in a row of this thread's), then the inverse-CDF draw with the keyed uniform of key
 * s_b + j (request_seed) and `salt` (rng.stream_salt(STREAM_TARGET)), the tokens sample_rows would give.
 * `requests` requests of `per_position` rows each: row r = b * per_position + j of logits [rows, n] of
 * `dtype`; temperature, top_k, top_p, min_p (may be NULL): per request [requests]. Writes tokens
 * [rows]. For argmax-mode verification (first not NULL; proposed: the drafts as given, [requests,
 * per_position - 1]), also first [requests] (first_rejections). For sampled verification (draft not
 * NULL: [requests, per_position - 1], -1 where none), also, at every drafted position (j < per_position -
 * 1): at_draft[b * (per_position - 1) + j], the weight of its draft token (0 where none), and
 * accept_uniforms[same], the uniform of the ratio test (key s_b + j, accept_salt:
 * rng.stream_salt(STREAM_ACCEPT)); block_sums [rows, ceil(n / block)] (every row); and the weights for the
 * recovery: kept_count[r] >= 0 tokens in kept_ids / kept_weights [rows, capacity] (ids ascending), or -1
 * and the whole row in dense [rows, n]. */
CLONES void draw_rows(const void *logits, int dtype, int64_t requests, int64_t per_position, int64_t n,
                      const float *temperature, float greedy_below, const int64_t *top_k, const float *top_p,
                      const float *min_p, double rtol, int64_t block, const int64_t *seeds, int64_t seeds_step,
                      uint64_t seed_offset, uint64_t row_stride, uint64_t salt, const int64_t *proposed,
                      int64_t *first, const int64_t *draft, uint64_t accept_salt, int64_t *tokens, float *at_draft,
                      double *accept_uniforms, double *block_sums, int64_t capacity,
                      int32_t *kept_ids, float *kept_weights, int64_t *kept_count, float *dense) {
    const int64_t blocks = (n + block - 1) / block, rows = requests * per_position, drafted = per_position - 1;
#pragma omp parallel if (rows > 1 && rows * n >= PARALLEL_WORK)
    {
    float *local = malloc((size_t)n * sizeof *local), *kept = malloc((size_t)n * sizeof *kept);
    float *scratch = malloc((size_t)scratch_size(n) * sizeof *scratch);
    uint64_t *marks = malloc((size_t)((n + 63) / 64 + 1) * sizeof *marks);
    int32_t *ids = malloc((size_t)n * sizeof *ids);
    double *own_sums = malloc((size_t)blocks * sizeof *own_sums);
#pragma omp for schedule(dynamic)
    for (int64_t r = 0; r < rows; r++) {
        const int64_t b = r / per_position, j = r % per_position, position = b * drafted + j;
        const uint64_t key = request_seed(seeds, seeds_step, seed_offset, row_stride, b) + (uint64_t)j;
        const int recovers = draft && j < drafted; /* its weights go to the recovery draw */
        float *row = recovers ? dense + r * n : local;
        double *sums = draft ? block_sums + r * blocks : own_sums;
        const float *x = float_row(logits, dtype, r, n, row); /* converted in place of the weights */
        const int untruncated = (top_k[b] <= 0 || top_k[b] >= n) && top_p[b] >= 1.0f && (!min_p || min_p[b] <= 0.0f);
        if (!recovers && untruncated && !(temperature[b] < greedy_below)) {
            tokens[r] = draw_untruncated(x, n, temperature[b], block, keyed_uniform(key, salt), row, sums);
            continue;
        }
        const int64_t count = weigh_kept(x, n, temperature[b], greedy_below, top_k[b], top_p[b],
                                         min_p ? min_p + b : NULL, rtol, block, capacity, row, scratch, marks, ids, kept,
                                         sums);
        const float *w = count < 0 ? row : kept;
        const int32_t *held = count < 0 ? NULL : ids;
        tokens[r] = draw(w, held, count, NULL, 1.0f, -1, n, block, sums, keyed_uniform(key, salt));
        if (!recovers) continue;
        const int64_t d = draft[position];
        at_draft[position] = d >= 0 && d < n ? weight_at(w, held, count, d) : 0.0f;
        accept_uniforms[position] = keyed_uniform(key, accept_salt);
        kept_count[r] = count;
        if (count >= 0) {
            memcpy(kept_ids + r * capacity, ids, (size_t)count * sizeof *ids);
            memcpy(kept_weights + r * capacity, kept, (size_t)count * sizeof *kept);
        }
    }
    free(local);
    free(kept);
    free(scratch);
    free(marks);
    free(ids);
    free(own_sums);
    }
    if (first) first_rejections(proposed, tokens, requests, per_position, n, first);
}

/* recover_rows on the weights draw_rows left for the recovery (kept_count, kept_ids, kept_weights
 * [.., capacity], dense [.., n], block sums weight_sums [.., ceil(n / block)]; position j of request b at
 * row b * (positions + 1) + j of them), a sparse row reading q only at its kept tokens. The uniform of
 * position j is keyed by s_b + j (request_seed) and `salt` (rng.stream_salt(STREAM_RESIDUAL)). draft_probs
 * [requests, positions, n] of draft_dtype; mass: double, draft, mode: [requests, positions]; out: ids,
 * same shape. */
CLONES void recover_kept_rows(const int64_t *kept_count, const int32_t *kept_ids, const float *kept_weights,
                              int64_t capacity, const float *dense, const double *weight_sums, const double *mass,
                              const void *draft_probs, int draft_dtype, const int64_t *draft, const int32_t *mode,
                              const int64_t *seeds, int64_t seeds_step, uint64_t seed_offset, uint64_t row_stride,
                              uint64_t salt, int64_t requests, int64_t positions, int64_t n, int64_t block,
                              int64_t *out) {
    const int64_t blocks = (n + block - 1) / block, rows = requests * positions;
#pragma omp parallel if (rows > 1 && rows * n >= PARALLEL_WORK)
    {
    double *sums = malloc((size_t)blocks * sizeof *sums);
    float *buffer = malloc((size_t)n * sizeof *buffer);
#pragma omp for schedule(dynamic)
    for (int64_t r = 0; r < rows; r++) {
        const int64_t b = r / positions, j = r % positions, weight_row = b * (positions + 1) + j;
        const int64_t count = kept_count[weight_row];
        const double uniform = keyed_uniform(request_seed(seeds, seeds_step, seed_offset, row_stride, b) + (uint64_t)j, salt);
        if (count < 0) {
            const float *q = float_row(draft_probs, draft_dtype, r, n, draft_dtype == FLOAT32 ? NULL : buffer);
            out[r] = recover(dense + weight_row * n, NULL, 0, q, weight_sums + weight_row * blocks, mass[r], draft[r],
                             mode[r], uniform, n, block, sums);
            continue;
        }
        const int32_t *ids = kept_ids + weight_row * capacity;
        for (int64_t t = 0; t < count; t++) buffer[t] = element_of(draft_probs, draft_dtype, r, n, ids[t]);
        out[r] = recover(kept_weights + weight_row * capacity, ids, count, buffer, weight_sums + weight_row * blocks,
                         mass[r], draft[r], mode[r], uniform, n, block, sums);
    }
    free(sums);
    free(buffer);
    }
}

/* The sampled-mode verdicts of a chain call (SPEC §3.2) in one call: draw_rows' draws and kept weights of
 * every row, then at each drafted position j of request b the ratio test on its draft d (the drafts as
 * given, proposed [requests, drafted]: an id outside [0, n) and every position after it is padding),
 * reject iff u * q(d) >= p~(d), with p~(d) = w(d) / mass in float32 (mass: the row's block sums added in
 * block order) and q(d) <= 0 counted as 1 (then the recovery leaves d out); the recovery of
 * recover_kept_rows at every drafted position (from p~ where there is no draft). Keys and params as in
 * draw_rows (accept_salt: STREAM_ACCEPT, residual_salt: STREAM_RESIDUAL); draft_probs [requests, drafted,
 * n] of draft_dtype; dense: room for [rows, n] float32 weights. Writes tokens [rows] (the bonus at
 * j = drafted), recovered [requests, drafted] (the draft where accepted, else the recovery) and first
 * [requests] (the first position not accepted; drafted when all are). */
CLONES void draw_sampled_verdicts(const void *logits, int dtype, int64_t requests, int64_t per_position, int64_t n,
                                const float *temperature, float greedy_below, const int64_t *top_k,
                                const float *top_p, const float *min_p, double rtol, int64_t block,
                                const int64_t *seeds, int64_t seeds_step, uint64_t seed_offset, uint64_t row_stride,
                                uint64_t salt, uint64_t accept_salt, uint64_t residual_salt, const int64_t *proposed,
                                const void *draft_probs, int draft_dtype, float *dense, int64_t capacity,
                                int64_t *tokens, int64_t *recovered, int64_t *first) {
    const int64_t rows = requests * per_position, drafted = per_position - 1, blocks = (n + block - 1) / block;
    const size_t positions = (size_t)(requests * drafted) + 1; /* (+ 1: never a zero-size allocation) */
    int64_t *draft = malloc(positions * sizeof *draft), *drawn = malloc(positions * sizeof *drawn);
    int64_t *kept_count = malloc((size_t)rows * sizeof *kept_count);
    int32_t *mode = malloc(positions * sizeof *mode), *kept_ids = malloc((size_t)(rows * capacity) * sizeof *kept_ids);
    uint8_t *accepted = malloc(positions);
    float *at_draft = malloc(positions * sizeof *at_draft);
    float *kept_weights = malloc((size_t)(rows * capacity) * sizeof *kept_weights);
    double *accept = malloc(positions * sizeof *accept), *mass = malloc(positions * sizeof *mass);
    double *block_sums = malloc((size_t)(rows * blocks) * sizeof *block_sums);
    for (int64_t b = 0; b < requests; b++)
        for (int64_t j = 0, open = 1; j < drafted; j++) {
            const int64_t d = proposed[b * drafted + j];
            open = open && d >= 0 && d < n;
            draft[b * drafted + j] = open ? d : -1;
        }
    draw_rows(logits, dtype, requests, per_position, n, temperature, greedy_below, top_k, top_p, min_p, rtol, block,
              seeds, seeds_step, seed_offset, row_stride, salt, NULL, NULL, draft, accept_salt, tokens, at_draft,
              accept, block_sums, capacity, kept_ids, kept_weights, kept_count, dense);
    for (int64_t b = 0; b < requests; b++) {
        first[b] = drafted;
        for (int64_t j = 0; j < drafted; j++) {
            const int64_t at = b * drafted + j, d = draft[at];
            const double *sums = block_sums + (b * per_position + j) * blocks;
            double total = 0.0;
            for (int64_t t = 0; t < blocks; t++) total += sums[t];
            mass[at] = total;
            const double p_draft = (double)(at_draft[at] / (float)total);
            const double q_draft = d >= 0 ? (double)element_of(draft_probs, draft_dtype, at, n, d) : 0.0;
            const int blind = q_draft <= 0.0;
            accepted[at] = d >= 0 && !(accept[at] * (blind ? 1.0 : q_draft) >= p_draft);
            mode[at] = d < 0 ? FROM_TARGET : blind ? WITHOUT_DRAFT : FROM_RESIDUAL;
            if (!accepted[at] && first[b] == drafted) first[b] = j;
        }
    }
    recover_kept_rows(kept_count, kept_ids, kept_weights, capacity, dense, block_sums, mass, draft_probs, draft_dtype,
                      draft, mode, seeds, seeds_step, seed_offset, row_stride, residual_salt, requests, drafted, n,
                      block, drawn);
    for (int64_t at = 0; at < requests * drafted; at++) recovered[at] = accepted[at] ? draft[at] : drawn[at];
    free(draft);
    free(drawn);
    free(kept_count);
    free(mode);
    free(kept_ids);
    free(accepted);
    free(at_draft);
    free(kept_weights);
    free(accept);
    free(mass);
    free(block_sums);
}

/* The relaxed acceptance of thinking rows (SPEC §3.4) for each drafted position, on p = softmax(x) of
 * the masked logits without temperature: accept iff p(d) > 0, d is among the k most likely tokens
 * (ranked by logit, which orders like p exactly; ties go to the lower id) and p(d) >= p(top-1) - delta.
 * For `requests` requests of `positions` positions each, position j of request r is row
 * r * logit_positions + j of logits [.., n] of `dtype`; draft: [requests, positions] (-1: none);
 * writes accepted (0/1) and top1 (the argmax: lowest id on ties, NaN never wins), [requests, positions]. */
CLONES void relaxed_rows(const void *logits, int dtype, const int64_t *draft, int64_t requests, int64_t positions,
                         int64_t logit_positions, int64_t n, int64_t k, double delta, uint8_t *accepted,
                         int64_t *top1) {
    const int64_t rows = requests * positions;
#pragma omp parallel if (rows > 1 && rows * n >= PARALLEL_WORK)
    {
    float *buffer = dtype == FLOAT32 ? NULL : malloc((size_t)n * sizeof *buffer);
#pragma omp for schedule(dynamic)
    for (int64_t r = 0; r < rows; r++) {
        const float *x = float_row(logits, dtype, (r / positions) * logit_positions + r % positions, n, buffer);
        const int64_t best = row_argmax(x, n), d = draft[r];
        top1[r] = best;
        accepted[r] = 0;
        if (d < 0 || d >= n) continue;
        const float top = x[best], at_draft = x[d];
        int64_t rank = 0;
        for (int64_t i = 0; i < d; i++) rank += x[i] >= at_draft;
        for (int64_t i = d + 1; i < n; i++) rank += x[i] > at_draft;
        if (rank >= k) continue;
        float lanes[16] = {0};
        int64_t i = 0;
        for (; i + 15 < n; i += 16)
            for (int lane = 0; lane < 16; lane++) lanes[lane] += exp_nonpositive(x[i + lane] - top);
        double total = 0.0;
        for (; i < n; i++) total += exp_nonpositive(x[i] - top);
        for (int lane = 0; lane < 16; lane++) total += lanes[lane];
        const double p_draft = exp_nonpositive(at_draft - top) / total, p_top1 = 1.0 / total;
        accepted[r] = p_draft > 0.0 && p_draft >= p_top1 - delta;
    }
    free(buffer);
    }
}
