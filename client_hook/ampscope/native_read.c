/* The fused per-layer read of CPU gradients in C (ampscope/native_read.py).

   For every layer, the (8,) float64 partials row of partials.tensor_partials and, when asked, the
   exponent-histogram counts of histogram.tensor_histogram, from one read of the gradient's memory
   (a few loops over each block of it, docs/hook-cost.md#the-c-loop): the
   same integer classes of |raw|'s float32 bit pattern, so counts, amax and amin are equal to the
   bit; the float64 sum of squares is summed in vector lanes, in another order
   (-fassociative-math), as inductor's kernel sums it. Everything is integer arithmetic on bit
   patterns but that sum: a process that flushes subnormals to zero (DAZ) changes nothing but
   the squares of subnormals. No allocation, no global state: safe from any thread. */

#include <stdint.h>
#include <string.h>

#define INF_BITS 0x7F800000
#define MAX_FINITE_BITS 0x7F7FFFFF
#define MANT_BITS 23
#define MANT_MASK 0x7FFFFF
#define NUM_COLUMNS 8
/* Elements per block: each loop after the first over a block (the sum of squares, the
   histogram) reads it again from the core's L1 or L2 (32 KiB of float32), not from memory. */
#define BLOCK 8192

enum { DTYPE_FLOAT32 = 0, DTYPE_FLOAT16 = 1, DTYPE_BFLOAT16 = 2 };

/* |x| of element i as a float32 bit pattern (exact for the three dtypes). */
static inline int32_t float32_bits(const void *x, int64_t i) {
    int32_t b;
    memcpy(&b, (const char *)x + 4 * i, 4);
    return b & 0x7FFFFFFF;
}

static inline int32_t bfloat16_bits(const void *x, int64_t i) {
    uint16_t h;
    memcpy(&h, (const char *)x + 2 * i, 2);
    return (int32_t)(h & 0x7FFF) << 16;
}

static inline int32_t float16_bits(const void *x, int64_t i) {
    uint16_t h;
    memcpy(&h, (const char *)x + 2 * i, 2);
    int32_t e = (h >> 10) & 0x1F, m = h & 0x3FF;
    /* A float16 subnormal m * 2^-24 is a normal float32: the product is exact, no DAZ. */
    float sub = (float)m * 0x1p-24f;
    int32_t sub_bits;
    memcpy(&sub_bits, &sub, 4);
    int32_t normal = ((e + 112) << MANT_BITS) | (m << 13);
    int32_t special = INF_BITS | (m << 13);
    return e == 0 ? sub_bits : (e == 31 ? special : normal);
}

struct partials {
    int64_t zeros, finite, not_nan, under, normal;
    int32_t amax, key; /* bit patterns: the largest finite |x|; min over (b - 1) & 0x7FFFFFFF */
    double sumsq;
};

/* Accumulate n elements into acc in two loops, the counts' and the sum of squares': as one,
   their accumulators and constants outnumber AVX2's sixteen vector registers, and the spills ran
   it 2.5x slower than the two (docs/hook-cost.md#the-c-loop). The caller passes blocks that the
   second loop reads again from L1. */
#define PARTIALS_PASS(NAME, LOAD)                                                              \
    static void NAME(const void *restrict x, int64_t n, int32_t under, int32_t normal,        \
                     struct partials *restrict acc) {                                         \
        int32_t zeros = 0, finite = 0, not_nan = 0, below_under = 0, below_normal = 0;       \
        int32_t top = 0, low = 0x7FFFFFFF;                                                     \
        for (int64_t i = 0; i < n; i++) {                                                      \
            int32_t b = LOAD(x, i);                                                            \
            zeros += b < 1;                                                                    \
            finite += b < INF_BITS;                                                            \
            not_nan += b < INF_BITS + 1;                                                       \
            below_under += b < under;                                                          \
            below_normal += b < normal;                                                        \
            int32_t fb = b < INF_BITS ? b : 0; /* finite magnitudes; non-finite: 0 */         \
            top = fb > top ? fb : top;                                                         \
            int32_t k = (b - 1) & 0x7FFFFFFF; /* zeros sort last */                           \
            low = k < low ? k : low;                                                           \
        }                                                                                      \
        double sum = 0.0;                                                                      \
        for (int64_t i = 0; i < n; i++) {                                                      \
            int32_t b = LOAD(x, i);                                                            \
            int32_t fb = b < INF_BITS ? b : 0;                                                 \
            float v;                                                                           \
            memcpy(&v, &fb, 4);                                                                \
            sum += (double)v * (double)v;                                                      \
        }                                                                                      \
        acc->zeros += zeros;                                                                   \
        acc->finite += finite;                                                                 \
        acc->not_nan += not_nan;                                                               \
        acc->under += below_under;                                                             \
        acc->normal += below_normal;                                                           \
        if (top > acc->amax) acc->amax = top;                                                  \
        if (low < acc->key) acc->key = low;                                                    \
        acc->sumsq += sum;                                                                     \
    }

/* The histogram bin of one magnitude pattern b: [0] zero, [1] NaN or inf, [2] below
   2^min_exp, then one bin per exponent of b / s, the last also every larger one. es, mb: the
   scale's frexp exponent and mantissa bound as bits (histogram.scale_bits). Branch-free, so that
   the compiler vectorises it. */
static inline int32_t bin(int32_t b, int32_t es, int32_t mb, int32_t min_exp, int32_t bins) {
    /* A subnormal's pattern b is its value in units of 2^-149; (float)b is exact (b < 2^23)
       and normal, with the subnormal's leading one and fraction: 2^(p - 149) for its 2^p. */
    float lifted = (float)b;
    int32_t lb;
    memcpy(&lb, &lifted, 4);
    int32_t sub = b < (1 << MANT_BITS);
    int32_t exp = sub ? (lb >> MANT_BITS) - 127 - 148 : (b >> MANT_BITS) - 126;
    int32_t frac = (sub ? lb : b) & MANT_MASK;
    int32_t k = exp - es - (frac < mb) - (min_exp - 3);
    k = k < 2 ? 2 : (k > bins - 1 ? bins - 1 : k);
    return b == 0 ? 0 : (b >= INF_BITS ? 1 : k);
}

/* Count n (at most BLOCK) elements into counts[0..bins): the bins in one vectorised loop,
   then the increments, over four tables (one per element mod 4) so that consecutive increments
   of one bin, which gradients crowd into, do not wait on each other. */
#define HISTOGRAM_PASS(NAME, LOAD)                                                             \
    static void NAME(const void *restrict x, int64_t n, int32_t es, int32_t mb,              \
                     int32_t min_exp, int32_t bins, int64_t *restrict counts) {               \
        uint8_t bins_of[BLOCK];                                                                \
        int32_t lanes[4][256] = {{0}};                                                         \
        for (int64_t i = 0; i < n; i++)                                                        \
            bins_of[i] = (uint8_t)bin(LOAD(x, i), es, mb, min_exp, bins);                      \
        int64_t i = 0;                                                                         \
        for (; i + 4 <= n; i += 4)                                                             \
            for (int j = 0; j < 4; j++) lanes[j][bins_of[i + j]]++;                            \
        for (; i < n; i++) lanes[0][bins_of[i]]++;                                             \
        for (int32_t k = 0; k < bins; k++)                                                     \
            counts[k] += (int64_t)lanes[0][k] + lanes[1][k] + lanes[2][k] + lanes[3][k];       \
    }

PARTIALS_PASS(partials_float32, float32_bits)
PARTIALS_PASS(partials_float16, float16_bits)
PARTIALS_PASS(partials_bfloat16, bfloat16_bits)
HISTOGRAM_PASS(histogram_float32, float32_bits)
HISTOGRAM_PASS(histogram_float16, float16_bits)
HISTOGRAM_PASS(histogram_bfloat16, bfloat16_bits)

typedef void (*partials_pass)(const void *restrict, int64_t, int32_t, int32_t,
                              struct partials *restrict);
typedef void (*histogram_pass)(const void *restrict, int64_t, int32_t, int32_t, int32_t,
                               int32_t, int64_t *restrict);
static const partials_pass PARTIALS[] = {partials_float32, partials_float16, partials_bfloat16};
static const histogram_pass HISTOGRAMS[] = {histogram_float32, histogram_float16,
                                            histogram_bfloat16};
static const int64_t ITEM_SIZE[] = {4, 2, 2};

static double pattern_value(int32_t bits) {
    float v;
    memcpy(&v, &bits, 4);
    return (double)v;
}

/* One present layer's row (and histogram counts, when bins > 0) into out. */
static void layer(const void *x, int64_t n, int8_t dtype, int32_t under, int32_t normal,
                  int32_t es, int32_t mb, int32_t min_exp, int32_t bins, double *out) {
    struct partials acc = {0, 0, 0, 0, 0, 0, 0x7FFFFFFF, 0.0};
    int64_t counts[256] = {0};
    for (int64_t start = 0; start < n; start += BLOCK) {
        const void *at = (const char *)x + ITEM_SIZE[dtype] * start;
        int64_t len = n - start < BLOCK ? n - start : BLOCK;
        PARTIALS[dtype](at, len, under, normal, &acc);
        if (bins > 0) HISTOGRAMS[dtype](at, len, es, mb, min_exp, bins, counts);
    }
    int32_t amin = (acc.key < MAX_FINITE_BITS ? acc.key : MAX_FINITE_BITS) + 1;
    out[0] = (double)acc.zeros;
    out[1] = (double)(n - acc.not_nan);
    out[2] = (double)(acc.not_nan - acc.finite);
    out[3] = (double)acc.under;
    out[4] = (double)acc.normal;
    out[5] = acc.sumsq;
    out[6] = pattern_value(acc.amax);
    out[7] = pattern_value(amin); /* +inf when no finite non-zero element */
    for (int32_t k = 0; k < bins; k++) out[NUM_COLUMNS + k] = (double)counts[k];
}

/* The (layers, 8 + bins) float64 table of one layout into out (row-major).
   grads: the present gradients' addresses, each dense (its numel elements, in any order);
   slots[i]: layer i's index in grads, or -1 when its gradient is None (PyTorch: numels[i]
   zeros); scaled[i]: judged as stored against (under, normal), with the histogram divided by
   the scale (es_mb); else against the runtime *under_bits, *normal_bits, the histogram in the
   units stored. bins: 0 for no histogram, at most 256. Returns 0, or -1 for bad arguments. */
int ampscope_rows(int64_t layers, const int64_t *grads, const int64_t *slots,
                  const int64_t *numels, const int8_t *dtypes, const int8_t *scaled,
                  int32_t under, int32_t normal, const int32_t *under_bits,
                  const int32_t *normal_bits, const int32_t *es_mb, int32_t min_exp,
                  int32_t bins, double *out) {
    if (bins < 0 || bins > 256) return -1;
    const int64_t width = NUM_COLUMNS + bins;
    for (int64_t i = 0; i < layers; i++) {
        double *row = out + width * i;
        int64_t n = numels[i];
        if (slots[i] < 0) { /* partials.absent; the histogram's n zeros */
            const double absent[NUM_COLUMNS] = {(double)n, 0, 0, (double)n, (double)n, 0, 0,
                                                pattern_value(INF_BITS)};
            memcpy(row, absent, sizeof absent);
            for (int32_t k = 0; k < bins; k++) row[NUM_COLUMNS + k] = k == 0 ? (double)n : 0.0;
            continue;
        }
        if (dtypes[i] < DTYPE_FLOAT32 || dtypes[i] > DTYPE_BFLOAT16) return -1;
        const void *x = (const void *)(intptr_t)grads[slots[i]];
        if (scaled[i])
            layer(x, n, dtypes[i], under, normal, es_mb[0], es_mb[1], min_exp, bins, row);
        else
            layer(x, n, dtypes[i], *under_bits, *normal_bits, 1, 0, min_exp, bins, row);
    }
    return 0;
}
