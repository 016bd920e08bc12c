/* CPU kernels for specverify: per-row exact thresholds by radix selection, and a NaN-safe argmax.
 *
 * Weights are non-negative float32, so their bit patterns order like their values. A small top-k is
 * found with a heap of the k largest in one pass (its nucleus from those k sorted values); otherwise
 * thresholds come from radix selection: one histogram pass over the row, one pass gathering the chosen
 * bucket, then two passes over that bucket alone. Sums run in double in a fixed order, so results do
 * not depend on threads or batch layout. Each call runs on one thread: rows are independent, and the
 * caller splits a batch between threads (ctypes releases the GIL).
 */
#include <stdint.h>
#include <string.h>
#include <math.h>
#include <stdlib.h>

#define FIXED_ONE 1099511627776.0 /* 2^40 */

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

/* The largest value t of the row such that the weight of {v >= t, v >= floor} reaches the target, where
 * a value weighs itself (mass != 0) or 1, and the target is `target`, or `target` times the weight of
 * {v >= floor} when `fraction` != 0. Returns 0 when the whole weight is below the target.
 * Radix selection: a histogram of the top 12 bits over the row, then the values of the chosen bucket
 * are gathered into `scratch` (room for n values) and resolved on the next 10 and 10 bits. */
static float select_threshold(const float *row, int64_t n, int mass, float floor_value, double target, int fraction,
                              float *scratch) {
    const uint32_t floor_bits = bits_of(floor_value);
    /* The first pass counts mass in fixed point (units of 2^-40, exact and fast integer adds; a weight
     * below 2^-40 of the largest adds nothing), in two histograms to halve the chains of dependent adds. */
    uint64_t fixed[1024], odd[1024];
    memset(fixed, 0, sizeof fixed);
    memset(odd, 0, sizeof odd);
    int64_t i = 0;
    for (; i + 1 < n; i += 2) {
        const uint32_t a = bits_of(row[i]), b = bits_of(row[i + 1]);
        if (a >= floor_bits) fixed[(a >> 20) & 1023u] += mass ? (uint64_t)(int64_t)(row[i] * (float)FIXED_ONE) : 1u;
        if (b >= floor_bits) odd[(b >> 20) & 1023u] += mass ? (uint64_t)(int64_t)(row[i + 1] * (float)FIXED_ONE) : 1u;
    }
    if (i < n && bits_of(row[i]) >= floor_bits) fixed[(bits_of(row[i]) >> 20) & 1023u] += mass ? (uint64_t)(int64_t)(row[i] * (float)FIXED_ONE) : 1u;
    double hist[1024], total = 0.0;
    for (int bucket = 0; bucket < 1024; bucket++) {
        hist[bucket] = (double)(fixed[bucket] + odd[bucket]) / (mass ? FIXED_ONE : 1.0);
        total += hist[bucket];
    }
    if (fraction) target *= total;
    double above = 0.0;
    int chosen = 1023;
    while (chosen >= 0 && above + hist[chosen] < target) above += hist[chosen--];
    if (chosen < 0) return 0.0f;
    uint32_t prefix = (uint32_t)chosen;
    int64_t count = 0;
    for (int64_t i = 0; i < n; i++) {
        const uint32_t b = bits_of(row[i]);
        if (b >= floor_bits && ((b >> 20) & 1023u) == prefix) scratch[count++] = row[i];
    }
    for (int shift = 10; shift >= 0; shift -= 10) {
        memset(hist, 0, sizeof hist);
        for (int64_t i = 0; i < count; i++) hist[(bits_of(scratch[i]) >> shift) & 1023u] += mass ? (double)scratch[i] : 1.0;
        chosen = 1023;
        while (chosen > 0 && above + hist[chosen] < target) above += hist[chosen--];
        /* chosen == 0 without reaching: rounding between levels, keep the whole bucket */
        int64_t kept = 0;
        for (int64_t i = 0; i < count; i++)
            if (((bits_of(scratch[i]) >> shift) & 1023u) == (uint32_t)chosen) scratch[kept++] = scratch[i];
        count = kept;
        prefix = (prefix << 10) | (uint32_t)chosen;
    }
    return float_of(prefix);
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

/* Sum of the values >= threshold (NaN counts 0): eight float lanes (vectorised), added in double. */
static double mass_at_least(const float *row, int64_t n, float threshold) {
    float lanes[8] = {0};
    int64_t i = 0;
    for (; i + 7 < n; i += 8)
        for (int lane = 0; lane < 8; lane++) lanes[lane] += row[i + lane] >= threshold ? row[i + lane] : 0.0f;
    double sum = 0.0;
    for (; i < n; i++) sum += row[i] >= threshold ? row[i] : 0.0f;
    for (int lane = 0; lane < 8; lane++) sum += lanes[lane];
    return sum;
}

/* The k largest values of the row, left in heap[0..k) (a min-heap: heap[0] is the k-th largest). */
static void largest_k(const float *row, int64_t n, int64_t k, float *heap) {
    for (int64_t i = 0; i < k; i++) heap[i] = row[i] >= 0.0f ? row[i] : 0.0f;
    for (int64_t i = k / 2 - 1; i >= 0; i--) sift_down(heap, k, i);
    for (int64_t i = k; i < n; i++)
        if (row[i] > heap[0]) {
            heap[0] = row[i];
            sift_down(heap, k, 0);
        }
}

static int descending(const void *a, const void *b) {
    const float x = *(const float *)a, y = *(const float *)b;
    return (x < y) - (x > y);
}

/* Below this top_k, a heap of the k largest beats radix selection. */
#define HEAP_LIMIT 4096

/* The kept-set threshold of one row: max(k-th largest, nucleus threshold on the top-k-renormalised row). */
static float row_threshold(const float *row, int64_t n, int64_t k, float top_p, double rtol, float *scratch) {
    const int limited = k > 0 && k < n;
    if (!limited && top_p >= 1.0f) return 0.0f;
    if (limited && k <= HEAP_LIMIT) {
        largest_k(row, n, k, scratch);
        const float kth = scratch[0];
        if (top_p >= 1.0f) return kth;
        int64_t at_least = 0; /* more than k when values tie with the k-th beyond the heap */
        for (int64_t i = 0; i < n; i++) at_least += row[i] >= kth;
        double kept = (double)(at_least - k) * kth;
        qsort(scratch, (size_t)k, sizeof *scratch, descending);
        for (int64_t i = k - 1; i >= 0; i--) kept += scratch[i];
        const double target = (double)top_p * kept * (1.0 - rtol);
        double acc = 0.0;
        for (int64_t i = 0; i < k; i++) {
            acc += scratch[i];
            if (acc >= target) return scratch[i];
        }
        return kth; /* only ties with the k-th beyond the heap complete the mass */
    }
    float threshold = limited ? select_threshold(row, n, 0, 0.0f, (double)k, 0, scratch) : 0.0f;
    if (top_p < 1.0f) {
        const float nucleus = select_threshold(row, n, 1, threshold, (double)top_p * (1.0 - rtol), 1, scratch);
        if (nucleus > threshold) threshold = nucleus;
    }
    return threshold;
}

/* Truncate each row of weights in place (SPEC §2 steps 3-5): zero every weight below
 * max(k-th largest, nucleus threshold on the top-k-renormalised row, min_p), and NaN or negative ones.
 * The largest weight of a row is 1. top_k <= 0 or >= n: no limit; top_p >= 1: no nucleus; min_p may be
 * NULL. Also writes the sum of each block of `block` kept weights: block_sums [rows, ceil(n / block)]. */
void truncate_rows(float *weights, int64_t rows, int64_t n, const int64_t *top_k, const float *top_p,
                   const float *min_p, double rtol, int64_t block, double *block_sums) {
    float *scratch = malloc((size_t)n * sizeof *scratch);
    const int64_t blocks = (n + block - 1) / block;
    for (int64_t r = 0; r < rows; r++) {
        float *row = weights + r * n;
        float threshold = row_threshold(row, n, top_k[r], top_p[r], rtol, scratch);
        if (min_p) {
            const float ratio = (float)((double)min_p[r] * (1.0 - rtol));
            if (ratio > threshold) threshold = ratio;
        }
        for (int64_t b = 0; b < blocks; b++) {
            const int64_t start = b * block, end = start + block < n ? start + block : n;
            for (int64_t i = start; i < end; i++)
                if (!(row[i] >= threshold)) row[i] = 0.0f;
            block_sums[r * blocks + b] = mass_at_least(row + start, end - start, 0.0f);
        }
    }
    free(scratch);
}

/* Index of the largest value of each row: lowest index on ties, NaN never wins (0 if nothing beats
 * -inf). Two vectorisable passes: the largest value (a comparison with NaN is false, so NaN is skipped),
 * then the first index holding it. */
void argmax_rows(const float *values, int64_t rows, int64_t n, int64_t *out) {
    for (int64_t r = 0; r < rows; r++) {
        const float *row = values + r * n;
        float lanes[8] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY};
        int64_t i = 0;
        for (; i + 7 < n; i += 8)
            for (int lane = 0; lane < 8; lane++) lanes[lane] = row[i + lane] > lanes[lane] ? row[i + lane] : lanes[lane];
        float best = -INFINITY;
        for (; i < n; i++) best = row[i] > best ? row[i] : best;
        for (int lane = 0; lane < 8; lane++) best = lanes[lane] > best ? lanes[lane] : best;
        int64_t index = 0;
        for (i = 0; i < n; i++)
            if (row[i] == best) {
                index = i;
                break;
            }
        out[r] = index;
    }
}

/* Inverse-CDF draw per row from kept weights with one uniform: the block whose cumulative sum passes
 * u * total, then the token inside it (only positive weights can be drawn; rounding falls back to the
 * last positive one). block_sums [rows, ceil(n / block)] as written by truncate_rows; out: ids. */
void sample_rows(const float *weights, int64_t rows, int64_t n, const double *block_sums, int64_t block,
                 const double *uniforms, int64_t *out) {
    const int64_t blocks = (n + block - 1) / block;
    for (int64_t r = 0; r < rows; r++) {
        const float *row = weights + r * n;
        const double *sums = block_sums + r * blocks;
        double total = 0.0;
        for (int64_t b = 0; b < blocks; b++) total += sums[b];
        const double target = uniforms[r] * total;
        double before = 0.0;
        int64_t chosen = -1, last_positive = -1;
        for (int64_t b = 0; b < blocks; b++) {
            if (!(sums[b] > 0.0)) continue;
            last_positive = b;
            if (before + sums[b] > target) {
                chosen = b;
                break;
            }
            before += sums[b];
        }
        if (chosen < 0) chosen = last_positive;
        int64_t token = 0;
        if (chosen >= 0) {
            const int64_t end = (chosen + 1) * block < n ? (chosen + 1) * block : n;
            double acc = before;
            for (int64_t i = chosen * block; i < end; i++) {
                if (!(row[i] > 0.0f)) continue;
                token = i;
                acc += row[i];
                if (acc > target) break;
            }
        }
        out[r] = token;
    }
}
