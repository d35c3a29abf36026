/* The fused per-layer read of CPU gradients in C (ampscope/native_read.py).

   ampscope_rows: for every layer, the (8,) float64 partials row of partials.tensor_partials and,
   when asked, the exponent-histogram counts of histogram.tensor_histogram, from one read of the
   gradient's memory (a few loops over each block of it, docs/hook-cost.md#the-c-loop): the same
   integer classes of |raw|'s float32 bit pattern, so counts, amax and amin are equal to the bit;
   the float64 sum of squares is summed in vector lanes, in another order (-fassociative-math),
   as inductor's kernel sums it. Everything is integer arithmetic on bit patterns but that sum: a
   process that flushes subnormals to zero (DAZ) changes nothing but the squares of subnormals.

   ampscope_norms: every gradient's L2 norm, its squares summed in float64 (NaN if it holds a
   NaN, else +inf if it holds an inf): the every-step read.

   ampscope_unscale_norms: the same norms of float32 gradients, read in GradScaler's unscale,
   which the norms' loop does too: each element multiplied by the inverse scale in place and any
   NaN or inf noted in found_inf, as torch's _amp_foreach_non_finite_check_and_unscale_ does
   (one IEEE product per element: the same bits), so that the every-step norms add no pass over
   the gradients (docs/hook-cost.md#the-norms-in-the-unscale).

   Both cut the gradients into chunks of one layer, which up to `threads` threads read
   (docs/hook-cost.md#the-c-loop-on-several-threads); each chunk's result has a slot of its own,
   folded into its layer in chunk order, so the answer does not depend on which thread read what
   (the float64 sums' order follows the cut, which the thread count sets). Nothing global: safe
   from any thread. */

#include <math.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define INF_BITS 0x7F800000
#define MAX_FINITE_BITS 0x7F7FFFFF
#define MANT_BITS 23
#define MANT_MASK 0x7FFFFF
#define NUM_COLUMNS 8
/* Elements per block: each loop after the first over a block (the sum of squares, the
   histogram) reads it again from the core's L1 or L2 (32 KiB of float32), not from memory. */
#define BLOCK 8192
/* Elements per chunk, the unit of work a thread takes: small enough that a thread that is
   descheduled holds the others back by one chunk at most, large enough that taking one costs
   nothing next to reading it. */
#define CHUNK (8 * BLOCK)
#define MAX_THREADS 64
/* at::internal::GRAIN_SIZE: torch's elementwise kernels run a tensor of fewer elements on one
   thread, and cut a larger one into at most one part per this many (plan). */
#define GRAIN 32768

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

/* The float64 sum of VALUE² over the n elements, VALUE an expression of their magnitude
   pattern b. */
#define SUM_OF_SQUARES(LOAD, VALUE)                                                            \
    double sum = 0.0;                                                                          \
    for (int64_t i = 0; i < n; i++) {                                                          \
        int32_t b = LOAD(x, i);                                                                \
        int32_t value = VALUE;                                                                 \
        float v;                                                                               \
        memcpy(&v, &value, 4);                                                                 \
        sum += (double)v * (double)v;                                                          \
    }                                                                                          \
    return sum

/* Accumulate n elements into acc in two loops, the counts' and the sum of squares': as one,
   their accumulators and constants outnumber AVX2's sixteen vector registers, and the spills ran
   it 2.5x slower than the two (docs/hook-cost.md#the-c-loop). The caller passes blocks that the
   second loop reads again from L1. */
#define PARTIALS_PASS(NAME, LOAD, SQUARES)                                                     \
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
        double sum = SQUARES(x, n);                                                            \
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

/* The sum of squares of n elements: all (NAME), or the finite ones' (finite_NAME). */
#define SQUARES_PASS(NAME, LOAD)                                                               \
    static double NAME(const void *restrict x, int64_t n) { SUM_OF_SQUARES(LOAD, b); }        \
    static double finite_##NAME(const void *restrict x, int64_t n) {                          \
        SUM_OF_SQUARES(LOAD, b < INF_BITS ? b : 0);                                            \
    }

/* The float64 sum of squares of n float32 values as they were, each then multiplied by inv in
   place (left as it is when inv is 1, as torch's kernel leaves it); *bad: whether any was NaN or
   ±inf. */
static double unscale_float32(float *restrict x, int64_t n, float inv, uint8_t *restrict bad) {
    double sum = 0.0;
    int32_t nonfinite = 0;
    if (inv == 1.0f) {
        for (int64_t i = 0; i < n; i++) {
            float v = x[i];
            nonfinite |= float32_bits(x, i) >= INF_BITS;
            sum += (double)v * (double)v;
        }
    } else {
        for (int64_t i = 0; i < n; i++) {
            float v = x[i];
            nonfinite |= float32_bits(x, i) >= INF_BITS;
            sum += (double)v * (double)v;
            x[i] = v * inv;
        }
    }
    *bad = nonfinite != 0;
    return sum;
}

SQUARES_PASS(squares_float32, float32_bits)
SQUARES_PASS(squares_float16, float16_bits)
SQUARES_PASS(squares_bfloat16, bfloat16_bits)
PARTIALS_PASS(partials_float32, float32_bits, finite_squares_float32)
PARTIALS_PASS(partials_float16, float16_bits, finite_squares_float16)
PARTIALS_PASS(partials_bfloat16, bfloat16_bits, finite_squares_bfloat16)
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

typedef double (*squares_pass)(const void *restrict, int64_t);
static const squares_pass SQUARES[] = {squares_float32, squares_float16, squares_bfloat16};

static double pattern_value(int32_t bits) {
    float v;
    memcpy(&v, &bits, 4);
    return (double)v;
}

/* One chunk: elements [start, start + len) of a layer. */
struct chunk {
    int64_t layer, start, len;
    int32_t owner; /* the thread that reads it first (see plan) */
};

/* What one call reads, and where each chunk's result goes. */
struct job {
    struct chunk *chunks;
    int64_t count;
    atomic_char *taken; /* per chunk: read by some thread already */
    const void *const *x; /* each layer's memory (NULL: absent) */
    const int8_t *dtypes;
    /* ampscope_rows: the layer's class bounds and histogram scale; NULL for the norms */
    const int32_t *bounds; /* under, normal, es, mb per layer */
    int32_t min_exp, bins;
    struct partials *partials; /* per chunk */
    atomic_llong *counts;      /* per layer, bins each */
    double *squares;           /* ampscope_norms: per chunk */
    /* ampscope_unscale_norms: per chunk, whether it held a NaN or inf (NULL: no unscale); the
       inverse scale */
    uint8_t *bad;
    float inv;
};

static void read_chunk(struct job *job, int64_t k) {
    const struct chunk c = job->chunks[k];
    const int8_t dtype = job->dtypes[c.layer];
    const void *at = (const char *)job->x[c.layer] + ITEM_SIZE[dtype] * c.start;
    if (job->bad != NULL) { /* the caller's gradients, writable: the unscale writes them */
        job->squares[k] = unscale_float32((float *)at, c.len, job->inv, &job->bad[k]);
        return;
    }
    if (job->squares != NULL) {
        job->squares[k] = SQUARES[dtype](at, c.len);
        return;
    }
    const int32_t *b = job->bounds + 4 * c.layer;
    struct partials acc = {0, 0, 0, 0, 0, 0, 0x7FFFFFFF, 0.0};
    int64_t counts[256] = {0};
    for (int64_t start = 0; start < c.len; start += BLOCK) {
        const void *block = (const char *)at + ITEM_SIZE[dtype] * start;
        int64_t len = c.len - start < BLOCK ? c.len - start : BLOCK;
        PARTIALS[dtype](block, len, b[0], b[1], &acc);
        if (job->bins > 0) HISTOGRAMS[dtype](block, len, b[2], b[3], job->min_exp, job->bins,
                                             counts);
    }
    job->partials[k] = acc;
    atomic_llong *into = job->counts + (int64_t)job->bins * c.layer;
    for (int32_t i = 0; i < job->bins; i++)
        if (counts[i]) atomic_fetch_add_explicit(into + i, counts[i], memory_order_relaxed);
}

/* Thread `index`'s part of the read: its own chunks, then whatever no thread has started. */
static void work(struct job *job, int32_t index) {
    for (int64_t k = 0; k < job->count; k++)
        if (job->chunks[k].owner == index && !atomic_exchange(&job->taken[k], 1))
            read_chunk(job, k);
    for (int64_t k = 0; k < job->count; k++)
        if (!atomic_exchange(&job->taken[k], 1)) read_chunk(job, k);
}

/* Every chunk of job read, on this thread (index 0) and up to threads - 1 others: torch's own
   OpenMP team, built with -fopenmp against the runtime torch loaded (native_read.py), whose
   threads still spin from torch's last parallel op; else this thread alone. */
static void run(struct job *job, int32_t threads) {
#ifdef _OPENMP
#pragma omp parallel num_threads(threads) if (threads > 1)
    work(job, omp_get_thread_num());
#else
    (void)threads;
    work(job, 0);
#endif
}

/* job's chunks (the present layers', in layer order) and their taken flags, malloc'd; the
   number of threads to read them (threads clamped to 1..MAX_THREADS), or -2 when out of memory.
   Each layer is cut as at::parallel_for cuts it for torch's own elementwise kernels
   (GradScaler's unscale_ is the last to write the gradients): into min(threads,
   ceil(n / GRAIN)) equal parts, part t first read by thread t, so that each thread reads first
   what its core wrote last (docs/hook-cost.md#the-c-loop-on-several-threads). */
static int32_t plan(struct job *job, int64_t layers, const int64_t *numels, int32_t threads) {
    threads = threads < 1 ? 1 : (threads > MAX_THREADS ? MAX_THREADS : threads);
    const void *const *x = job->x;
    int64_t total = 0;
    for (int64_t i = 0; i < layers; i++)
        if (x[i] != NULL) total += (numels[i] + CHUNK - 1) / CHUNK + threads;
    job->chunks = malloc(sizeof(struct chunk) * (total ? total : 1));
    job->taken = calloc(total ? total : 1, sizeof(atomic_char));
    if (job->chunks == NULL || job->taken == NULL) return -2;
    int64_t k = 0;
    for (int64_t i = 0; i < layers; i++) {
        if (x[i] == NULL) continue;
        int64_t n = numels[i], parts = (n + GRAIN - 1) / GRAIN;
        if (parts > threads) parts = threads;
        int64_t part = parts ? (n + parts - 1) / parts : 0;
        for (int32_t t = 0; t < parts; t++) {
            int64_t end = (t + 1) * part < n ? (t + 1) * part : n;
            for (int64_t start = t * part; start < end; start += CHUNK) {
                int64_t len = end - start < CHUNK ? end - start : CHUNK;
                job->chunks[k++] = (struct chunk){i, start, len, t};
            }
        }
    }
    job->count = k;
    return threads;
}

static void merge(struct partials *acc, const struct partials *part) {
    acc->zeros += part->zeros;
    acc->finite += part->finite;
    acc->not_nan += part->not_nan;
    acc->under += part->under;
    acc->normal += part->normal;
    if (part->amax > acc->amax) acc->amax = part->amax;
    if (part->key < acc->key) acc->key = part->key;
    acc->sumsq += part->sumsq;
}

static void row_of(const struct partials *acc, int64_t n, double *out) {
    int32_t amin = (acc->key < MAX_FINITE_BITS ? acc->key : MAX_FINITE_BITS) + 1;
    out[0] = (double)acc->zeros;
    out[1] = (double)(n - acc->not_nan);
    out[2] = (double)(acc->not_nan - acc->finite);
    out[3] = (double)acc->under;
    out[4] = (double)acc->normal;
    out[5] = acc->sumsq;
    out[6] = pattern_value(acc->amax);
    out[7] = pattern_value(amin); /* +inf when no finite non-zero element */
}

/* Each layer's memory: grads[slots[i]] (grads[i] without slots), or NULL when slots[i] < 0.
   -1 for a bad dtype. */
static int addresses(int64_t layers, const int64_t *grads, const int64_t *slots,
                     const int8_t *dtypes, const void **x) {
    for (int64_t i = 0; i < layers; i++) {
        int64_t slot = slots == NULL ? i : slots[i];
        x[i] = slot < 0 ? NULL : (const void *)(intptr_t)grads[slot];
        if (x[i] != NULL && (dtypes[i] < DTYPE_FLOAT32 || dtypes[i] > DTYPE_BFLOAT16)) return -1;
    }
    return 0;
}

/* The (layers, 8 + bins) float64 table of one layout into out (row-major).
   grads: the present gradients' addresses, each dense (its numel elements, in any order);
   slots[i]: layer i's index in grads, or -1 when its gradient is None (PyTorch: numels[i]
   zeros); scaled[i]: judged as stored against (under, normal), with the histogram divided by
   the scale (es_mb); else against the runtime *under_bits, *normal_bits, the histogram in the
   units stored. bins: 0 for no histogram, at most 256. threads: how many may read (1: only the
   caller's). Returns 0, -1 for bad arguments, -2 when out of memory. */
int ampscope_rows(int64_t layers, const int64_t *grads, const int64_t *slots,
                  const int64_t *numels, const int8_t *dtypes, const int8_t *scaled,
                  int32_t under, int32_t normal, const int32_t *under_bits,
                  const int32_t *normal_bits, const int32_t *es_mb, int32_t min_exp,
                  int32_t bins, int32_t threads, double *out) {
    if (bins < 0 || bins > 256 || layers < 0) return -1;
    const void **x = malloc(sizeof(void *) * (layers ? layers : 1));
    int32_t *bounds = malloc(sizeof(int32_t) * 4 * (layers ? layers : 1));
    atomic_llong *counts = calloc((size_t)(layers ? layers : 1) * (bins ? bins : 1),
                                  sizeof(atomic_llong));
    struct job job = {NULL, 0, NULL, x, dtypes, bounds, min_exp, bins, NULL, counts, NULL};
    int status = -2;
    if (x == NULL || bounds == NULL || counts == NULL) goto done;
    status = addresses(layers, grads, slots, dtypes, x);
    if (status != 0) goto done;
    for (int64_t i = 0; i < layers; i++) {
        int32_t *b = bounds + 4 * i;
        if (scaled[i]) {
            b[0] = under, b[1] = normal, b[2] = es_mb[0], b[3] = es_mb[1];
        } else {
            b[0] = *under_bits, b[1] = *normal_bits, b[2] = 1, b[3] = 0;
        }
    }
    status = -2;
    threads = plan(&job, layers, numels, threads);
    if (threads < 0) goto done;
    job.partials = malloc(sizeof(struct partials) * (job.count ? job.count : 1));
    if (job.partials == NULL) goto done;
    run(&job, threads);
    const int64_t width = NUM_COLUMNS + bins;
    int64_t k = 0;
    for (int64_t i = 0; i < layers; i++) {
        double *row = out + width * i;
        int64_t n = numels[i];
        if (x[i] == NULL) { /* partials.absent; the histogram's n zeros */
            const double absent[NUM_COLUMNS] = {(double)n, 0, 0, (double)n, (double)n, 0, 0,
                                                pattern_value(INF_BITS)};
            memcpy(row, absent, sizeof absent);
            for (int32_t j = 0; j < bins; j++) row[NUM_COLUMNS + j] = j == 0 ? (double)n : 0.0;
            continue;
        }
        struct partials acc = {0, 0, 0, 0, 0, 0, 0x7FFFFFFF, 0.0};
        for (; k < job.count && job.chunks[k].layer == i; k++) merge(&acc, &job.partials[k]);
        row_of(&acc, n, row);
        for (int32_t j = 0; j < bins; j++)
            row[NUM_COLUMNS + j] = (double)atomic_load(&counts[(int64_t)bins * i + j]);
    }
    status = 0;
done:
    free(x);
    free(bounds);
    free(counts);
    free(job.chunks);
    free(job.taken);
    free(job.partials);
    return status;
}

/* Every gradient's L2 norm into out (float64, 0 for an empty one): grads[i] the address of
   numels[i] dense elements of dtypes[i]; with inv_scale, each unscaled in the same pass and
   *found_inf set to 1 if any was NaN or inf (ampscope_unscale_norms). */
static int norms(int64_t layers, const int64_t *grads, const int64_t *numels,
                 const int8_t *dtypes, const float *inv_scale, float *found_inf, int32_t threads,
                 double *out) {
    if (layers < 0) return -1;
    const void **x = malloc(sizeof(void *) * (layers ? layers : 1));
    struct job job = {NULL, 0, NULL, x, dtypes, NULL, 0, 0, NULL, NULL, NULL, NULL, 1.0f};
    int status = -2;
    if (x == NULL) goto done;
    status = addresses(layers, grads, NULL, dtypes, x);
    if (status != 0) goto done;
    status = -2;
    threads = plan(&job, layers, numels, threads);
    if (threads < 0) goto done;
    job.squares = malloc(sizeof(double) * (job.count ? job.count : 1));
    if (job.squares == NULL) goto done;
    if (inv_scale != NULL) {
        job.bad = calloc(job.count ? job.count : 1, 1);
        if (job.bad == NULL) goto done;
        job.inv = *inv_scale;
    }
    run(&job, threads); /* nothing is written before this: an error above leaves all as it was */
    int64_t k = 0;
    uint8_t bad = 0;
    for (int64_t i = 0; i < layers; i++) {
        double sum = 0.0;
        for (; k < job.count && job.chunks[k].layer == i; k++) {
            sum += job.squares[k];
            if (job.bad != NULL) bad |= job.bad[k];
        }
        out[i] = sqrt(sum);
    }
    if (bad) *found_inf = 1.0f;
    status = 0;
done:
    free(x);
    free(job.chunks);
    free(job.taken);
    free(job.squares);
    free(job.bad);
    return status;
}

/* Every gradient's L2 norm into out (float64, 0 for an empty one): grads[i] the address of
   numels[i] dense elements of dtypes[i]. Returns 0, -1 for a bad dtype, -2 when out of memory. */
int ampscope_norms(int64_t layers, const int64_t *grads, const int64_t *numels,
                   const int8_t *dtypes, int32_t threads, double *out) {
    return norms(layers, grads, numels, dtypes, NULL, NULL, threads, out);
}

/* ampscope_norms of float32 gradients (every dtypes[i] DTYPE_FLOAT32), each gradient then
   multiplied by *inv_scale in place unless it is 1, and *found_inf set to 1 if any element was
   NaN or inf (never to 0): GradScaler's unscale of them. Returns 0; -1 for a dtype other than
   float32, -2 when out of memory, both before any gradient is written. */
int ampscope_unscale_norms(int64_t layers, const int64_t *grads, const int64_t *numels,
                           const int8_t *dtypes, const float *inv_scale, float *found_inf,
                           int32_t threads, double *out) {
    for (int64_t i = 0; i < layers; i++)
        if (dtypes[i] != DTYPE_FLOAT32) return -1;
    return norms(layers, grads, numels, dtypes, inv_scale, found_inf, threads, out);
}
