/* Optional compiled kernels for mucsc (CPython C API + buffer protocol only; no numpy headers).
 *
 * sround:    stochastic rounding of paper eq. 7 with the counter-based SplitMix64 stream of
 *            spec/FORMAT.md 4.3, one pass, bit-identical to the numpy path in quantize.py.
 * dp_levels: the divide-and-conquer DP of centroids.dp_levels (same cost formula, same operation
 *            order, same leftmost-argmin tie rule), bit-identical to the numpy path.
 * prefix:    centroids._Sorted's unit-weight prefix sums in one pass (numpy's sequential cumsum).
 * cand_counts, candidates: centroids._candidates (numpy's linspace, searchsorted, interp and
 *            unique, reproduced operation by operation; np.cbrt stays numpy's, between the two).
 * polish:    the exact coordinate polishing of centroids._polish (same operations and order).
 * dp_polish: centroids._dp_polish: the DP's levels among candidates, then polish, in one call.
 * outside:   the elements below / above two thresholds in index order (centroids._outside), the
 *            same values as the numpy path.
 * summary_stats: summary.Summary.stats' J terms and expected counts (numpy sums the terms).
 * thin:      summary.Summary.thin's rounds (numpy's log2 called back between them: its SIMD log2 may
 *            differ from libm's in the last bit), the same operations and order.
 * kmeans:    the 1-D k-means optimum of a sorted vector (a lower bound the Policy sizes a codec's
 *            table by; not a format step, so not reproduced by the numpy path).
 * new_bytes: a bytes object filled in place through a writable buffer (the message writer's).
 *
 * Build flags (setup.py): -O3 -ffp-contract=off.  No fused multiply-add, no fast-math: every float
 * operation here is the IEEE operation numpy performs, in the same precision and order.
 * Every buffer's format and length is validated (ValueError, never a crash); the GIL is released
 * while the kernels run.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <float.h>

/* x86 SIMD paths (AVX2, AVX-512), each picked at run time by a CPU_HAS check; -DMUCSC_NO_AVX2 builds
 * the portable paths only. */
#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__)) && !defined(MUCSC_NO_AVX2)
#define X86_SIMD 1
#include <immintrin.h>

/* A function fn() -> whether this CPU has what `test` asks of __builtin_cpu_supports (asked once). */
#define CPU_HAS(fn, test)                                                                          \
    static int fn(void)                                                                            \
    {                                                                                              \
        static int known = -1;                                                                     \
        if (known < 0) {                                                                           \
            __builtin_cpu_init();                                                                  \
            known = (test) ? 1 : 0;                                                                \
        }                                                                                          \
        return known;                                                                              \
    }
/* Whether this CPU runs AVX2 (asked once, at module init). */
CPU_HAS(have_avx2, __builtin_cpu_supports("avx2"))
#endif

#if defined(__FLT_EVAL_METHOD__) && __FLT_EVAL_METHOD__ != 0
#error "float arithmetic must be evaluated in its own precision (FLT_EVAL_METHOD 0)"
#endif

#define GAMMA 0x9E3779B97F4A7C15ULL

/* SplitMix64 output for state z (Steele, Lea, Flood 2014). */
static inline uint64_t mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

/* ---------------------------------------------------------------------------------------------- */
/* buffer helpers                                                                                  */
/* ---------------------------------------------------------------------------------------------- */

/* The format's type character, or 0 when it has a non-native byte-order prefix. */
static char fmt_char(const Py_buffer *b)
{
    const char *f = b->format ? b->format : "B";
    if (f[0] == '@' || f[0] == '=') f++;
#if PY_LITTLE_ENDIAN
    else if (f[0] == '<') f++;
#else
    else if (f[0] == '>' || f[0] == '!') f++;
#endif
    if (f[0] == 0 || f[1] != 0) return 0;
    return f[0];
}

static int get_buf(PyObject *o, Py_buffer *b, int writable, const char *name)
{
    int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(o, b, flags) < 0) {
        PyErr_Clear();
        PyErr_Format(PyExc_ValueError, "%s: need a C-contiguous%s buffer", name, writable ? " writable" : "");
        return -1;
    }
    return 0;
}

/* 'f' -> 4, 'd' -> 8 (a float buffer), else 0. */
static int float_kind(const Py_buffer *b)
{
    char c = fmt_char(b);
    if (c == 'f' && b->itemsize == 4) return 4;
    if (c == 'd' && b->itemsize == 8) return 8;
    return 0;
}

static void release_bufs(Py_buffer *b, int k)
{
    for (int i = 0; i < k; i++) PyBuffer_Release(&b[i]);
}

/* o[0..k) as C-contiguous float64 buffers, writable from index first_writable on; on failure what
 * was taken is released and -1 returned (ValueError set). */
static int get_f64_bufs(PyObject *const *o, Py_buffer *b, int k, int first_writable, const char *name)
{
    for (int i = 0; i < k; i++) {
        if (get_buf(o[i], &b[i], i >= first_writable, name) < 0) { release_bufs(b, i); return -1; }
        if (float_kind(&b[i]) != 8) {
            release_bufs(b, i + 1);
            PyErr_Format(PyExc_ValueError, "%s: float64 buffers needed", name);
            return -1;
        }
    }
    return 0;
}

/* ---------------------------------------------------------------------------------------------- */
/* stochastic rounding                                                                             */
/* ---------------------------------------------------------------------------------------------- */

/* Monotone keys: x <= y implies key(x) <= key(y) for finite values (-0.0 is first mapped to +0.0). */
static inline uint32_t key32(float v)
{
    uint32_t b;
    v = v + 0.0f;
    memcpy(&b, &v, 4);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

static inline uint64_t key64(double v)
{
    uint64_t b;
    v = v + 0.0;
    memcpy(&b, &v, 8);
    return (b & 0x8000000000000000ULL) ? ~b : (b | 0x8000000000000000ULL);
}

typedef struct {
    Py_ssize_t n, z;
    int xk, wk, ik;          /* itemsizes: data, work precision, ids */
    const void *x;
    const void *c;
    void *ids;
    uint64_t key;
    int want_J;
    int tb;                  /* table bits */
    uint32_t *klo;           /* klo[b] = #interior levels whose key bin < b (nb + 1 entries) */
    void *w;                 /* widths c[k+1] - c[k] in the work precision */
    double J;
} sround_job;

/* Exact interval of v: k = #interior levels <= v, searched in [klo[b], klo[b+1]]. */
#define LOCATE(C, V, B, K)                                                  \
    do {                                                                    \
        Py_ssize_t lo_ = job->klo[(B)], hi_ = job->klo[(B) + 1];            \
        while (lo_ < hi_) {                                                 \
            Py_ssize_t mid_ = (lo_ + hi_ + 1) >> 1;                         \
            if ((C)[mid_] <= (V)) lo_ = mid_; else hi_ = mid_ - 1;          \
        }                                                                   \
        (K) = lo_;                                                          \
    } while (0)

/* One element in float32 precision: exact interval, then up iff u * (c[k+1] - c[k]) < x - c[k]. */
static inline Py_ssize_t step_f32(const sround_job *job, const float *c, const float *w, float v,
                                  uint32_t r, int sh, double *J, const int want_J)
{
    float u = (float)(r >> 8) * 0x1p-24f;
    uint32_t b = key32(v) >> sh;
    Py_ssize_t k;
    LOCATE(c, v, b, k);
    float d = v - c[k];
    float g = w[k];
    float p = u * g;
    if (want_J) {  /* float64 differences (exact for float32 operands), as the numpy path */
        double xv = (double)v;
        *J += (xv - (double)c[k]) * ((double)c[k + 1] - xv);
    }
    return k + (p < d);
}

/* float32 work precision (x float32, levels exact in float32): 24-bit uniforms, two per word
 * (element 2j: bits 8..31 of word j, element 2j + 1: bits 40..63). */
static inline void sround_f32_body(sround_job *job, const int ik, const int want_J)
{
    const float *x = (const float *)job->x, *c = (const float *)job->c, *w = (const float *)job->w;
    const int sh = 32 - job->tb;
    const Py_ssize_t n = job->n;
    uint8_t *o8 = (uint8_t *)job->ids;
    uint16_t *o16 = (uint16_t *)job->ids;
    double J = 0.0, J1 = 0.0;  /* two accumulators: the float64 add chain is not the bottleneck */
    Py_ssize_t i = 0;
    for (; i + 1 < n; i += 2) {
        uint64_t word = mix64(job->key + ((uint64_t)(i >> 1) + 1u) * GAMMA);
        Py_ssize_t a = step_f32(job, c, w, x[i], (uint32_t)word, sh, &J, want_J);
        Py_ssize_t b = step_f32(job, c, w, x[i + 1], (uint32_t)(word >> 32), sh, &J1, want_J);
        if (ik == 1) { o8[i] = (uint8_t)a; o8[i + 1] = (uint8_t)b; }
        else { o16[i] = (uint16_t)a; o16[i + 1] = (uint16_t)b; }
    }
    if (i < n) {
        uint64_t word = mix64(job->key + ((uint64_t)(i >> 1) + 1u) * GAMMA);
        Py_ssize_t a = step_f32(job, c, w, x[i], (uint32_t)word, sh, &J, want_J);
        if (ik == 1) o8[i] = (uint8_t)a; else o16[i] = (uint16_t)a;
    }
    job->J = J + J1;
}

static void sround_f32(sround_job *job)
{
    if (job->ik == 1) { if (job->want_J) sround_f32_body(job, 1, 1); else sround_f32_body(job, 1, 0); }
    else { if (job->want_J) sround_f32_body(job, 2, 1); else sround_f32_body(job, 2, 0); }
}

/* float64 work precision (x float32 or float64): 53-bit uniforms, one per word. */
static inline void sround_f64_body(sround_job *job, const int xk, const int ik, const int want_J)
{
    const double *c = (const double *)job->c, *w = (const double *)job->w;
    const int sh = 64 - job->tb;
    uint8_t *o8 = (uint8_t *)job->ids;
    uint16_t *o16 = (uint16_t *)job->ids;
    double J = 0.0;
    for (Py_ssize_t i = 0; i < job->n; i++) {
        uint64_t word = mix64(job->key + ((uint64_t)i + 1u) * GAMMA);
        double u = (double)(word >> 11) * 0x1p-53;
        double v = xk == 4 ? (double)((const float *)job->x)[i] : ((const double *)job->x)[i];
        Py_ssize_t b = (Py_ssize_t)(key64(v) >> sh);
        Py_ssize_t k;
        LOCATE(c, v, b, k);
        double d = v - c[k];
        double g = w[k];
        double p = u * g;
        Py_ssize_t id = k + (p < d);
        if (ik == 1) o8[i] = (uint8_t)id; else o16[i] = (uint16_t)id;
        if (want_J) {
            double e = g - d;
            J += d * e;
        }
    }
    job->J = J;
}

static void sround_f64(sround_job *job)
{
    int xk = job->xk, ik = job->ik, wj = job->want_J;
    if (xk == 4) {
        if (ik == 1) { if (wj) sround_f64_body(job, 4, 1, 1); else sround_f64_body(job, 4, 1, 0); }
        else { if (wj) sround_f64_body(job, 4, 2, 1); else sround_f64_body(job, 4, 2, 0); }
    } else {
        if (ik == 1) { if (wj) sround_f64_body(job, 8, 1, 1); else sround_f64_body(job, 8, 1, 0); }
        else { if (wj) sround_f64_body(job, 8, 2, 1); else sround_f64_body(job, 8, 2, 0); }
    }
}

/* Build the bin table over the interior levels c[1..z-2]. */
static void build_table(sround_job *job)
{
    Py_ssize_t nb = (Py_ssize_t)1 << job->tb;
    uint32_t *t = job->klo;
    /* t[i] = #{interior levels whose bin < i}: the levels increase and their keys with them, so the
     * bins do not decrease and t is a run of 0s, then 1s, ...; written run by run (a fill the compiler
     * vectorises) instead of counting then summing in place, a chain through memory of ~5 cycles per
     * entry: ~25 us of a 1e4-element encode's 2^14 entries */
    Py_ssize_t i = 0;
    for (Py_ssize_t j = 1; j < job->z - 1; j++) {
        Py_ssize_t b;
        if (job->wk == 4) b = (Py_ssize_t)(key32(((const float *)job->c)[j]) >> (32 - job->tb));
        else b = (Py_ssize_t)(key64(((const double *)job->c)[j]) >> (64 - job->tb));
        uint32_t below = (uint32_t)(j - 1);
        for (; i <= b; i++) t[i] = below;
    }
    uint32_t all = job->z > 2 ? (uint32_t)(job->z - 2) : 0;
    for (; i <= nb; i++) t[i] = all;
    if (job->wk == 4) {
        const float *c = (const float *)job->c;
        float *w = (float *)job->w;
        for (Py_ssize_t k = 0; k + 1 < job->z; k++) w[k] = c[k + 1] - c[k];
    } else {
        const double *c = (const double *)job->c;
        double *w = (double *)job->w;
        for (Py_ssize_t k = 0; k + 1 < job->z; k++) w[k] = c[k + 1] - c[k];
    }
}

PyDoc_STRVAR(sround_doc,
"sround(x, c, key, ids, want_J) -> J\n\n"
"Stochastic rounding (eq. 7) of x (float32 or float64) to levels c (float32 or float64: the work\n"
"precision; strictly increasing, bracketing x, 2..65536 levels) into ids (uint8 or uint16, len(x)).\n"
"Uniforms: SplitMix64 outputs for state key (spec/FORMAT.md 4.3).  Returns J (eq. 8-9, float64\n"
"products and sum) when want_J, else 0.0.  The caller checks ordering and bracketing.");

/* The rounding of a job whose x, c, ids, n, z, itemsizes, key and want_J are set: its interval table
 * (one entry per element up to 2^16: a quarter as many cost ~24 us more at d = 1e4, since more
 * elements fall in a bin holding a level and branch there; four times as many ~10 us more to
 * build), then the pass; J in job->J.  -1 when out of memory (nothing run).  Needs no GIL. */
static int sround_run(sround_job *job)
{
    int tb = 6;
    while (tb < 16 && ((Py_ssize_t)1 << tb) < job->n) tb++;
    job->tb = tb;
    job->klo = (uint32_t *)PyMem_RawMalloc((((size_t)1 << tb) + 1) * sizeof(uint32_t));
    job->w = PyMem_RawMalloc((size_t)job->z * (size_t)job->wk);
    int ok = job->klo != NULL && job->w != NULL;
    if (ok) {
        build_table(job);
        if (job->wk == 4) sround_f32(job); else sround_f64(job);
    }
    PyMem_RawFree(job->klo);
    PyMem_RawFree(job->w);
    job->klo = NULL;
    job->w = NULL;
    return ok ? 0 : -1;
}

static PyObject *py_sround(PyObject *self, PyObject *args)
{
    PyObject *xo, *co, *io;
    unsigned long long key;
    int want_J;
    if (!PyArg_ParseTuple(args, "OOKOp", &xo, &co, &key, &io, &want_J)) return NULL;
    Py_buffer xb, cb, ib;
    if (get_buf(xo, &xb, 0, "x") < 0) return NULL;
    if (get_buf(co, &cb, 0, "c") < 0) { PyBuffer_Release(&xb); return NULL; }
    if (get_buf(io, &ib, 1, "ids") < 0) { PyBuffer_Release(&xb); PyBuffer_Release(&cb); return NULL; }
    PyObject *res = NULL;
    sround_job job;
    memset(&job, 0, sizeof job);
    job.xk = float_kind(&xb);
    job.wk = float_kind(&cb);
    char ic = fmt_char(&ib);
    job.ik = (ic == 'B' && ib.itemsize == 1) ? 1 : (ic == 'H' && ib.itemsize == 2) ? 2 : 0;
    if (!job.xk || !job.wk || !job.ik) {
        PyErr_SetString(PyExc_ValueError, "sround: x and c must be float32/float64, ids uint8/uint16");
        goto done;
    }
    if (job.wk == 4 && job.xk != 4) {
        PyErr_SetString(PyExc_ValueError, "sround: float32 work precision needs float32 data");
        goto done;
    }
    job.n = xb.len / xb.itemsize;
    job.z = cb.len / cb.itemsize;
    if (ib.len / ib.itemsize != job.n) {
        PyErr_SetString(PyExc_ValueError, "sround: ids must have len(x) elements");
        goto done;
    }
    if (job.z < 2 || job.z > 65536 || (job.ik == 1 && job.z > 256)) {
        PyErr_SetString(PyExc_ValueError, "sround: need 2..65536 levels (at most 256 for uint8 ids)");
        goto done;
    }
    job.x = xb.buf;
    job.c = cb.buf;
    job.ids = ib.buf;
    job.key = (uint64_t)key;
    job.want_J = want_J;
    {
        int rc;
        Py_BEGIN_ALLOW_THREADS
        rc = sround_run(&job);
        Py_END_ALLOW_THREADS
        res = rc < 0 ? PyErr_NoMemory() : PyFloat_FromDouble(job.J);
    }
done:
    PyBuffer_Release(&xb);
    PyBuffer_Release(&cb);
    PyBuffer_Release(&ib);
    return res;
}

/* ---------------------------------------------------------------------------------------------- */
/* DP over candidate levels                                                                        */
/* ---------------------------------------------------------------------------------------------- */

typedef struct {
    const double *v, *n, *s1, *s2, *prev;
    double *cur;
    int32_t *arg;
    const int32_t *lower;  /* the previous layer's argmins (NULL in the first layer) */
} dp_ctx;

/* The DP's inner step: min_{olo <= i <= top} prev[i] + C(i, j) and its leftmost argmin *bi: the
 * first i's cost, replaced by each later one that is smaller (so NaN never wins, ties keep the first). */
static inline double dp_cost(const dp_ctx *q, Py_ssize_t i, double vj, double nj, double s1j, double s2j)
{
    return q->prev[i] + ((q->v[i] + vj) * (s1j - q->s1[i]) - q->v[i] * vj * (nj - q->n[i]) - (s2j - q->s2[i]));
}
#define DP_COST(i) dp_cost(q, (i), vj, nj, s1j, s2j)

static inline double dp_scan(const dp_ctx *q, Py_ssize_t j, Py_ssize_t olo, Py_ssize_t top, Py_ssize_t *bi)
{
    const double vj = q->v[j], nj = q->n[j], s1j = q->s1[j], s2j = q->s2[j];
    if (top < olo) { *bi = olo; return INFINITY; }
    double best = DP_COST(olo);
    Py_ssize_t b = olo;
    for (Py_ssize_t i = olo + 1; i <= top; i++) {  /* branch-free selects: the order of costs is random */
        double cost = DP_COST(i);
        int lt = cost < best;
        best = lt ? cost : best;
        b = lt ? i : b;
    }
    *bi = b;
    return best;
}

/* cur[j] = min_{olo <= i <= min(ohi, j-1)} prev[i] + C(i, j) for j in [lo, hi], leftmost argmin;
 * the recursion tree of centroids._dc_layer (which runs it breadth first).  Aligned to 64 bytes so
 * its loop's place against 32-byte boundaries does not move with the code before it: measured on a
 * Xeon (Skylake-SP family), unaligned builds of the same source ran the DP at Z = 16 ~15% apart. */
__attribute__((aligned(64))) static void dc(const dp_ctx *q, Py_ssize_t lo, Py_ssize_t hi, Py_ssize_t olo, Py_ssize_t ohi)
{
    while (lo <= hi) {
        Py_ssize_t mid = (lo + hi) >> 1;
        Py_ssize_t top = ohi < mid - 1 ? ohi : mid - 1;
        /* Knuth's bound: with one more level the last segment starts no earlier (opt_{k-1}(j) <=
         * opt_k(j)); it cuts the long scans of the recursion's first levels */
        Py_ssize_t from = q->lower && q->lower[mid] > olo ? q->lower[mid] : olo;
        if (from > top) from = top >= olo ? top : olo;  /* the bounds disagree (rounding): keep one */
        Py_ssize_t bi;
        double best = dp_scan(q, mid, from, top, &bi);
        q->cur[mid] = best;
        q->arg[mid] = (int32_t)bi;
        if (lo <= mid - 1) dc(q, lo, mid - 1, olo, bi);
        /* right half iteratively: [mid + 1, hi] with options [bi, ohi] */
        lo = mid + 1;
        olo = bi;
    }
}

/* The DP of centroids.dp_levels (2 <= z < m): the best z of m candidates into idx.  Work buffers:
 * prev, cur (m doubles each), argm (z * m int32, zeroed). */
static void dp_run(const double *v, const double *n, const double *s1, const double *s2, Py_ssize_t m,
                   Py_ssize_t z, int64_t *idx, double *prev, double *cur, int32_t *argm)
{
    dp_ctx q = {v, n, s1, s2, prev, cur, NULL, NULL};
    for (Py_ssize_t j = 0; j < m; j++) prev[j] = INFINITY;
    prev[0] = 0.0;
    for (Py_ssize_t k = 1; k < z; k++) {
        Py_ssize_t jlo = k, jhi = (k < z - 1) ? m - 1 - (z - 1 - k) : m - 1;
        if (k == z - 1) jlo = m - 1;
        for (Py_ssize_t j = 0; j < m; j++) cur[j] = INFINITY;
        q.prev = prev;
        q.cur = cur;
        q.arg = argm + (size_t)k * (size_t)m;
        q.lower = k > 1 ? argm + (size_t)(k - 1) * (size_t)m : NULL;
        if (k == 1) {  /* only prev[0] is finite: every j's best is C(0, j), what the recursion finds */
            for (Py_ssize_t j = jlo; j <= jhi; j++) cur[j] = dp_cost(&q, 0, v[j], n[j], s1[j], s2[j]);
            /* q.arg stays 0 (zeroed) */
        } else {
            dc(&q, jlo, jhi, k - 1, jhi - 1);
        }
        double *t = prev; prev = cur; cur = t;
    }
    Py_ssize_t j = m - 1;
    for (Py_ssize_t k = z - 1; k > 0; k--) {
        idx[k] = j;
        j = argm[(size_t)k * (size_t)m + (size_t)j];
    }
    idx[0] = 0;
}

PyDoc_STRVAR(dp_doc,
"dp_levels(v, n, s1, s2, z, idx)\n\n"
"Indices of the best z of the m candidates v (float64, m > z >= 2) into idx (int64, length z):\n"
"the divide-and-conquer DP of centroids.dp_levels with n, s1, s2 the prefix count/sum/sum of\n"
"squares at each candidate.");

static PyObject *py_dp_levels(PyObject *self, PyObject *args)
{
    PyObject *o[4], *io;
    Py_ssize_t z;
    if (!PyArg_ParseTuple(args, "OOOOnO", &o[0], &o[1], &o[2], &o[3], &z, &io)) return NULL;
    Py_buffer b[4], ib;
    int got = 0;
    PyObject *res = NULL;
    double *prev = NULL, *cur = NULL;
    int32_t *argm = NULL;
    for (; got < 4; got++) {
        if (get_buf(o[got], &b[got], 0, "dp_levels input") < 0) goto fail_bufs;
    }
    if (get_buf(io, &ib, 1, "idx") < 0) goto fail_bufs;
    Py_ssize_t m = b[0].len / 8;
    for (int k = 0; k < 4; k++) {
        if (float_kind(&b[k]) != 8 || b[k].len != b[0].len) {
            PyErr_SetString(PyExc_ValueError, "dp_levels: v, n, s1, s2 must be float64 of equal length");
            goto done;
        }
    }
    {
        char ic = fmt_char(&ib);
        if (!((ic == 'q' || ic == 'l') && ib.itemsize == 8) || ib.len / 8 != z) {
            PyErr_SetString(PyExc_ValueError, "dp_levels: idx must be int64 of length z");
            goto done;
        }
    }
    if (z < 2 || z >= m || m > 0x7FFFFFFF || (size_t)z > ((size_t)PY_SSIZE_T_MAX / 4) / (size_t)m) {
        PyErr_SetString(PyExc_ValueError, "dp_levels: need 2 <= z < m < 2^31");
        goto done;
    }
    prev = (double *)PyMem_RawMalloc((size_t)m * sizeof(double));
    cur = (double *)PyMem_RawMalloc((size_t)m * sizeof(double));
    argm = (int32_t *)PyMem_RawCalloc((size_t)z * (size_t)m, sizeof(int32_t));
    if (!prev || !cur || !argm) { PyErr_NoMemory(); goto done; }
    int64_t *idx = (int64_t *)ib.buf;
    Py_BEGIN_ALLOW_THREADS
    dp_run((const double *)b[0].buf, (const double *)b[1].buf, (const double *)b[2].buf,
           (const double *)b[3].buf, m, z, idx, prev, cur, argm);
    Py_END_ALLOW_THREADS
    Py_INCREF(Py_None);
    res = Py_None;
done:
    PyMem_RawFree(prev);
    PyMem_RawFree(cur);
    PyMem_RawFree(argm);
    PyBuffer_Release(&ib);
fail_bufs:
    for (int k = 0; k < got; k++) PyBuffer_Release(&b[k]);
    return res;
}

/* ---------------------------------------------------------------------------------------------- */
/* tails: the elements outside [lo, hi]                                                           */
/* ---------------------------------------------------------------------------------------------- */

/* ---------------------------------------------------------------------------------------------- */
/* Coordinate polishing of levels (centroids._polish)                                              */
/* ---------------------------------------------------------------------------------------------- */

/* The elements of the sorted a[0 .. n) before key's place, i.e. numpy's searchsorted: those <= key
 * (right, side="right") or < key (left), the first index i with a[i] > key (or >= key).  Branch-free
 * (the loop runs log2 n times whatever the data; the select is a conditional move): a branchy binary
 * search mispredicts about every other step, ~15 cycles each, and several independent searches
 * overlap here.  The answer is unique, so it is the branchy one's. */
static inline Py_ssize_t search_side(const double *a, Py_ssize_t n, double key, int right)
{
    if (n <= 0) return 0;
    const double *b = a;
    while (n > 1) {  /* the answer is in [b - a, b - a + n] */
        Py_ssize_t h = n >> 1;
        b = (right ? b[h] <= key : b[h] < key) ? b + h : b;
        n -= h;
    }
    return (b - a) + (right ? *b <= key : *b < key);
}

static inline Py_ssize_t search_right(const double *a, Py_ssize_t n, double key) { return search_side(a, n, key, 1); }

static inline Py_ssize_t search_left(const double *a, Py_ssize_t n, double key) { return search_side(a, n, key, 0); }

/* search_right / search_left of key given the answer for a nearby key (0 <= hint <= n): an
 * exponential search outwards from the hint, then a binary search in the bracket found; the same
 * answer (the first index past the key is unique in a sorted array), O(log distance) steps. */
static inline Py_ssize_t search_from(const double *a, Py_ssize_t n, double key, Py_ssize_t hint, int right)
{
#define BELOW(i) (right ? a[i] <= key : a[i] < key)  /* a[i] is before the answer */
    Py_ssize_t lo, hi, step = 1;
    if (hint < n && BELOW(hint)) {  /* the answer is past the hint */
        lo = hint + 1;
        hi = lo;
        while (hi < n && BELOW(hi)) { lo = hi + 1; hi += step; step <<= 1; }
        if (hi > n) hi = n;
    } else {  /* the answer is at or before the hint */
        hi = hint;
        lo = hi;
        while (lo > 0 && !BELOW(lo - 1)) { hi = lo - 1; lo -= step; step <<= 1; if (lo < 0) lo = 0; }
    }
    while (lo < hi) { Py_ssize_t mid = lo + ((hi - lo) >> 1); if (BELOW(mid)) lo = mid + 1; else hi = mid; }
    return lo;
#undef BELOW
}

/* A run of searches for non-decreasing keys in one sorted array: each search starts from the last
 * answer (the answer for a key at or above the last key is at or after it) and gallops, so m sorted
 * keys cost O(m log(n / m)) instead of O(m log n).  A key below the last one searches afresh.  The
 * answers are search_right's / search_left's: the first index past the key is unique in a sorted array. */
typedef struct { const double *a; Py_ssize_t n, at; double key; int started, on; } gallop;

/* A run of about `keys` searches in a[0 .. n): galloping pays up to gaps of ~1000 elements between
 * answers (its probes stay near the last answer, where a fresh binary search misses the cache: the
 * 769 bin edges of a 1e5-element solve took 38 us searched afresh, 7 us galloping); sparser ones
 * search afresh each time. */
static inline gallop gallop_init(const double *a, Py_ssize_t n, Py_ssize_t keys)
{
    gallop g = {a, n, 0, 0.0, 0, keys >= n / 1024};
    return g;
}

static inline Py_ssize_t gallop_search(gallop *g, double key, int right)
{
    const double *a = g->a;
    const Py_ssize_t n = g->n;
    if (!g->on || !g->started || !(key >= g->key)) {
        g->at = right ? search_right(a, n, key) : search_left(a, n, key);
    } else {  /* the answer is in [at, n): before it every a[i] is <= (right) or < (left) the old key */
        Py_ssize_t lo = g->at, step = 1, hi = lo;
        while (hi < n && (right ? a[hi] <= key : a[hi] < key)) { lo = hi + 1; hi += step; step <<= 1; }
        if (hi > n) hi = n;
        while (lo < hi) {
            Py_ssize_t mid = lo + ((hi - lo) >> 1);
            if (right ? a[mid] <= key : a[mid] < key) lo = mid + 1; else hi = mid;
        }
        g->at = lo;
    }
    g->key = key;
    g->started = 1;
    return g->at;
}

/* pos[i] = search_right / search_left(a, n, keys[i]) for nk keys.  Non-decreasing keys (the solver's
 * bin edges and candidates): every SEARCH_ANCHOR-th key galloped from the last, a chain of dependent
 * searches, then each key between two of them searched on its own between their answers (branch-free,
 * so the searches overlap); keys out of order (NaN included): each galloped.  The same answers as one
 * search each (they are unique): ~2/3 of the bin edges' time at d = 1e4 was the chain's mispredicts. */
#define SEARCH_ANCHOR 8
static void search_keys(const double *a, Py_ssize_t n, const double *keys, Py_ssize_t nk, int right, Py_ssize_t *pos)
{
    gallop g = gallop_init(a, n, nk);
    Py_ssize_t i = 1;
    while (i < nk && keys[i] >= keys[i - 1]) i++;
    if (i < nk) {
        for (i = 0; i < nk; i++) pos[i] = gallop_search(&g, keys[i], right);
        return;
    }
    for (i = 0; i < nk; i += SEARCH_ANCHOR) pos[i] = gallop_search(&g, keys[i], right);
    if (nk > 1 && (nk - 1) % SEARCH_ANCHOR) pos[nk - 1] = gallop_search(&g, keys[nk - 1], right);
    for (Py_ssize_t i0 = 0; i0 + 1 < nk; i0 += SEARCH_ANCHOR) {
        Py_ssize_t i1 = i0 + SEARCH_ANCHOR < nk - 1 ? i0 + SEARCH_ANCHOR : nk - 1, lo = pos[i0], len = pos[i1] - lo;
        for (i = i0 + 1; i < i1; i++) pos[i] = lo + search_side(a + lo, len, keys[i], right);
    }
}

/* The prefix sums P1 = cumsum(xc), P2 = cumsum(xc xc) (leading 0) as the solver reads them: whole
 * arrays (P1 non-NULL), or only every PB-th entry, B1[b] = P1[b PB] and B2[b] = P2[b PB], and the
 * entries between rebuilt from xc by adding from their block's start in sequence: the additions of the
 * sequential cumsum itself, so the same values.  Writing two float64 arrays of n + 1 is most of a
 * 1e5-element solve's prefix pass (it is bound by its stores); the solver reads a few hundred entries. */
#define PB_SHIFT 4
#define PB (1 << PB_SHIFT)
#define PB_MIN_N 4096  /* below, the whole arrays: they stay in cache, and reading them is cheaper */
typedef struct { const double *P1, *P2, *xc, *B1, *B2; } prefix_src;

static inline double p1_at(const prefix_src *p, Py_ssize_t r)
{
    if (p->P1) return p->P1[r];
    double s = p->B1[r >> PB_SHIFT];
    for (Py_ssize_t i = (r >> PB_SHIFT) << PB_SHIFT; i < r; i++) s += p->xc[i];
    return s;
}

static inline double p2_at(const prefix_src *p, Py_ssize_t r)
{
    if (p->P2) return p->P2[r];
    double s = p->B2[r >> PB_SHIFT];
    for (Py_ssize_t i = (r >> PB_SHIFT) << PB_SHIFT; i < r; i++) s += p->xc[i] * p->xc[i];
    return s;
}

/* W[i] of prefix weights, or i itself where W is NULL (unit weights: the same values). */
#define WAT(W, i) ((W) ? (W)[i] : (double)(i))

/* centroids._polish on c (z levels) in place; work: pos (2 z Py_ssize_t) and fresh (POLISH_FRESH(z)
 * doubles).  Returns the sweeps run.  Each level's searchsorted positions (right in pos[0 .. z),
 * left in pos[z .. 2 z)) and P1 there are kept and, when the level moves, searched for again from
 * where they were (levels move by little from sweep to sweep): the same answers as a binary search
 * over all of xs every sweep, in a fraction of the steps.  As numpy's vector step, a parity's new values are all
 * written when any differs (a 0.0 may become -0.0 then: equal values keep their positions). */
#define POLISH_FRESH(z) (3 * (size_t)(z) + 1)
static Py_ssize_t polish_run(const double *xs, Py_ssize_t n, const double *W, const prefix_src *ps, double *c,
                             Py_ssize_t z, int unit, Py_ssize_t sweeps, Py_ssize_t *pos, double *fresh)
{
    Py_ssize_t done_sweeps = 0, *right = pos, *left = pos + z;
    double *p1r = fresh + z / 2 + 1, *p1l = p1r + z;  /* P1[right[j]], P1[left[j]] */
    if (z <= 2) return 0;
    for (Py_ssize_t j = 0; j < z; j++) {
        right[j] = search_right(xs, n, c[j]);
        left[j] = search_left(xs, n, c[j]);
        p1r[j] = p1_at(ps, right[j]);
        p1l[j] = p1_at(ps, left[j]);
    }
    for (Py_ssize_t s = 0; s < sweeps; s++) {
        int changed = 0;
        done_sweeps++;
        for (Py_ssize_t parity = 1; parity <= 2; parity++) {
            int differ = 0;
            Py_ssize_t k = 0;
            /* every new value of this parity from the levels before it (numpy's vector step) */
            for (Py_ssize_t j = parity; j < z - 1; j += 2, k++) {
                double a = c[j - 1], b = c[j + 1];
                Py_ssize_t lo = right[j - 1], hi = left[j + 1];
                double T = b * (WAT(W, hi) - WAT(W, lo)) - (p1l[j + 1] - p1r[j - 1]);
                double t = T / (b - a);
                double v = c[j];
                if (hi > lo && t > 0) {
                    Py_ssize_t rank;
                    if (unit) {
                        rank = lo - 1 + (Py_ssize_t)ceil(t);
                    } else {
                        Py_ssize_t i = search_left(W, n + 1, W[lo] + t);
                        rank = (i > lo + 1 ? i : lo + 1) - 1;
                    }
                    if (rank < 0) rank = 0;
                    if (rank > n - 1) rank = n - 1;
                    v = xs[rank];
                }
                fresh[k] = v;
                if (!(v == c[j])) differ = 1;
            }
            if (differ) {
                changed = 1;
                k = 0;
                for (Py_ssize_t j = parity; j < z - 1; j += 2, k++) {
                    if (!(fresh[k] == c[j])) {  /* moved: its positions from the old ones */
                        Py_ssize_t r = search_from(xs, n, fresh[k], right[j], 1);
                        Py_ssize_t l = search_from(xs, n, fresh[k], left[j], 0);
                        if (r != right[j]) p1r[j] = p1_at(ps, r);
                        if (l != left[j]) p1l[j] = p1_at(ps, l);
                        right[j] = r;
                        left[j] = l;
                    }
                    c[j] = fresh[k];
                }
            }
        }
        if (!changed) break;
    }
    return done_sweeps;
}

PyDoc_STRVAR(polish_doc,
"polish(xs, W, P1, c, unit, sweeps) -> number of sweeps run\n\n"
"centroids._polish in place on c (float64): ALQ coordinate updates, odd then even levels, on the\n"
"sorted centred data xs (float64, n) with prefix weights W and weighted sums P1 (float64, n + 1);\n"
"unit: W[i] == i.  The same operations, order and tie rules as the numpy path.");

static PyObject *py_polish(PyObject *self, PyObject *args)
{
    PyObject *xo, *wo, *po, *co;
    int unit;
    Py_ssize_t sweeps, done_sweeps = 0;
    if (!PyArg_ParseTuple(args, "OOOOpn", &xo, &wo, &po, &co, &unit, &sweeps)) return NULL;
    Py_buffer xb, wb, pb, cb;
    PyObject *res = NULL;
    Py_ssize_t *pos = NULL;
    double *fresh = NULL;
    if (get_buf(xo, &xb, 0, "polish xs") < 0) return NULL;
    if (get_buf(wo, &wb, 0, "polish W") < 0) goto f1;
    if (get_buf(po, &pb, 0, "polish P1") < 0) goto f2;
    if (get_buf(co, &cb, 1, "polish c") < 0) goto f3;
    Py_ssize_t n = xb.len / 8, z = cb.len / 8;
    if (float_kind(&xb) != 8 || float_kind(&wb) != 8 || float_kind(&pb) != 8 || float_kind(&cb) != 8
        || wb.len / 8 != n + 1 || pb.len / 8 != n + 1 || n < 1) {
        PyErr_SetString(PyExc_ValueError, "polish: xs (n), W, P1 (n + 1) and c must be float64, n >= 1");
        goto done;
    }
    pos = (Py_ssize_t *)PyMem_RawMalloc((2 * (size_t)z + 1) * sizeof(Py_ssize_t));
    fresh = (double *)PyMem_RawMalloc(POLISH_FRESH(z) * sizeof(double));
    if (!pos || !fresh) { PyErr_NoMemory(); goto done; }
    {
        const double *xs = (const double *)xb.buf, *W = (const double *)wb.buf, *p1 = (const double *)pb.buf;
        Py_BEGIN_ALLOW_THREADS
        prefix_src ps = {p1, NULL, NULL, NULL, NULL};
        done_sweeps = polish_run(xs, n, W, &ps, (double *)cb.buf, z, unit, sweeps, pos, fresh);
        Py_END_ALLOW_THREADS
    }
    res = PyLong_FromSsize_t(done_sweeps);
done:
    PyMem_RawFree(pos);
    PyMem_RawFree(fresh);
    PyBuffer_Release(&cb);
f3:
    PyBuffer_Release(&pb);
f2:
    PyBuffer_Release(&wb);
f1:
    PyBuffer_Release(&xb);
    return res;
}

PyDoc_STRVAR(dp_polish_doc,
"dp_polish(xc, W, P1, P2, cand, z, unit, sweeps, out) -> count\n\n"
"centroids._dp_polish: the DP's best min(z, m) of the m sorted distinct candidates cand (centred like\n"
"xc; its prefix sums W, P1, P2 read at searchsorted(xc, cand, 'left')), polished as by polish(), into\n"
"out (float64, >= min(z, m)).  The operations of dp_levels and polish in one call.");

/* The body of dp_polish on raw arrays (prefix sums from ps): the DP's best min(z, m) of the m
 * candidates, polished, into out; returns that count, or -1 when out of memory. */
static Py_ssize_t dp_polish_run(const double *xc, Py_ssize_t n, const double *W, const prefix_src *ps,
                                const double *cand, Py_ssize_t m, Py_ssize_t z, int unit, Py_ssize_t sweeps, double *out)
{
    Py_ssize_t count = z < m ? z : m;
    double *work = (double *)PyMem_RawMalloc((5 * (size_t)m + POLISH_FRESH(count)) * sizeof(double));
    int64_t *idx = (int64_t *)PyMem_RawMalloc((size_t)count * sizeof(int64_t));
    Py_ssize_t *pos = (Py_ssize_t *)PyMem_RawMalloc((2 * (size_t)count + 1) * sizeof(Py_ssize_t));
    int32_t *argm = (int32_t *)PyMem_RawCalloc((size_t)count * (size_t)m, sizeof(int32_t));
    if (!work || !idx || !pos || !argm) {
        count = -1;
    } else {
        double *vn = work, *v1 = vn + m, *v2 = v1 + m, *prev = v2 + m, *cur = prev + m, *fresh = cur + m;
        Py_ssize_t *at = (Py_ssize_t *)cur;  /* free until the DP */
        search_keys(xc, n, cand, m, 0, at);
        for (Py_ssize_t i = 0; i < m; i++) {
            Py_ssize_t p = at[i];
            vn[i] = WAT(W, p); v1[i] = p1_at(ps, p); v2[i] = p2_at(ps, p);
        }
        if (z < m) dp_run(cand, vn, v1, v2, m, z, idx, prev, cur, argm);
        else for (Py_ssize_t k = 0; k < m; k++) idx[k] = k;  /* dp_levels' arange(m) */
        for (Py_ssize_t k = 0; k < count; k++) out[k] = cand[idx[k]];  /* increasing: np.unique's order */
        polish_run(xc, n, W, ps, out, count, unit, sweeps, pos, fresh);
    }
    PyMem_RawFree(work);
    PyMem_RawFree(idx);
    PyMem_RawFree(pos);
    PyMem_RawFree(argm);
    return count;
}

static PyObject *py_dp_polish(PyObject *self, PyObject *args)
{
    PyObject *o[6];
    Py_buffer b[6];
    Py_ssize_t z, sweeps, count = 0;
    int unit;
    if (!PyArg_ParseTuple(args, "OOOOOnpnO", &o[0], &o[1], &o[2], &o[3], &o[4], &z, &unit, &sweeps, &o[5]))
        return NULL;
    if (get_f64_bufs(o, b, 6, 5, "dp_polish") < 0) return NULL;
    PyObject *res = NULL;
    Py_ssize_t n = b[0].len / 8, m = b[4].len / 8;
    count = z < m ? z : m;
    int ok = n >= 1 && m >= 1 && z >= 2 && m <= 0x7FFFFFFF && b[5].len / 8 >= count
             && (size_t)count <= ((size_t)PY_SSIZE_T_MAX / 8) / (size_t)m;
    for (int k = 1; k < 4; k++) ok = ok && b[k].len / 8 == n + 1;
    if (!ok) {
        PyErr_SetString(PyExc_ValueError, "dp_polish: float64 xc (n >= 1), W, P1, P2 (n + 1), cand (m), "
                                          "out (>= min(z, m)); 2 <= z, m < 2^31");
        goto done;
    }
    {
        const double *xc = (const double *)b[0].buf, *W = (const double *)b[1].buf;
        const double *P1 = (const double *)b[2].buf, *P2 = (const double *)b[3].buf;
        const double *cand = (const double *)b[4].buf;
        double *out = (double *)b[5].buf;
        Py_BEGIN_ALLOW_THREADS
        prefix_src ps = {P1, P2, NULL, NULL, NULL};
        count = dp_polish_run(xc, n, W, &ps, cand, m, z, unit, sweeps, out);
        Py_END_ALLOW_THREADS
    }
    if (count < 0) PyErr_NoMemory();
    else res = PyLong_FromSsize_t(count);
done:
    release_bufs(b, 6);
    return res;
}

/* xc = x - shift and the prefix sums W = cumsum(w), P1 = cumsum(w xc), P2 = cumsum(w xc xc), each
 * with a leading 0 (without w: P1 = cumsum(xc), P2 = cumsum(xc xc), W not written): numpy's
 * sequential accumulate of the same products, the same values.  The pass is bound by its stores
 * (three or four per element), not by the chains of adds: summing in four blocks side by side
 * measured 15-25% slower for the offsets' second pass.  X(i) reads element i as a double. */
#define PREFIX_BODY(X, WGT)                                                                         \
    do {                                                                                            \
        double s0 = 0.0, s1 = 0.0, s2 = 0.0;                                                        \
        P1[0] = P2[0] = 0.0;                                                                        \
        if (W) {                                                                                    \
            W[0] = 0.0;                                                                             \
            for (Py_ssize_t i = 0; i < n; i++) {  /* numpy: cumsum(w), wx = w * xc, cumsum(wx), cumsum(wx * xc) */ \
                double v = X(i) - shift, wi = WGT(i), wx = wi * v;                                  \
                xc[i] = v;                                                                          \
                s0 += wi; s1 += wx; s2 += wx * v;                                                   \
                W[i + 1] = s0; P1[i + 1] = s1; P2[i + 1] = s2;                                      \
            }                                                                                       \
        } else {                                                                                    \
            for (Py_ssize_t i = 0; i < n; i++) {                                                    \
                double v = X(i) - shift;                                                            \
                xc[i] = v;                                                                          \
                s1 += v; s2 += v * v;                                                               \
                P1[i + 1] = s1; P2[i + 1] = s2;                                                     \
            }                                                                                       \
        }                                                                                           \
    } while (0)

/* The weights of prefix_run: an array w, or (w NULL) the subsample's steps, 1 before `a`, wb in
 * [a, b), 1 from b on (centroids._Steps); W NULL: no weights (nothing stored for W). */
typedef struct { const double *w; Py_ssize_t a, b; double wb; } prefix_weights;

#define WARRAY(i) (pw.w[i])
#define WSTEPS(i) ((i) >= pw.a && (i) < pw.b ? pw.wb : 1.0)
#define X64(i) (x[i])
#define X32(i) ((double)x[i])
static void prefix_run_f64(const double *x, prefix_weights pw, Py_ssize_t n, double shift, double *xc, double *W,
                           double *P1, double *P2)
{
    if (pw.w) PREFIX_BODY(X64, WARRAY); else PREFIX_BODY(X64, WSTEPS);
}

static void prefix_run_f32(const float *x, prefix_weights pw, Py_ssize_t n, double shift, double *xc, double *W,
                           double *P1, double *P2)
{
    if (pw.w) PREFIX_BODY(X32, WARRAY); else PREFIX_BODY(X32, WSTEPS);
}
/* From PB_MIN_N elements on, the unweighted prefix sums are kept by blocks of PB: B1[0] = 0, B1[b + 1]
 * = B1[b] + T1[b] in sequence (numpy's cumsum of T1) with T1[b] the sum of block b's PB values of xc
 * by a fixed tree (tree16), the same for B2 and the squares xc * xc; an entry inside a block is its
 * block's entry plus the block's values from its start added in sequence (p1_at).  The one chain of
 * adds per element of a sequential cumsum (2 cycles an element: most of a 1e5-element solve's prefix
 * pass) becomes one per block, the trees four wide.  centroids._Sorted sums the same way. */
#if PB != 16
#error "tree16 sums blocks of 16"
#endif
/* a[0] + ... + a[15] as (u_i = a_i + a_(i+8), w_i = u_i + u_(i+4), (w_0 + w_2) + (w_1 + w_3)). */
static inline double tree16(const double *a)
{
    double u[8], w[4];
    for (int i = 0; i < 8; i++) u[i] = a[i] + a[i + 8];
    for (int i = 0; i < 4; i++) w[i] = u[i] + u[i + 4];
    return (w[0] + w[2]) + (w[1] + w[3]);
}

/* One block's xc (from X) and tree sums of xc and xc * xc, portable. */
#define PREFIX_BLOCK_ANY(X)                                                                         \
    do {                                                                                            \
        double sq[PB];                                                                              \
        for (int r = 0; r < PB; r++) {                                                              \
            double v = X(i0 + r) - shift;                                                           \
            xc[i0 + r] = v;                                                                         \
            sq[r] = v * v;                                                                          \
        }                                                                                           \
        t1 = tree16(xc + i0);                                                                       \
        t2 = tree16(sq);                                                                            \
    } while (0)

/* xc = x - shift, B1 and B2 (n / PB + 1 entries each) of the blocked prefix sums; ``tree`` sums one
 * full block at i0 into t1, t2. */
#define PREFIX_BLOCKS_BODY(X, TREE)                                                                 \
    do {                                                                                            \
        Py_ssize_t nb = n >> PB_SHIFT;                                                              \
        double s1 = 0.0, s2 = 0.0;                                                                  \
        B1[0] = B2[0] = 0.0;                                                                        \
        for (Py_ssize_t b = 0; b < nb; b++) {                                                       \
            Py_ssize_t i0 = b << PB_SHIFT;                                                          \
            double t1, t2;                                                                          \
            TREE(X);                                                                                \
            s1 = b ? s1 + t1 : t1;  /* numpy's cumsum: the first entry is T[0] itself */            \
            s2 = b ? s2 + t2 : t2;                                                                  \
            B1[b + 1] = s1; B2[b + 1] = s2;                                                         \
        }                                                                                           \
        for (Py_ssize_t i = nb << PB_SHIFT; i < n; i++) xc[i] = X(i) - shift;                       \
    } while (0)

static void prefix_blocks_f64_any(const double *x, Py_ssize_t n, double shift, double *xc, double *B1, double *B2)
{
    PREFIX_BLOCKS_BODY(X64, PREFIX_BLOCK_ANY);
}

static void prefix_blocks_f32_any(const float *x, Py_ssize_t n, double shift, double *xc, double *B1, double *B2)
{
    PREFIX_BLOCKS_BODY(X32, PREFIX_BLOCK_ANY);
}

#ifdef X86_SIMD
/* tree16 four wide: v0..v3 hold a block's values 0-3, 4-7, 8-11, 12-15, so (v0 + v2, v1 + v3) are the
 * u, their sum the w, and its halves' sum (w_0 + w_2, w_1 + w_3): the same adds in the same order. */
__attribute__((target("avx2"))) static inline double tree16_avx2(__m256d v0, __m256d v1, __m256d v2, __m256d v3)
{
    __m256d w = _mm256_add_pd(_mm256_add_pd(v0, v2), _mm256_add_pd(v1, v3));
    __m128d y = _mm_add_pd(_mm256_castpd256_pd128(w), _mm256_extractf128_pd(w, 1));
    return _mm_cvtsd_f64(y) + _mm_cvtsd_f64(_mm_unpackhi_pd(y, y));
}

#define LOAD4_F64(i) _mm256_loadu_pd(x + (i))
#define PREFIX_BLOCK_AVX2_F64(X) PREFIX_BLOCK_AVX2(LOAD4_F64)
#define PREFIX_BLOCK_AVX2_F32(X) PREFIX_BLOCK_AVX2(LOAD4_F32)
#define LOAD4_F32(i) _mm256_cvtps_pd(_mm_loadu_ps(x + (i)))
#define PREFIX_BLOCK_AVX2(LOAD4)                                                                    \
    do {                                                                                            \
        const __m256d sh = _mm256_set1_pd(shift);                                                   \
        __m256d a0 = _mm256_sub_pd(LOAD4(i0), sh), a1 = _mm256_sub_pd(LOAD4(i0 + 4), sh);          \
        __m256d a2 = _mm256_sub_pd(LOAD4(i0 + 8), sh), a3 = _mm256_sub_pd(LOAD4(i0 + 12), sh);     \
        _mm256_storeu_pd(xc + i0, a0);                                                              \
        _mm256_storeu_pd(xc + i0 + 4, a1);                                                          \
        _mm256_storeu_pd(xc + i0 + 8, a2);                                                          \
        _mm256_storeu_pd(xc + i0 + 12, a3);                                                         \
        t1 = tree16_avx2(a0, a1, a2, a3);                                                           \
        t2 = tree16_avx2(_mm256_mul_pd(a0, a0), _mm256_mul_pd(a1, a1), _mm256_mul_pd(a2, a2),      \
                         _mm256_mul_pd(a3, a3));                                                    \
    } while (0)

__attribute__((target("avx2"))) static void prefix_blocks_f64_avx2(const double *x, Py_ssize_t n, double shift,
                                                                   double *xc, double *B1, double *B2)
{
    PREFIX_BLOCKS_BODY(X64, PREFIX_BLOCK_AVX2_F64);
}

__attribute__((target("avx2"))) static void prefix_blocks_f32_avx2(const float *x, Py_ssize_t n, double shift,
                                                                   double *xc, double *B1, double *B2)
{
    PREFIX_BLOCKS_BODY(X32, PREFIX_BLOCK_AVX2_F32);
}
#endif

/* The blocked prefix sums of x (float32 when f32, else float64): the AVX2 build where the CPU has it. */
static void prefix_blocks(const void *x, int f32, Py_ssize_t n, double shift, double *xc, double *B1, double *B2)
{
#ifdef X86_SIMD
    if (have_avx2()) {
        if (f32) prefix_blocks_f32_avx2((const float *)x, n, shift, xc, B1, B2);
        else prefix_blocks_f64_avx2((const double *)x, n, shift, xc, B1, B2);
        return;
    }
#endif
    if (f32) prefix_blocks_f32_any((const float *)x, n, shift, xc, B1, B2);
    else prefix_blocks_f64_any((const double *)x, n, shift, xc, B1, B2);
}

/* The whole arrays P1, P2 (n + 1 entries) of the blocked prefix sums B1, B2 over xc: each block's
 * entry, then its values added in sequence (p1_at / p2_at for every rank). */
static void prefix_fill(const double *xc, Py_ssize_t n, const double *B1, const double *B2, double *P1, double *P2)
{
    for (Py_ssize_t b = 0; b <= (n >> PB_SHIFT); b++) {
        Py_ssize_t i0 = b << PB_SHIFT, e = i0 + PB - 1 < n ? i0 + PB - 1 : n;
        double s1 = B1[b], s2 = B2[b];
        P1[i0] = s1;
        P2[i0] = s2;
        for (Py_ssize_t i = i0; i < e; i++) {
            s1 += xc[i];
            s2 += xc[i] * xc[i];
            P1[i + 1] = s1;
            P2[i + 1] = s2;
        }
    }
}
#undef X64
#undef X32
#undef WARRAY
#undef WSTEPS

PyDoc_STRVAR(prefix_doc,
"prefix(xs, shift, xc, buf, w=None)\n\n"
"The prefix sums of centroids._Sorted in one pass: xc = float64(xs) - shift (xs float32 or float64, n)\n"
"and buf (float64) rows W = cumsum(w), P1 = cumsum(w * xc), P2 = cumsum(w * xc * xc) (3 x (n + 1)), or\n"
"without w P1 = cumsum(xc), P2 = cumsum(xc * xc) (2 x (n + 1)), each with a leading 0: numpy's\n"
"sequential accumulate of the same products, the same values; without w from 4096 elements on, the\n"
"blocked sums of centroids._blocked_cumsum instead.  w: a float64 array, or a tuple\n"
"(a, b, wb) for the weights 1 before a, wb in [a, b), 1 from b on (the subsample's).");

static PyObject *py_prefix(PyObject *self, PyObject *args)
{
    PyObject *xo, *co, *bo, *wo = Py_None;
    double shift;
    if (!PyArg_ParseTuple(args, "OdOO|O", &xo, &shift, &co, &bo, &wo)) return NULL;
    Py_buffer xb, cb, bb, wb;
    PyObject *res = NULL;
    prefix_weights pw = {NULL, 0, 0, 1.0};
    int weighted = wo != Py_None, steps = weighted && PyTuple_Check(wo), warray = weighted && !steps;
    if (steps && !PyArg_ParseTuple(wo, "nnd", &pw.a, &pw.b, &pw.wb)) return NULL;
    if (get_buf(xo, &xb, 0, "prefix xs") < 0) return NULL;
    if (get_buf(co, &cb, 1, "prefix xc") < 0) goto f1;
    if (get_buf(bo, &bb, 1, "prefix buf") < 0) goto f2;
    if (warray && get_buf(wo, &wb, 0, "prefix w") < 0) goto f3;
    int kind = float_kind(&xb);
    Py_ssize_t n = kind ? xb.len / kind : 0, rows = weighted ? 3 : 2;
    if (!kind || float_kind(&cb) != 8 || float_kind(&bb) != 8 || cb.len / 8 != n
        || bb.len / 8 != rows * (n + 1) || (warray && (float_kind(&wb) != 8 || wb.len / 8 != n))
        || (steps && !(0 <= pw.a && pw.a <= pw.b && pw.b <= n))) {
        PyErr_SetString(PyExc_ValueError, "prefix: xs (float32 or float64, n), float64 xc, w (n, or steps (a, b, "
                                          "wb) with 0 <= a <= b <= n) and buf (3 x (n + 1) with w, 2 x (n + 1) "
                                          "without)");
        goto done;
    }
    {
        if (warray) pw.w = (const double *)wb.buf;
        double *xc = (double *)cb.buf, *B = (double *)bb.buf;
        double *W = weighted ? B : NULL, *P1 = weighted ? B + n + 1 : B, *P2 = P1 + n + 1;
        double *blk = NULL;  /* unweighted from PB_MIN_N on: the blocked sums, B1 and B2 */
        if (!weighted && n >= PB_MIN_N) {
            blk = (double *)PyMem_RawMalloc(2 * (((size_t)n >> PB_SHIFT) + 1) * sizeof(double));
            if (!blk) { PyErr_NoMemory(); goto done; }
        }
        Py_BEGIN_ALLOW_THREADS
        if (blk) {
            double *B1 = blk, *B2 = blk + (n >> PB_SHIFT) + 1;
            prefix_blocks(xb.buf, kind == 4, n, shift, xc, B1, B2);
            prefix_fill(xc, n, B1, B2, P1, P2);
        } else if (kind == 4) prefix_run_f32((const float *)xb.buf, pw, n, shift, xc, W, P1, P2);
        else prefix_run_f64((const double *)xb.buf, pw, n, shift, xc, W, P1, P2);
        Py_END_ALLOW_THREADS
        PyMem_RawFree(blk);
    }
    Py_INCREF(Py_None);
    res = Py_None;
done:
    if (warray) PyBuffer_Release(&wb);
f3:
    PyBuffer_Release(&bb);
f2:
    PyBuffer_Release(&cb);
f1:
    PyBuffer_Release(&xb);
    return res;
}

/* ---------------------------------------------------------------------------------------------- */
/* DP candidates (centroids._candidates), numpy's linspace / searchsorted / interp / unique         */
/* ---------------------------------------------------------------------------------------------- */

/* numpy.linspace(start, stop, num)[i], float64, endpoint: i * step + start with step = (stop -
 * start) / (num - 1), (i / (num - 1)) * delta + start when step is 0 (numpy's denormal rule), and
 * the last value stop itself.  num >= 2. */
static inline double linspace_at(double start, double stop, Py_ssize_t num, Py_ssize_t i)
{
    if (i == num - 1) return stop;
    double delta = stop - start, div = (double)(num - 1), step = delta / div;
    if (step == 0) return ((double)i / div) * delta + start;
    return (double)i * step + start;
}

/* numpy.interp(t, xp, fp) for one t (xp non-decreasing, n >= 2, no NaN): the last j with
 * xp[j] <= t (what numpy's binary_search_with_guess returns), its special cases and NaN retries. */
static double interp_at(double t, const double *xp, const double *fp, Py_ssize_t n)
{
    if (t < xp[0]) return fp[0];
    if (t > xp[n - 1]) return fp[n - 1];
    Py_ssize_t j = search_right(xp, n, t) - 1;
    if (j == n - 1 || xp[j] == t) return fp[j];
    double slope = (fp[j + 1] - fp[j]) / (xp[j + 1] - xp[j]);
    double r = slope * (t - xp[j]) + fp[j];
    if (isnan(r)) {
        r = slope * (t - xp[j + 1]) + fp[j + 1];
        if (isnan(r) && fp[j] == fp[j + 1]) r = fp[j];
    }
    return r;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Sort a[0 .. runs * len) in place when it is `runs` non-decreasing runs of `len`, by merging each
 * run into the sorted front (scratch: (runs - 1) * len doubles); returns 0, leaving a as it was, when
 * a run is not sorted (NaN included). */
static int merge_runs(double *a, Py_ssize_t len, int runs, double *scratch)
{
    for (int r = 0; r < runs; r++)
        for (Py_ssize_t i = r * len + 1; i < (r + 1) * len; i++)
            if (!(a[i - 1] <= a[i])) return 0;
    Py_ssize_t done = len;  /* a[0 .. done) sorted; merge the next run into it through scratch */
    for (int r = 1; r < runs; r++) {
        memcpy(scratch, a, (size_t)done * sizeof(double));
        const double *b = a + done;
        Py_ssize_t i = 0, j = 0, o = 0;
        double *m = a;  /* writing m[o] never overtakes b[j]: o = i + j <= done + j */
        while (i < done && j < len) m[o++] = b[j] < scratch[i] ? b[j++] : scratch[i++];
        while (i < done) m[o++] = scratch[i++];
        while (j < len) m[o++] = b[j++];
        done += len;
    }
    return 1;
}

PyDoc_STRVAR(cand_counts_doc,
"cand_counts(xs, W, counts)\n\n"
"centroids._candidates' bin weights: with edges = linspace(xs[0], xs[-1], nb + 1) (nb = len(counts)),\n"
"counts = diff(W[searchsorted(xs, edges, 'right')]); xs sorted float64 (n), W float64 (n + 1).");

/* Work doubles cand_counts_run needs for nb bins: the edges and their places. */
#define CAND_COUNTS_WORK(nb) (2 * ((size_t)(nb) + 1))

/* The body of cand_counts: nb bin weights into counts. */
static void cand_counts_run(const double *xs, const double *W, Py_ssize_t n, double *counts, Py_ssize_t nb,
                            double *work)
{
    double *edges = work, lo = xs[0], hi = xs[n - 1];
    Py_ssize_t *pos = (Py_ssize_t *)(work + nb + 1);
    for (Py_ssize_t i = 0; i <= nb; i++) edges[i] = linspace_at(lo, hi, nb + 1, i);
    search_keys(xs, n, edges, nb + 1, 1, pos);
    for (Py_ssize_t i = 0; i < nb; i++) counts[i] = WAT(W, pos[i + 1]) - WAT(W, pos[i]);
}

static PyObject *py_cand_counts(PyObject *self, PyObject *args)
{
    PyObject *o[3];
    Py_buffer bf[3];
    if (!PyArg_ParseTuple(args, "OOO", &o[0], &o[1], &o[2])) return NULL;
    if (get_f64_bufs(o, bf, 3, 2, "cand_counts") < 0) return NULL;
    Py_ssize_t n = bf[0].len / 8, nb = bf[2].len / 8;
    if (bf[1].len / 8 != n + 1 || n < 1 || nb < 1) {
        PyErr_SetString(PyExc_ValueError, "cand_counts: xs (n >= 1), W (n + 1), counts (>= 1) must be float64");
        release_bufs(bf, 3);
        return NULL;
    }
    double *work = nb < PY_SSIZE_T_MAX / 32 ? (double *)PyMem_RawMalloc(CAND_COUNTS_WORK(nb) * sizeof(double)) : NULL;
    if (!work) {
        release_bufs(bf, 3);
        return PyErr_NoMemory();
    }
    const double *xs = (const double *)bf[0].buf, *W = (const double *)bf[1].buf;
    double *counts = (double *)bf[2].buf;
    Py_BEGIN_ALLOW_THREADS
    cand_counts_run(xs, W, n, counts, nb, work);
    Py_END_ALLOW_THREADS
    PyMem_RawFree(work);
    release_bufs(bf, 3);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(candidates_doc,
"candidates(xs, W, dens, k, out) -> count\n\n"
"The rest of centroids._candidates given dens = cbrt(counts) (nb bins): the sorted distinct values of\n"
"xs[q], xs[pos], xs[nbr] (q: the elements covering linspace(0, W[-1] - 1, k) of the weights; pos:\n"
"searchsorted(xs, v, 'left') of the k-point uniform grid and the k companding points\n"
"interp(linspace(0, cdf[-1], k), cdf, edges); nbr: max(pos - 1, 0), from NEIGHBOUR_MIN_N elements\n"
"only where xs[pos] - xs[pos - 1] > (xs[-1] - xs[0]) / nb, else pos), into out (float64, >= 5 k);\n"
"numpy's operations.\n"
"-1 when -0.0 and 0.0 are both among them (which one np.unique keeps is its sort's choice).");

/* From this many sorted elements a snapped point's lower neighbour xs[p - 1] is a candidate only across
 * a gap wider than a density bin ((xs[-1] - xs[0]) / nb): in dense data it is all but xs[p] itself, and
 * those ~2 k near-duplicates were ~40% of the DP's candidates (centroids.NEIGHBOUR_MIN_N, the same rule). */
#define NEIGHBOUR_MIN_N 4096

/* Work doubles candidates_run needs for nb bins and k points per kind. */
#define CANDIDATES_WORK(nb, k) (2 * ((size_t)(nb) + 1) + 4 * (size_t)(k))

/* The body of candidates: the sorted distinct candidates into out (>= 5 k), their count, or -1 when
 * -0.0 and 0.0 are both among them. */
static Py_ssize_t candidates_run(const double *xs, const double *W, Py_ssize_t n, const double *dens, Py_ssize_t nb,
                                 Py_ssize_t k, double *out, double *work)
{
    Py_ssize_t cnt = 0;
    double *cdf = work, *edges = work + nb + 1;
    double lo = xs[0], hi = xs[n - 1], gap = (hi - lo) / (double)nb;
    cdf[0] = 0.0;
    for (Py_ssize_t i = 0; i < nb; i++) cdf[i + 1] = cdf[i] + dens[i];  /* numpy's sequential cumsum */
    for (Py_ssize_t i = 0; i <= nb; i++) edges[i] = linspace_at(lo, hi, nb + 1, i);
    /* five runs in out: the weighted quantiles, then for the grid and for the companding points
     * xs[p] and xs[p - 1] each (runs of k); sorted runs are merged, else all is qsorted (the same
     * multiset in order, so the same distinct values below) */
    gallop gw = gallop_init(W ? W : xs, n + (W != NULL), k);
    for (Py_ssize_t i = 0; i < k; i++) {  /* weighted quantiles: searchsorted(W, ., 'right') - 1 */
        double t = linspace_at(0.0, WAT(W, n) - 1, k, i);  /* unit W: floor(t) entries of 0..n are <= t, less one */
        Py_ssize_t q = W ? gallop_search(&gw, t, 1) - 1 : (Py_ssize_t)floor(t);
        out[cnt++] = xs[q < 0 ? 0 : q > n - 1 ? n - 1 : q];
    }
    double *keys = edges + nb + 1;  /* the merge's scratch, free until then: 2 k keys, 2 k places */
    Py_ssize_t *at = (Py_ssize_t *)(keys + 2 * k);
    for (Py_ssize_t i = 0; i < 2 * k; i++)  /* the uniform grid, then the companding points */
        keys[i] = i < k ? linspace_at(lo, hi, k, i) : interp_at(linspace_at(0.0, cdf[nb], k, i - k), cdf, edges, nb + 1);
    search_keys(xs, n, keys, k, 0, at);
    search_keys(xs, n, keys + k, k, 0, at + k);
    for (Py_ssize_t i = 0; i < 2 * k; i++) {
        Py_ssize_t p = at[i];
        if (p > n - 1) p = n - 1;
        Py_ssize_t run = i < k ? 1 : 3, at = i < k ? i : i - k;
        out[run * k + at] = xs[p];
        out[(run + 1) * k + at] = p > 0 && (n < NEIGHBOUR_MIN_N || xs[p] - xs[p - 1] > gap) ? xs[p - 1] : xs[p];
    }
    cnt = 5 * k;
    if (!merge_runs(out, k, 5, edges + nb + 1)) qsort(out, (size_t)cnt, sizeof(double), cmp_double);
    Py_ssize_t u = 0;
    for (Py_ssize_t i = 0; i < cnt; i++) {
        if (i == 0 || out[i] != out[u - 1]) out[u++] = out[i];
        else if (out[i] == 0.0 && signbit(out[i]) != signbit(out[u - 1])) { u = -1; break; }
    }
    return u;
}

static PyObject *py_candidates(PyObject *self, PyObject *args)
{
    PyObject *o[4];
    Py_buffer bf[4];
    Py_ssize_t k, cnt = 0;
    if (!PyArg_ParseTuple(args, "OOOnO", &o[0], &o[1], &o[2], &k, &o[3])) return NULL;
    if (get_f64_bufs(o, bf, 4, 3, "candidates") < 0) return NULL;
    PyObject *res = NULL;
    double *work = NULL;
    Py_ssize_t n = bf[0].len / 8, nb = bf[2].len / 8;
    if (bf[1].len / 8 != n + 1 || n < 1 || nb < 1 || k < 2 || k > PY_SSIZE_T_MAX / 16 || bf[3].len / 8 < 5 * k
        || nb > PY_SSIZE_T_MAX / 32) {
        PyErr_SetString(PyExc_ValueError,
                        "candidates: float64 xs (n >= 1), W (n + 1), dens (>= 1), out (>= 5 k), k >= 2");
        goto done;
    }
    work = (double *)PyMem_RawMalloc(CANDIDATES_WORK(nb, k) * sizeof(double));
    if (!work) { PyErr_NoMemory(); goto done; }
    {
        const double *xs = (const double *)bf[0].buf, *W = (const double *)bf[1].buf;
        const double *dens = (const double *)bf[2].buf;
        double *out = (double *)bf[3].buf;
        Py_BEGIN_ALLOW_THREADS
        cnt = candidates_run(xs, W, n, dens, nb, k, out, work);
        Py_END_ALLOW_THREADS
    }
    res = PyLong_FromSsize_t(cnt);
done:
    PyMem_RawFree(work);
    release_bufs(bf, 4);
    return res;
}

PyDoc_STRVAR(solve_sorted_doc,
"solve_sorted(s, z, m, cbrt, sweeps, out) -> count\n\n"
"centroids._solve_optimal on x's own sort s (float32 or float64, n >= 2, unweighted, z <= m) in one\n"
"call: xc = s - shift with shift = 0.5 (s[0] + s[-1]), the prefix sums (prefix), the candidates of\n"
"_candidates(xc, W, m) with the bin weights' cube roots read from cbrt (np.cbrt of 0, 1, ...), the\n"
"DP and polish (dp_polish), and the levels + shift into out (float64, >= z).  Returns their count,\n"
"or -1 where the Python path must decide (s holds at most z distinct values, a bin weight past the\n"
"table, -0.0 and 0.0 among the candidates): the same operations in the same order as those calls,\n"
"so the same levels.");

/* Whether the sorted s (n values, float32 or float64) changes value at least z times (holds more than
 * z distinct values, -0.0 and 0.0 one value): centroids._changes_at_least, from the front (dense data
 * decides within ~z elements). */
static int changes_at_least(const void *s, int f32, Py_ssize_t n, Py_ssize_t z)
{
    Py_ssize_t changes = 0;
    for (Py_ssize_t i = 1; i < n && changes < z; i++)
        changes += f32 ? ((const float *)s)[i] != ((const float *)s)[i - 1]
                       : ((const double *)s)[i] != ((const double *)s)[i - 1];
    return changes >= z;
}

/* The body of solve_sorted on the sorted s (n >= 2 values, float32 or float64; 3 <= z <= m): the
 * levels into out; returns their count, -1 where the Python path decides (see solve_sorted_doc), -2
 * when out of memory.  Needs no GIL. */
static Py_ssize_t solve_sorted_run(const void *s, int f32, Py_ssize_t n, Py_ssize_t z, Py_ssize_t m,
                                   const double *cbrt, Py_ssize_t tab, Py_ssize_t sweeps, double *out)
{
    if (!changes_at_least(s, f32, n, z)) return -1;  /* at most z values: _few_levels' unique */
    /* xc (n), the prefix sums P1, P2 (n + 1 each) or from PB_MIN_N elements on their blocks B1, B2
     * (n / PB + 1 each), counts / dens (nb), candidates (5 k), candidates' work; W is the unit
     * weights 0..n, read as the index (WAT) */
    Py_ssize_t k = m / 3 + 2, nb = 4 * m, count = -1;
    int whole = n < PB_MIN_N;
    size_t blocks = whole ? (size_t)n + 1 : ((size_t)n >> PB_SHIFT) + 1;
    size_t words = (size_t)n + 2 * blocks + (size_t)nb + 5 * (size_t)k + CANDIDATES_WORK(nb, k);
    double *work = (double *)PyMem_RawMalloc(words * sizeof(double));
    if (!work) return -2;
    const double *W = NULL;
    double *xc = work, *B1 = xc + n, *B2 = B1 + blocks, *dens = B2 + blocks;
    double *cand = dens + nb, *cwork = cand + 5 * k;
    double lo = f32 ? (double)((const float *)s)[0] : ((const double *)s)[0];
    double hi = f32 ? (double)((const float *)s)[n - 1] : ((const double *)s)[n - 1];
    double shift = 0.5 * (lo + hi);
    prefix_weights none = {NULL, 0, 0, 1.0};
    if (whole && f32) prefix_run_f32((const float *)s, none, n, shift, xc, NULL, B1, B2);
    else if (whole) prefix_run_f64((const double *)s, none, n, shift, xc, NULL, B1, B2);
    else prefix_blocks(s, f32, n, shift, xc, B1, B2);
    prefix_src ps = {whole ? B1 : NULL, whole ? B2 : NULL, xc, B1, B2};
    cand_counts_run(xc, W, n, dens, nb, cwork);  /* cwork: >= CAND_COUNTS_WORK(nb) doubles */
    int table = 1;  /* centroids._cbrt: whole counts below the table's size are looked up */
    for (Py_ssize_t i = 0; i < nb && table; i++) {
        double c = dens[i];
        if (!(c >= 0.0 && c < (double)tab && c == (double)(Py_ssize_t)c)) table = 0;
        else dens[i] = cbrt[(Py_ssize_t)c];
    }
    Py_ssize_t mc = table ? candidates_run(xc, W, n, dens, nb, k, cand, cwork) : -1;
    if (mc > 0) {
        count = dp_polish_run(xc, n, W, &ps, cand, mc, z, 1, sweeps, out);
        if (count < 0) count = -2;
        for (Py_ssize_t i = 0; i < count; i++) out[i] += shift;
    }
    PyMem_RawFree(work);
    return count;
}

/* solve_sorted's and solve_round's checks of s, z, m, the cube root table and the levels' buffer. */
static int solve_args_ok(Py_buffer *sb, Py_buffer *cb, Py_buffer *ob, Py_ssize_t z, Py_ssize_t m, const char *who)
{
    int kind = float_kind(sb);
    Py_ssize_t n = kind ? sb->len / kind : 0;
    if (!kind || float_kind(cb) != 8 || float_kind(ob) != 8 || n < 2 || z < 3 || m < z || m > 0x100000
        || n > PY_SSIZE_T_MAX / 64 || ob->len / 8 < z || cb->len / 8 < 1) {
        PyErr_Format(PyExc_ValueError, "%s: s float32 or float64 (n >= 2), 3 <= z <= m <= 2^20, "
                                       "float64 cbrt table and levels (>= z)", who);
        return 0;
    }
    return 1;
}

static PyObject *py_solve_sorted(PyObject *self, PyObject *args)
{
    PyObject *so, *co, *oo;
    Py_ssize_t z, m, sweeps, count = -1;
    if (!PyArg_ParseTuple(args, "OnnOnO", &so, &z, &m, &co, &sweeps, &oo)) return NULL;
    Py_buffer sb, cb, ob;
    PyObject *res = NULL;
    if (get_buf(so, &sb, 0, "solve_sorted s") < 0) return NULL;
    if (get_buf(co, &cb, 0, "solve_sorted cbrt") < 0) { PyBuffer_Release(&sb); return NULL; }
    if (get_buf(oo, &ob, 1, "solve_sorted out") < 0) { PyBuffer_Release(&sb); PyBuffer_Release(&cb); return NULL; }
    if (solve_args_ok(&sb, &cb, &ob, z, m, "solve_sorted")) {
        int kind = float_kind(&sb);
        Py_BEGIN_ALLOW_THREADS
        count = solve_sorted_run(sb.buf, kind == 4, sb.len / kind, z, m, (const double *)cb.buf, cb.len / 8, sweeps,
                                 (double *)ob.buf);
        Py_END_ALLOW_THREADS
        res = count == -2 ? PyErr_NoMemory() : PyLong_FromSsize_t(count);
    }
    PyBuffer_Release(&ob);
    PyBuffer_Release(&cb);
    PyBuffer_Release(&sb);
    return res;
}

/* centroids._finished: strictly increasing from exactly lo to exactly hi (the same bits at both ends). */
static int levels_finished(const double *c, Py_ssize_t count, double lo, double hi)
{
    if (count < 2 || !(c[0] == lo && c[count - 1] == hi) || !signbit(c[0]) != !signbit(lo)
        || !signbit(c[count - 1]) != !signbit(hi))
        return 0;
    for (Py_ssize_t i = 1; i < count; i++)
        if (!(c[i - 1] < c[i])) return 0;
    return 1;
}

/* centroids._finish of the solve's count levels c (room for count + 2) for the data's ends lo, hi: as
 * they are when finished, else clipped to [lo, hi] (np.clip), else np.unique of lo, them and hi (for
 * float64 data the centring's round trip can leave an end an ulp off the data's).  Returns the new
 * count, or -1 where numpy's choice among equal -0.0 and 0.0 could matter (a zero among the values),
 * a NaN, or the levels out of order: the Python path decides those. */
static Py_ssize_t finish_levels(double *c, Py_ssize_t count, double lo, double hi)
{
    if (!(lo < hi)) return -1;
    if (levels_finished(c, count, lo, hi)) return count;
    if (count < 1 || lo == 0.0 || hi == 0.0) return -1;  /* np.clip / np.unique would choose a zero's sign */
    for (Py_ssize_t i = 0; i < count; i++)
        if (c[i] == 0.0 || c[i] != c[i] || (i && c[i] < c[i - 1])) return -1;
    for (Py_ssize_t i = 0; i < count; i++) c[i] = c[i] < lo ? lo : c[i] > hi ? hi : c[i];
    if (levels_finished(c, count, lo, hi)) return count;
    memmove(c + 1, c, (size_t)count * sizeof(double));  /* lo, the clipped levels, hi: in order */
    c[0] = lo;
    c[count + 1] = hi;
    Py_ssize_t u = 1;
    for (Py_ssize_t i = 1; i < count + 2; i++)
        if (c[i] != c[u - 1]) c[u++] = c[i];
    return u;
}

/* quantize.wire_centroids of the finished levels c (count, lo = c[0], hi = c[count - 1]) to float32
 * into w (room for count): each rounded to nearest (none beyond FLT_MAX: numpy's overflow rules decide
 * those), equal neighbours merged (np.unique), then an end that rounding moved inside [lo, hi] stepped
 * outward to the first float32 past it (_outward, from the float32 nearest the end, which w holds).
 * Returns the count, or -1 where the Python path decides (a zero among merged levels, a single level,
 * an end beyond FLT_MAX, which it refuses). */
static Py_ssize_t wire_levels_f32(const double *c, Py_ssize_t count, double lo, double hi, float *w)
{
    int increasing = 1;
    for (Py_ssize_t i = 0; i < count; i++) {
        if (!(fabs(c[i]) <= (double)FLT_MAX)) return -1;
        w[i] = (float)c[i];
        increasing = increasing && (i == 0 || w[i - 1] < w[i]);
    }
    Py_ssize_t u = count;
    if (!increasing) {  /* rounding is monotone: equal neighbours only */
        u = 1;
        for (Py_ssize_t i = 0; i < count; i++) {
            if (w[i] == 0.0f) return -1;
            if (i && w[i] != w[u - 1]) w[u++] = w[i];
        }
    }
    if (u < 2) return -1;
    float a = w[0], e = w[u - 1];
    while ((double)a > lo) a = nextafterf(a, -INFINITY);
    while ((double)e < hi) e = nextafterf(e, INFINITY);
    if (!isfinite(a) || !isfinite(e)) return -1;
    w[0] = a;
    w[u - 1] = e;
    return u;
}

PyDoc_STRVAR(solve_round_doc,
"solve_round(s, x, z, m, cbrt, sweeps, key, want_J, levels, wire, ids, lo, hi) -> (count, J)\n\n"
"backends.rounding's solve, wire centroids and eq. 7's rounding of a float32 or float64 vector x (s:\n"
"its sort, n >= 2, the same dtype) to float32 wire levels in one call: solve_sorted's levels into\n"
"levels (float64, >= z) where centroids._finish keeps them as they are, those as float32 into wire\n"
"(>= z) where quantize.wire_centroids keeps them strictly increasing (for float64 data its ends\n"
"stepped outward to bracket the data, as it does), and the rounding (sround in quantize's work\n"
"precision: float32 for float32 data, float64 for float64 data; SplitMix64 key) into ids (uint8,\n"
"n), J when want_J.  Returns the levels' count and J, or (-1, 0.0) where the Python path decides\n"
"(the cases solve_sorted declines, levels those functions would merge or refuse, a span of levels\n"
"beyond FLT_MAX in float32 work): the same operations as the separate calls, so the same bytes.\n"
"lo, hi: x's min and max as the caller's reductions gave them (the values of s[0] and s[n - 1]; a\n"
"zero's sign is theirs, which _finish compares).");

static PyObject *py_solve_round(PyObject *self, PyObject *args)
{
    PyObject *so, *xo, *co, *lo_o, *wo, *io;
    Py_ssize_t z, m, sweeps, count = -1;
    unsigned long long key;
    int want_J;
    double blo, bhi;
    if (!PyArg_ParseTuple(args, "OOnnOnKpOOOdd", &so, &xo, &z, &m, &co, &sweeps, &key, &want_J, &lo_o, &wo, &io,
                          &blo, &bhi))
        return NULL;
    Py_buffer b[6];
    PyObject *o[6] = {so, xo, co, lo_o, wo, io};
    const int writable[6] = {0, 0, 0, 1, 1, 1};
    int got = 0;
    PyObject *res = NULL;
    sround_job job;
    memset(&job, 0, sizeof job);
    for (; got < 6; got++)
        if (get_buf(o[got], &b[got], writable[got], "solve_round") < 0) goto done;
    if (!solve_args_ok(&b[0], &b[2], &b[3], z, m, "solve_round")) goto done;
    const int xk = float_kind(&b[0]);
    Py_ssize_t n = b[0].len / xk;
    if (float_kind(&b[1]) != xk || b[1].len / xk != n || float_kind(&b[4]) != 4 || b[3].len / 8 < z + 2
        || b[4].len / 4 < z + 2 || z > 256 || fmt_char(&b[5]) != 'B' || b[5].itemsize != 1 || b[5].len != n) {
        PyErr_SetString(PyExc_ValueError, "solve_round: s and x float32 or float64 alike (n), z <= 256, "
                                          "float64 levels and float32 wire (>= z + 2), uint8 ids (n)");
        goto done;
    }
    {
        double s0 = xk == 4 ? (double)((const float *)b[0].buf)[0] : ((const double *)b[0].buf)[0];
        double sn = xk == 4 ? (double)((const float *)b[0].buf)[n - 1] : ((const double *)b[0].buf)[n - 1];
        if (!(blo == s0 && bhi == sn)) {
            PyErr_SetString(PyExc_ValueError, "solve_round: lo and hi must be the min and max of x (s's ends)");
            goto done;
        }
    }
    double J = 0.0;
    {
        const void *s = b[0].buf;
        double *c = (double *)b[3].buf;
        float *w = (float *)b[4].buf;
        double cw[258];  /* float64 work: the wire levels widened (quantize._work_dtype) */
        int oom = 0;
        Py_BEGIN_ALLOW_THREADS
        count = solve_sorted_run(s, xk == 4, n, z, m, (const double *)b[2].buf, b[2].len / 8, sweeps, c);
        const double lo = blo, hi = bhi;  /* the caller's, with their zeros' signs */
        count = count > 0 ? finish_levels(c, count, lo, hi) : -1;
        count = count > 0 ? wire_levels_f32(c, count, lo, hi, w) : -1;
        int keep = count >= 2 && count <= 256;
        for (Py_ssize_t i = 0; keep && xk == 8 && i < count; i++) cw[i] = (double)w[i];
        /* quantize._work_dtype: float32 steps for float32 data where the levels' span is below FLT_MAX */
        keep = keep && (xk == 8 || (double)w[count - 1] - (double)w[0] < (double)FLT_MAX);
        if (!keep) {
            if (count == -2) oom = 1;
            count = -1;
        } else {
            job.n = n; job.z = count; job.xk = xk; job.wk = xk; job.ik = 1;
            job.x = b[1].buf; job.c = xk == 4 ? (const void *)w : (const void *)cw; job.ids = b[5].buf;
            job.key = (uint64_t)key; job.want_J = want_J;
            if (sround_run(&job) < 0) oom = 1;
            else J = job.J;
        }
        Py_END_ALLOW_THREADS
        if (oom) { PyErr_NoMemory(); goto done; }
    }
    res = Py_BuildValue("nd", count, J);
done:
    while (got-- > 0) PyBuffer_Release(&b[got]);
    return res;
}

PyDoc_STRVAR(outside_doc,
"outside(x, lo, hi, out_lo, out_hi) -> (n_lo, n_hi)\n\n"
"The elements of x (float32 or float64) below lo / above hi, in index order, into out_lo / out_hi\n"
"(x's dtype).  Returns the full counts; when a count exceeds its buffer only the first elements are\n"
"written (the caller retries with larger buffers).  One pass, GIL released.");

static PyObject *py_outside(PyObject *self, PyObject *args)
{
    PyObject *xo, *lo_o, *hi_o;
    double lo, hi;
    if (!PyArg_ParseTuple(args, "OddOO", &xo, &lo, &hi, &lo_o, &hi_o)) return NULL;
    Py_buffer xb, lb, hb;
    if (get_buf(xo, &xb, 0, "x") < 0) return NULL;
    if (get_buf(lo_o, &lb, 1, "out_lo") < 0) { PyBuffer_Release(&xb); return NULL; }
    if (get_buf(hi_o, &hb, 1, "out_hi") < 0) { PyBuffer_Release(&xb); PyBuffer_Release(&lb); return NULL; }
    PyObject *res = NULL;
    int k = float_kind(&xb);
    if (!k || float_kind(&lb) != k || float_kind(&hb) != k) {
        PyErr_SetString(PyExc_ValueError, "outside: x, out_lo and out_hi must be float32 or float64 alike");
        goto done;
    }
    {
        Py_ssize_t n = xb.len / k, cl = lb.len / k, ch = hb.len / k, nl = 0, nh = 0;
        Py_BEGIN_ALLOW_THREADS
        if (k == 4 && (double)(float)lo == lo && (double)(float)hi == hi) {
            /* blocks of 64 with a branch-free (vectorisable) test first: tails are rare */
            const float *x = (const float *)xb.buf;
            const float lf = (float)lo, hf = (float)hi;
            float *ol = (float *)lb.buf, *oh = (float *)hb.buf;
            Py_ssize_t i = 0;
            for (; i < n; i += 64) {
                Py_ssize_t e = i + 64 < n ? i + 64 : n;
                int any = 0;
                for (Py_ssize_t j = i; j < e; j++) any |= (x[j] < lf) | (x[j] > hf);
                if (!any) continue;
                if (nl + 64 <= cl && nh + 64 <= ch) {  /* room for the whole block: no branches */
                    for (Py_ssize_t j = i; j < e; j++) {
                        float v = x[j];
                        ol[nl] = v;
                        nl += v < lf;
                        oh[nh] = v;
                        nh += v > hf;
                    }
                    continue;
                }
                for (Py_ssize_t j = i; j < e; j++) {
                    if (x[j] < lf) { if (nl < cl) ol[nl] = x[j]; nl++; }
                    else if (x[j] > hf) { if (nh < ch) oh[nh] = x[j]; nh++; }
                }
            }
        } else if (k == 4) {
            const float *x = (const float *)xb.buf;
            float *ol = (float *)lb.buf, *oh = (float *)hb.buf;
            for (Py_ssize_t i = 0; i < n; i++) {
                double v = (double)x[i];
                if (v < lo) { if (nl < cl) ol[nl] = x[i]; nl++; }
                else if (v > hi) { if (nh < ch) oh[nh] = x[i]; nh++; }
            }
        } else {
            const double *x = (const double *)xb.buf;
            double *ol = (double *)lb.buf, *oh = (double *)hb.buf;
            for (Py_ssize_t i = 0; i < n; i++) {
                double v = x[i];
                if (v < lo) { if (nl < cl) ol[nl] = v; nl++; }
                else if (v > hi) { if (nh < ch) oh[nh] = v; nh++; }
            }
        }
        Py_END_ALLOW_THREADS
        res = Py_BuildValue("nn", nl, nh);
    }
done:
    PyBuffer_Release(&xb);
    PyBuffer_Release(&lb);
    PyBuffer_Release(&hb);
    return res;
}

/* ---- static rANS over cluster IDs (spec/FORMAT.md 4.4, section IDSA; numpy twin: rans.py) ---- */

#define RANS_L (1u << 23)

static const char rans_encode_doc[] =
    "rans_encode(ids u8|u16|u32, f u32, cum u32, S, W, out u8, lengths i64): lane j of W codes ids j, j+W, ...\n"
    "backwards into out[j*cap:(j+1)*cap] (cap = len(out) // W) from its end; lengths[j] = bytes used.\n"
    "Every id must have f > 0. Returns 0, or -1 if a lane ran out of room.";

/* One symbol's division-free encoding step (ryg_rans' reciprocal, exact for states below 2^31, which
 * RANS_L = 2^23 and 8-bit renormalisation keep them): ((x / f) << S) + x % f + cum computed as
 * x + bias + q * (2^S - f) with q = floor(x / f) from a multiply and shifts. */
typedef struct { uint32_t xmax, rcp, shift, bias, cmpl; } rans_sym;

static void rans_sym_init(rans_sym *r, uint32_t f, uint32_t cum, int S)
{
    r->xmax = ((RANS_L >> S) << 8) * f;
    r->cmpl = (1u << S) - f;
    if (f < 2) {  /* f == 1: q = x - 1, and x + cum + 2^S - 1 + (x - 1)(2^S - 1) = (x << S) + cum */
        r->rcp = ~0u; r->shift = 0; r->bias = cum + (1u << S) - 1;
    } else {
        uint32_t shift = 0;
        while (f > (1u << shift)) shift++;
        r->rcp = (uint32_t)(((1ull << (shift + 31)) + f - 1) / f);
        r->shift = shift - 1;
        r->bias = cum;
    }
}

static PyObject *py_rans_encode(PyObject *self, PyObject *args)
{
    PyObject *io, *fo, *co, *oo, *lo;
    int S, W;
    if (!PyArg_ParseTuple(args, "OOOiiOO", &io, &fo, &co, &S, &W, &oo, &lo)) return NULL;
    Py_buffer ib, fb, cb, ob, lb;
    if (get_buf(io, &ib, 0, "ids") < 0) return NULL;
    if (get_buf(fo, &fb, 0, "f") < 0) { PyBuffer_Release(&ib); return NULL; }
    if (get_buf(co, &cb, 0, "cum") < 0) { PyBuffer_Release(&ib); PyBuffer_Release(&fb); return NULL; }
    if (get_buf(oo, &ob, 1, "out") < 0) { PyBuffer_Release(&ib); PyBuffer_Release(&fb); PyBuffer_Release(&cb); return NULL; }
    if (get_buf(lo, &lb, 1, "lengths") < 0) {
        PyBuffer_Release(&ib); PyBuffer_Release(&fb); PyBuffer_Release(&cb); PyBuffer_Release(&ob); return NULL;
    }
    PyObject *res = NULL;
    rans_sym *sym = NULL;
    Py_ssize_t isz = ib.itemsize;
    if (W < 1 || W > 64 || S < 1 || S > 22 || (isz != 1 && isz != 2 && isz != 4) || fb.itemsize != 4
        || cb.itemsize != 4 || lb.itemsize != 8 || lb.len / 8 != W || fb.len != cb.len) {
        PyErr_SetString(PyExc_ValueError, "rans_encode: bad arguments");
        goto done;
    }
    {
        const uint32_t *f = (const uint32_t *)fb.buf, *cum = (const uint32_t *)cb.buf;
        uint8_t *out = (uint8_t *)ob.buf;
        int64_t *lens = (int64_t *)lb.buf;
        Py_ssize_t n = ib.len / isz, k = fb.len / 4, cap = ob.len / W;
        uint32_t x[64];
        Py_ssize_t ptr[64], lim[64];
        int err = 0;
        sym = (rans_sym *)PyMem_RawMalloc((size_t)(k ? k : 1) * sizeof(rans_sym));
        if (!sym) { PyErr_NoMemory(); goto done; }
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t s = 0; s < k; s++) rans_sym_init(&sym[s], f[s], cum[s], S);
        for (int j = 0; j < W; j++) { x[j] = RANS_L; ptr[j] = (Py_ssize_t)(j + 1) * cap; lim[j] = (Py_ssize_t)j * cap; }
        int j = n ? (int)((n - 1) % W) : 0;
        for (Py_ssize_t i = n - 1; i >= 0; i--) {
            uint32_t s = isz == 1 ? ((const uint8_t *)ib.buf)[i]
                       : isz == 2 ? ((const uint16_t *)ib.buf)[i] : ((const uint32_t *)ib.buf)[i];
            if ((Py_ssize_t)s >= k || f[s] == 0) { err = -2; break; }
            const rans_sym *r = &sym[s];
            uint32_t xs = x[j];
            while (xs >= r->xmax) {
                if (ptr[j] <= lim[j]) { err = -1; break; }
                out[--ptr[j]] = (uint8_t)(xs & 0xff);
                xs >>= 8;
            }
            if (err) break;
            uint32_t q = (uint32_t)(((uint64_t)xs * r->rcp) >> 32) >> r->shift;
            x[j] = xs + r->bias + q * r->cmpl;
            j = j ? j - 1 : W - 1;
        }
        for (int l = 0; l < W && !err; l++) {
            if (ptr[l] - 4 < lim[l]) { err = -1; break; }
            ptr[l] -= 4;
            out[ptr[l]] = (uint8_t)x[l]; out[ptr[l] + 1] = (uint8_t)(x[l] >> 8);
            out[ptr[l] + 2] = (uint8_t)(x[l] >> 16); out[ptr[l] + 3] = (uint8_t)(x[l] >> 24);
            lens[l] = (int64_t)((Py_ssize_t)(l + 1) * cap - ptr[l]);
        }
        Py_END_ALLOW_THREADS
        if (err == -2) PyErr_SetString(PyExc_ValueError, "rans_encode: an id has no frequency");
        else res = PyLong_FromLong(err);
    }
done:
    PyMem_RawFree(sym);
    PyBuffer_Release(&ib); PyBuffer_Release(&fb); PyBuffer_Release(&cb); PyBuffer_Release(&ob); PyBuffer_Release(&lb);
    return res;
}

static const char rans_decode_part_doc[] =
    "rans_decode_part(buf u8, f u32, cum u32, S, W, x u32[W], p i64[W], ends i64[W], first, out u32, tab):\n"
    "decode len(out) ids, the IDSA ids first .. first + len(out) - 1 (id i in lane i % W), each lane from\n"
    "its state x[j] and read position p[j] (updated in place; a lane reads buf[p[j] .. ends[j])).\n"
    "tab: the slot -> id table (u16 of 2^S entries, as the caller built it once for many calls) or None\n"
    "(built here for this call). Returns 0, or 1 if a lane's stream ends before it renormalises (the\n"
    "caller checks the final states).  Optional values (k items of 2, 4 or 8 bytes): out, of that item\n"
    "size, gets values[id] instead of the id (a lookup decode without an ID array).";

static PyObject *py_rans_decode_part(PyObject *self, PyObject *args)
{
    PyObject *bo, *fo, *co, *xo, *po, *eo, *oo, *to, *vo = Py_None;
    int S, W;
    Py_ssize_t first;
    if (!PyArg_ParseTuple(args, "OOOiiOOOnOO|O", &bo, &fo, &co, &S, &W, &xo, &po, &eo, &first, &oo, &to, &vo))
        return NULL;
    Py_buffer bufs[9], vb;
    PyObject *objs[8] = {bo, fo, co, xo, po, eo, oo, to};
    const char *names[8] = {"buf", "f", "cum", "x", "p", "ends", "out", "tab"};
    int nb = to == Py_None ? 7 : 8, got = 0, has_v = vo != Py_None;
    for (; got < nb; got++)
        if (get_buf(objs[got], &bufs[got], got == 3 || got == 4 || got == 6, names[got]) < 0) {
            release_bufs(bufs, got);
            return NULL;
        }
    if (has_v && get_buf(vo, &vb, 0, "values") < 0) { release_bufs(bufs, nb); return NULL; }
    Py_buffer *bb = &bufs[0], *fb = &bufs[1], *cb = &bufs[2], *xb = &bufs[3], *pb = &bufs[4], *eb = &bufs[5],
              *ob = &bufs[6];
    PyObject *res = NULL;
    uint16_t *tab = NULL;
    /* values: out gets values[id] (items of 2, 4 or 8 bytes, one per symbol) instead of the u32 id */
    Py_ssize_t osz = has_v ? vb.itemsize : 4;
    if (W < 1 || W > 64 || S < 1 || S > 22 || first < 0 || fb->itemsize != 4 || cb->itemsize != 4
        || xb->len != 4 * W || pb->len != 8 * W || eb->len != 8 * W || ob->itemsize != osz || fb->len / 4 > 65536
        || cb->len != fb->len || (nb == 8 && (bufs[7].itemsize != 2 || bufs[7].len != ((Py_ssize_t)2 << S)))
        || (has_v && ((osz != 2 && osz != 4 && osz != 8) || vb.len != fb->len / 4 * osz))) {
        PyErr_SetString(PyExc_ValueError, "rans_decode_part: bad arguments");
        goto done;
    }
    {
        const uint8_t *buf = (const uint8_t *)bb->buf;
        const uint32_t *f = (const uint32_t *)fb->buf, *cum = (const uint32_t *)cb->buf;
        uint32_t *xs_ = (uint32_t *)xb->buf;
        int64_t *ps = (int64_t *)pb->buf;
        const int64_t *es = (const int64_t *)eb->buf;
        uint32_t *out = (uint32_t *)ob->buf;
        Py_ssize_t n = ob->len / osz, k = fb->len / 4;
        uint32_t M = 1u << S, mask = M - 1;
        for (int j = 0; j < W; j++)
            if (ps[j] < 0 || es[j] < ps[j] || es[j] > (int64_t)bb->len) {
                PyErr_SetString(PyExc_ValueError, "rans_decode_part: a lane's bytes lie outside buf");
                goto done;
            }
        uint64_t total = 0;
        for (Py_ssize_t s = 0; s < k; s++) total += f[s];
        if (total != M) {  /* the caller checked the table; the slot lookup below relies on it */
            PyErr_SetString(PyExc_ValueError, "rans_decode_part: frequencies do not sum to 2^S");
            goto done;
        }
        const uint16_t *look;
        if (nb == 8) {
            look = (const uint16_t *)bufs[7].buf;
        } else {
            tab = (uint16_t *)malloc((size_t)M * sizeof(uint16_t));
            if (!tab) { PyErr_NoMemory(); goto done; }
            for (Py_ssize_t s = 0; s < k; s++)
                for (uint32_t t = 0; t < f[s]; t++) tab[cum[s] + t] = (uint16_t)s;
            look = tab;
        }
        uint32_t x[64];
        int64_t p[64];
        for (int j = 0; j < W; j++) { x[j] = xs_[j]; p[j] = ps[j]; }
        int err = 0;
        Py_BEGIN_ALLOW_THREADS
        int j = (int)(first % W);
        for (Py_ssize_t i = 0; i < n; i++) {
            uint32_t xv = x[j], slot = xv & mask, s = look[slot];
            if (s >= k) { err = 2; break; }  /* a caller's table that does not match f */
            xv = f[s] * (xv >> S) + slot - cum[s];
            while (xv < RANS_L) {
                if (p[j] >= es[j]) { err = 1; break; }
                xv = (xv << 8) | buf[p[j]++];
            }
            if (err) break;
            x[j] = xv;
            if (!has_v) out[i] = s;
            else if (osz == 2) ((uint16_t *)ob->buf)[i] = ((const uint16_t *)vb.buf)[s];
            else if (osz == 4) out[i] = ((const uint32_t *)vb.buf)[s];
            else ((uint64_t *)ob->buf)[i] = ((const uint64_t *)vb.buf)[s];
            if (++j == W) j = 0;
        }
        Py_END_ALLOW_THREADS
        for (int jj = 0; jj < W; jj++) { xs_[jj] = x[jj]; ps[jj] = p[jj]; }
        if (err == 2) {
            PyErr_SetString(PyExc_ValueError, "rans_decode_part: tab holds an id of no frequency");
            goto done;
        }
        res = PyLong_FromLong(err);
    }
done:
    free(tab);
    release_bufs(bufs, nb);
    if (has_v) PyBuffer_Release(&vb);
    return res;
}

/* ---- rANS frequency normalisation (numpy twin: rans.normalize) ---------------------------------- */

static const int64_t *norm_f;  /* the frequencies qsort orders by (set under the GIL, read by the sort) */
#define NORM_LAZY 8  /* places of the order found one by one before sorting it all (py_normalize) */

/* largest frequency first, then the lower symbol (np.argsort(-f, kind="stable")) */
static int norm_order(const void *a, const void *b)
{
    Py_ssize_t i = *(const Py_ssize_t *)a, j = *(const Py_ssize_t *)b;
    if (norm_f[i] != norm_f[j]) return norm_f[i] > norm_f[j] ? -1 : 1;
    return i < j ? -1 : (i > j);
}

static const char normalize_doc[] =
    "normalize(counts i64, S, out i64) -> 0, -1 when more symbols are used than 2^S, -2 when a count is\n"
    "negative or they sum above 2^40 (the caller's numpy path decides)\n"
    "rans.normalize's frequencies into out: max((c 2^S + n // 2) // n, c > 0), then the difference to 2^S\n"
    "given to the largest frequency or taken from the largest ones down to 1 (ties by symbol).";

static PyObject *py_normalize(PyObject *self, PyObject *args)
{
    PyObject *co, *oo;
    int S;
    if (!PyArg_ParseTuple(args, "OiO", &co, &S, &oo)) return NULL;
    Py_buffer cb, ob;
    if (get_buf(co, &cb, 0, "counts") < 0) return NULL;
    if (get_buf(oo, &ob, 1, "out") < 0) { PyBuffer_Release(&cb); return NULL; }
    PyObject *res = NULL;
    Py_ssize_t *order = NULL;
    if (cb.itemsize != 8 || ob.itemsize != 8 || cb.len != ob.len || S < 0 || S > 30) {
        PyErr_SetString(PyExc_ValueError, "normalize: bad arguments");
        goto done;
    }
    const int64_t *c = (const int64_t *)cb.buf;
    int64_t *f = (int64_t *)ob.buf, M = (int64_t)1 << S, n = 0, used = 0, sum = 0;
    Py_ssize_t A = cb.len / 8;
    long r = A > 0 ? 0 : -2;
    for (Py_ssize_t s = 0; s < A && r == 0; s++) {
        if (c[s] < 0 || c[s] > ((int64_t)1 << 40)) r = -2;
        n += c[s];
        used += c[s] > 0;
        if (n > ((int64_t)1 << 40)) r = -2;
    }
    if (r == 0 && used > M) r = -1;
    if (r == 0) {
        for (Py_ssize_t s = 0; s < A; s++) {
            int64_t v = n ? (c[s] * M + n / 2) / n : 0;  /* c M <= 2^62: exact */
            f[s] = v < (c[s] > 0) ? (c[s] > 0) : v;
            sum += f[s];
        }
        int64_t diff = M - sum;
        if (diff != 0 && A > 0) {
            /* The loop visits the symbols in the order of their frequencies before it (norm_order) and
             * usually stops within a few: a surplus all goes to the first.  So the first NORM_LAZY
             * places are found by successive maxima (O(A) each) and the whole order is sorted only
             * when the loop gets past them (~60k instructions of qsort per call otherwise). */
            order = (Py_ssize_t *)PyMem_Malloc((size_t)A * (sizeof(Py_ssize_t) + sizeof(int64_t)));
            if (!order) { PyErr_NoMemory(); goto done; }
            int64_t *f0 = (int64_t *)(order + A);  /* the frequencies the order is by */
            memcpy(f0, f, (size_t)A * sizeof(int64_t));
            Py_ssize_t known = 0;  /* order[0 .. known) placed */
            for (Py_ssize_t i = 0; diff != 0; i++) {  /* as rans.normalize's loop */
                if (i >= known && known < A) {
                    if (known < NORM_LAZY) {  /* the next place: the largest f0 not placed, lower symbol on ties */
                        Py_ssize_t best = -1;
                        for (Py_ssize_t t = 0; t < A; t++) {
                            int placed = 0;
                            for (Py_ssize_t q = 0; q < known && !placed; q++) placed = order[q] == t;
                            if (!placed && (best < 0 || f0[t] > f0[best])) best = t;
                        }
                        order[known++] = best;
                    } else {
                        for (Py_ssize_t t = 0; t < A; t++) order[t] = t;
                        norm_f = f0;
                        qsort(order, (size_t)A, sizeof(Py_ssize_t), norm_order);
                        known = A;
                    }
                }
                Py_ssize_t s = order[i % A];
                if (diff > 0) {
                    int64_t step = i < A ? diff : 1;
                    f[s] += step;
                    diff -= step;
                } else if (f[s] > 1) {
                    int64_t take = -diff < f[s] - 1 ? -diff : f[s] - 1;
                    f[s] -= take;
                    diff += take;
                }
            }
        }
    }
    res = PyLong_FromLong(r);
done:
    PyMem_Free(order);
    PyBuffer_Release(&cb); PyBuffer_Release(&ob);
    return res;
}

/* ---- lane-parallel rANS (spec/FORMAT.md 4.6, section IDSL; numpy twin: lanes.py) ------------------ */

#define LANES_BLOCK 65536
#define LANES_MAX 32
#define LANE_SYMBOLS 2048

/* Lanes of a block of s symbols: one per LANE_SYMBOLS (rounded up), at most LANES_MAX. */
static inline int lanes_of(Py_ssize_t s)
{
    Py_ssize_t w = (s + LANE_SYMBOLS - 1) / LANE_SYMBOLS;
    return (int)(w < LANES_MAX ? w : LANES_MAX);
}

/* An encoder symbol: x' = (x div f) << S + x mod f + cum computed as x + cum + q (M - f) with
 * q = x div f = (x rcp) >> shift from a 32x32 -> 64-bit product (division by an invariant integer:
 * rcp = ceil(2^(31 + l) / f), l = ceil(log2 f), exact for x < 2^31, which every state before the
 * update is).  A symbol without frequency (f = 0) sets bit 31 instead: every coded state is below
 * 2^31, so the lanes' states ORed together mark a bad symbol (no per-symbol flag to load). */
typedef struct { uint32_t x1, x2, x3, rcp, shift, bias, cmpl, pad; } enc_sym;

static void enc_sym_init(enc_sym *e, uint32_t cum, uint32_t f, int S)
{
    /* x1, x2, x3: the renormalisation's thresholds xmax << 8i (i = 0, 1, 2), clamped to 32 bits: the
     * states compared with them are below 2^31 */
    uint64_t xmax = (uint64_t)((RANS_L >> S) << 8) * f;
    e->x1 = (uint32_t)(xmax < 0xFFFFFFFFull ? xmax : 0xFFFFFFFFull);
    e->x2 = (uint32_t)((xmax << 8) < 0xFFFFFFFFull ? (xmax << 8) : 0xFFFFFFFFull);
    e->x3 = (uint32_t)((xmax << 16) < 0xFFFFFFFFull ? (xmax << 16) : 0xFFFFFFFFull);
    e->pad = 0;
    if (f == 0) {
        e->rcp = 0; e->shift = 32; e->bias = 0x80000000u; e->cmpl = 0;
    } else {
        uint32_t l = 0;
        while (f > (1u << l)) l++;
        e->rcp = (uint32_t)(((1ull << (l + 31)) + f - 1) / f);
        e->shift = 31 + l;
        e->bias = cum;
        e->cmpl = (1u << S) - f;
    }
}

/* Symbol i of a u8 (wide = 0) or u16 (wide = 1) array. */
#define SYM_AT(P, WIDE, I) ((WIDE) ? (uint32_t)((const uint16_t *)(P))[I] : (uint32_t)((const uint8_t *)(P))[I])

/* The renormalisation's bytes below q: q[-1] = x, q[-2] = x >> 8, q[-3] = x >> 16 (q[-4] is scratch:
 * a later symbol or the lane's final state overwrites it, and the lane's region has room for it).
 * One 4-byte store of the byte-swapped state on little-endian hosts. */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
#define ENC_BYTES(q, xs) do { (q)[-1] = (uint8_t)(xs); (q)[-2] = (uint8_t)((xs) >> 8); \
                              (q)[-3] = (uint8_t)((xs) >> 16); } while (0)
#else
#define ENC_BYTES(q, xs) do { uint32_t v_ = ((xs) << 24) | (((xs) & 0xFF00u) << 8) | (((xs) >> 8) & 0xFF00u) \
                                            | ((xs) >> 24); memcpy((q) - 4, &v_, 4); } while (0)
#endif

/* Code one symbol (entry E) into the lane with state X whose stream grows down from P: the
 * renormalisation's 0..3 bytes (while x >= xmax: emit x mod 256, x >>= 8) without a data-dependent
 * branch: x >= xmax << 8i for i = 0, 1, 2 counts the bytes, and all three candidates are stored (the
 * lane's region has room: cap = 4 + 3 T), the pointer moving by the count.  THREE = 0 when S <= 16:
 * then x3 >= 2^31 is never reached and its compare is left out. */
#define ENC_PUT(X, P, E, THREE) do {                                                                    \
    uint32_t xs_ = (X);                                                                               \
    uint8_t *q_ = (P);                                                                                \
    const enc_sym *e_ = (E);                                                                          \
    ENC_BYTES(q_, xs_);                                                                               \
    uint32_t n_ = (uint32_t)(xs_ >= e_->x1) + (uint32_t)(xs_ >= e_->x2)                               \
                  + ((THREE) ? (uint32_t)(xs_ >= e_->x3) : 0u);                                       \
    (P) = q_ - n_;                                                                                    \
    xs_ >>= 8 * n_;                                                                                   \
    uint32_t qt_ = (uint32_t)(((uint64_t)xs_ * e_->rcp) >> e_->shift);                                \
    (X) = xs_ + e_->bias + qt_ * e_->cmpl;                                                            \
} while (0)

/* LANE_GROUP lanes of one block coded together, each state and pointer in a local (a register):
 * independent dependency chains the core overlaps.  Lanes [j0, j0 + LANE_GROUP) of W, rows
 * t = rows - 1 .. 0 (row t of lane j: symbol o + t W + j), after each lane's symbol of the partial
 * last row if it has one.  Returns the OR of every state it produced (bit 31: a bad symbol). */
#define LANE_GROUP 4
static inline uint32_t enc_group(const void *sym, const int wide, const int three, Py_ssize_t o, Py_ssize_t s,
                                 int W, int j0, const enc_sym *tab, uint32_t *x, uint8_t **ptr)
{
    Py_ssize_t full = s / W, i0 = full * W;
    uint32_t seen = 0;
    for (int j = j0; j < j0 + LANE_GROUP && i0 + j < s; j++) {  /* the last, partial row first */
        ENC_PUT(x[j], ptr[j], &tab[SYM_AT(sym, wide, o + i0 + j)], three);
        seen |= x[j];
    }
    uint32_t x0 = x[j0], x1 = x[j0 + 1], x2 = x[j0 + 2], x3 = x[j0 + 3];
    uint8_t *p0 = ptr[j0], *p1 = ptr[j0 + 1], *p2 = ptr[j0 + 2], *p3 = ptr[j0 + 3];
    for (Py_ssize_t t = full - 1; t >= 0; t--) {
        Py_ssize_t i = o + t * W + j0;
        ENC_PUT(x0, p0, &tab[SYM_AT(sym, wide, i)], three);
        ENC_PUT(x1, p1, &tab[SYM_AT(sym, wide, i + 1)], three);
        ENC_PUT(x2, p2, &tab[SYM_AT(sym, wide, i + 2)], three);
        ENC_PUT(x3, p3, &tab[SYM_AT(sym, wide, i + 3)], three);
        seen |= x0 | x1 | x2 | x3;
    }
    x[j0] = x0; x[j0 + 1] = x1; x[j0 + 2] = x2; x[j0 + 3] = x3;
    ptr[j0] = p0; ptr[j0 + 1] = p1; ptr[j0 + 2] = p2; ptr[j0 + 3] = p3;
    return seen;
}

/* The end of a block's W lanes (states x, streams grown down to ptr in scratch, lane j's ending at
 * (j + 1) cap): each final state before its bytes, the streams copied to out in lane order, their
 * lengths to lens.  Returns bytes written, -1 if out is too small. */
static Py_ssize_t lanes_emit(const uint32_t *x, uint8_t *const *ptr, int W, uint8_t *scratch, Py_ssize_t cap,
                             uint8_t *out, Py_ssize_t room, int64_t *lens)
{
    Py_ssize_t used = 0;
    for (int j = 0; j < W; j++) {
        uint8_t *q = ptr[j] - 4;
        q[0] = (uint8_t)x[j]; q[1] = (uint8_t)(x[j] >> 8); q[2] = (uint8_t)(x[j] >> 16); q[3] = (uint8_t)(x[j] >> 24);
        Py_ssize_t len = (scratch + (Py_ssize_t)(j + 1) * cap) - q;
        if (used + len > room) return -1;
        memcpy(out + used, q, (size_t)len);
        lens[j] = len;
        used += len;
    }
    return used;
}

/* One block: symbols [o, o + s), W lanes, coded backwards into scratch (lane j's bytes end at
 * (j + 1) * cap), LANE_GROUP lanes at a time (the rest one by one), then each lane's stream copied to
 * out in lane order.  Returns bytes written, -1 if out is too small, -2 for a symbol without frequency
 * (a u16 symbol >= k: checked before, one max over the block; a table entry with f = 0: bit 31). */
static inline Py_ssize_t lanes_encode_block(const void *sym, const int wide, const int three, Py_ssize_t o,
                                            Py_ssize_t s, const enc_sym *tab, Py_ssize_t k, uint8_t *scratch,
                                            Py_ssize_t cap, uint8_t *out, Py_ssize_t room, int64_t *lens)
{
    int W = lanes_of(s);
    uint32_t x[LANES_MAX], seen = 0;
    uint8_t *ptr[LANES_MAX];
    if (wide) {
        const uint16_t *p = (const uint16_t *)sym + o;
        uint16_t top = 0;
        for (Py_ssize_t i = 0; i < s; i++) top = p[i] > top ? p[i] : top;
        if ((Py_ssize_t)top >= k) return -2;
    }
    for (int j = 0; j < W; j++) { x[j] = RANS_L; ptr[j] = scratch + (Py_ssize_t)(j + 1) * cap; }
    int grouped = W - W % LANE_GROUP;
    for (int j0 = 0; j0 < grouped; j0 += LANE_GROUP)
        seen |= enc_group(sym, wide, three, o, s, W, j0, tab, x, ptr);
    for (int j = grouped; j < W; j++) {  /* the lanes left over, one at a time, backwards */
        for (Py_ssize_t i = o + j + ((s - 1 - j) / W) * W; i >= o + j; i -= W) {
            ENC_PUT(x[j], ptr[j], &tab[SYM_AT(sym, wide, i)], three);
            seen |= x[j];
        }
    }
    if (seen >> 31) return -2;
    return lanes_emit(x, ptr, W, scratch, cap, out, room, lens);
}

/* lanes_encode_block with its symbol width and compare count fixed (four specialised copies). */
static Py_ssize_t lanes_encode_block_u8(const void *sym, Py_ssize_t o, Py_ssize_t s, const enc_sym *tab, Py_ssize_t k,
                                        uint8_t *scratch, Py_ssize_t cap, uint8_t *out, Py_ssize_t room, int64_t *lens,
                                        int three)
{
    return three ? lanes_encode_block(sym, 0, 1, o, s, tab, k, scratch, cap, out, room, lens)
                 : lanes_encode_block(sym, 0, 0, o, s, tab, k, scratch, cap, out, room, lens);
}

static Py_ssize_t lanes_encode_block_u16(const void *sym, Py_ssize_t o, Py_ssize_t s, const enc_sym *tab, Py_ssize_t k,
                                         uint8_t *scratch, Py_ssize_t cap, uint8_t *out, Py_ssize_t room, int64_t *lens,
                                         int three)
{
    return three ? lanes_encode_block(sym, 1, 1, o, s, tab, k, scratch, cap, out, room, lens)
                 : lanes_encode_block(sym, 1, 0, o, s, tab, k, scratch, cap, out, room, lens);
}

/* ---- the byte-symbol lane coder in AVX2 (x86 with GCC or clang; picked at run time) ------------
 * A full block of byte symbols with 9 <= S <= 16: its 32 lanes as four vectors of eight states,
 * each row's 32 symbols in one pass, the table read by two gathers per vector.  The arithmetic is
 * ENC_PUT's, lane for lane (the same bytes): thresholds from f, l = ceil(log2 f) from the exponent
 * of the float 2 f - 1 (exact below 2^24), the 32x32 -> 64-bit products of even and odd lanes
 * apart.  Only the byte stores are per lane (each lane's own stream). */
#ifdef X86_SIMD
#define LANES_AVX2 1

/* rcp[c] as enc_sym's (bit 31 always set; 0 for a symbol without frequency, checked by an AND over
 * the block) and fc[c] = (f - 1) | cum << 16 (f <= 2^16, cum < 2^16: S <= 16). */
typedef struct { uint32_t rcp[256], fc[256]; } enc_tab8;

static void enc_tab8_init(enc_tab8 *t, const uint32_t *f, const uint32_t *cum, Py_ssize_t k)
{
    for (int c = 0; c < 256; c++) {
        uint32_t fs = c < k ? f[c] : 0;
        t->rcp[c] = 0;
        t->fc[c] = 0;
        if (fs == 0) continue;
        uint32_t l = 0;
        while (fs > (1u << l)) l++;
        t->rcp[c] = (uint32_t)(((1ull << (l + 31)) + fs - 1) / fs);
        t->fc[c] = (fs - 1) | (cum[c] << 16);
    }
}


/* lanes_encode_block of a full block of u8 symbols (W = 32, 2048 rows), 9 <= S <= 16. */
__attribute__((target("avx2")))
static Py_ssize_t lanes_encode_block_avx2(const uint8_t *sym, Py_ssize_t o, const enc_tab8 *tb, int S, uint8_t *scratch,
                                          Py_ssize_t cap, uint8_t *out, Py_ssize_t room, int64_t *lens)
{
    const __m256i one = _mm256_set1_epi32(1), lo16 = _mm256_set1_epi32(0xFFFF), M = _mm256_set1_epi32(1 << S);
    const __m256i cap2 = _mm256_set1_epi32(1 << (S - 8)), c96 = _mm256_set1_epi32(96);
    const __m256i lo32 = _mm256_set1_epi64x(0xFFFFFFFFll), zero = _mm256_setzero_si256();
    const __m128i a1 = _mm_cvtsi32_si128(31 - S), a2 = _mm_cvtsi32_si128(39 - S);
    const __m256i bswap = _mm256_setr_epi8(3, 2, 1, 0, 7, 6, 5, 4, 11, 10, 9, 8, 15, 14, 13, 12,
                                           3, 2, 1, 0, 7, 6, 5, 4, 11, 10, 9, 8, 15, 14, 13, 12);
    __m256i x[4], off[4], ok = _mm256_set1_epi32(-1);
    for (int v = 0; v < 4; v++) {  /* lane j's stream grows down from (j + 1) cap */
        x[v] = _mm256_set1_epi32((int)RANS_L);
        off[v] = _mm256_mullo_epi32(_mm256_setr_epi32(8 * v + 1, 8 * v + 2, 8 * v + 3, 8 * v + 4, 8 * v + 5, 8 * v + 6,
                                                      8 * v + 7, 8 * v + 8), _mm256_set1_epi32((int)cap));
    }
    int32_t tmpo[8] __attribute__((aligned(32)));
    uint32_t tmpb[8] __attribute__((aligned(32)));
    for (Py_ssize_t t = LANE_SYMBOLS - 1; t >= 0; t--) {
        const uint8_t *row = sym + o + t * LANES_MAX;
        for (int v = 0; v < 4; v++) {
            __m256i c = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(row + 8 * v)));
            __m256i rcp = _mm256_i32gather_epi32((const int *)tb->rcp, c, 4);
            __m256i fc = _mm256_i32gather_epi32((const int *)tb->fc, c, 4);
            ok = _mm256_and_si256(ok, rcp);
            __m256i f = _mm256_add_epi32(_mm256_and_si256(fc, lo16), one);
            __m256i cum = _mm256_srli_epi32(fc, 16);
            /* x >= x1 and x >= x2 as signed x > min(threshold, 2^31) - 1 (states are below 2^31) */
            __m256i t1 = _mm256_sub_epi32(_mm256_sll_epi32(f, a1), one);
            __m256i t2 = _mm256_sub_epi32(_mm256_sll_epi32(_mm256_min_epu32(f, cap2), a2), one);
            __m256i xv = x[v];
            __m256i n = _mm256_sub_epi32(zero, _mm256_add_epi32(_mm256_cmpgt_epi32(xv, t1), _mm256_cmpgt_epi32(xv, t2)));
            _mm256_store_si256((__m256i *)tmpb, _mm256_shuffle_epi8(xv, bswap));
            _mm256_store_si256((__m256i *)tmpo, off[v]);
            off[v] = _mm256_sub_epi32(off[v], n);
            for (int j = 0; j < 8; j++) memcpy(scratch + tmpo[j] - 4, &tmpb[j], 4);  /* ENC_BYTES per lane */
            __m256i xs = _mm256_srlv_epi32(xv, _mm256_slli_epi32(n, 3));
            __m256i sh = _mm256_sub_epi32(_mm256_srli_epi32(_mm256_castps_si256(_mm256_cvtepi32_ps(
                                              _mm256_sub_epi32(_mm256_add_epi32(f, f), one))), 23), c96);
            __m256i pe = _mm256_srlv_epi64(_mm256_mul_epu32(xs, rcp), _mm256_and_si256(sh, lo32));
            __m256i po = _mm256_srlv_epi64(_mm256_mul_epu32(_mm256_srli_epi64(xs, 32), _mm256_srli_epi64(rcp, 32)),
                                           _mm256_srli_epi64(sh, 32));
            __m256i q = _mm256_blend_epi32(pe, _mm256_slli_epi64(po, 32), 0xAA);
            x[v] = _mm256_add_epi32(_mm256_add_epi32(xs, cum), _mm256_mullo_epi32(q, _mm256_sub_epi32(M, f)));
        }
    }
    if (_mm256_movemask_ps(_mm256_castsi256_ps(ok)) != 0xFF) return -2;
    uint32_t xf[LANES_MAX];
    int32_t of[LANES_MAX];
    for (int v = 0; v < 4; v++) {
        _mm256_storeu_si256((__m256i *)(xf + 8 * v), x[v]);
        _mm256_storeu_si256((__m256i *)(of + 8 * v), off[v]);
    }
    uint8_t *ptr[LANES_MAX];
    for (int j = 0; j < LANES_MAX; j++) ptr[j] = scratch + of[j];
    return lanes_emit(xf, ptr, LANES_MAX, scratch, cap, out, room, lens);
}
#endif

static const char symbol_counts_doc[] =
    "symbol_counts(sym u8|u16, counts i64): counts[v] += occurrences of v in sym (len(counts) > max(sym):\n"
    "256 for u8, 65536 for u16).  Four interleaved sub-histograms; the GIL is released.";

static PyObject *py_symbol_counts(PyObject *self, PyObject *args)
{
    PyObject *so, *co;
    if (!PyArg_ParseTuple(args, "OO", &so, &co)) return NULL;
    Py_buffer sb, cb;
    if (get_buf(so, &sb, 0, "sym") < 0) return NULL;
    if (get_buf(co, &cb, 1, "counts") < 0) { PyBuffer_Release(&sb); return NULL; }
    PyObject *res = NULL;
    Py_ssize_t A = cb.len / 8, n = sb.len / (sb.itemsize ? sb.itemsize : 1);
    int64_t *sub = NULL;
    if ((sb.itemsize != 1 && sb.itemsize != 2) || cb.itemsize != 8 || A != (sb.itemsize == 1 ? 256 : 65536)) {
        PyErr_SetString(PyExc_ValueError, "symbol_counts: need u8 symbols and 256 counts, or u16 and 65536");
        goto done;
    }
    sub = (int64_t *)PyMem_RawCalloc((size_t)(4 * A), sizeof(int64_t));
    if (!sub) { PyErr_NoMemory(); goto done; }
    Py_BEGIN_ALLOW_THREADS
    int64_t *c = (int64_t *)cb.buf;
    Py_ssize_t i = 0;
    if (sb.itemsize == 1) {
        const uint8_t *p = (const uint8_t *)sb.buf;
        for (; i + 4 <= n; i += 4) { sub[p[i]]++; sub[A + p[i + 1]]++; sub[2 * A + p[i + 2]]++; sub[3 * A + p[i + 3]]++; }
        for (; i < n; i++) sub[p[i]]++;
    } else {
        const uint16_t *p = (const uint16_t *)sb.buf;
        for (; i + 4 <= n; i += 4) { sub[p[i]]++; sub[A + p[i + 1]]++; sub[2 * A + p[i + 2]]++; sub[3 * A + p[i + 3]]++; }
        for (; i < n; i++) sub[p[i]]++;
    }
    for (Py_ssize_t v = 0; v < A; v++) c[v] += sub[v] + sub[A + v] + sub[2 * A + v] + sub[3 * A + v];
    Py_END_ALLOW_THREADS
    Py_INCREF(Py_None);
    res = Py_None;
done:
    PyMem_RawFree(sub);
    PyBuffer_Release(&sb);
    PyBuffer_Release(&cb);
    return res;
}

#define PACK_PIECE 16384  /* bytes packed, then counted, per step of pack_counts */

/* Add the n bytes of p to four 256-entry sub-histograms (eight bytes a step, each sub-histogram
 * every fourth byte: a run of equal bytes does not wait on one counter's store).  n < 2^32. */
static inline void byte_counts(const uint8_t *p, Py_ssize_t n, uint32_t sub[4][256])
{
    Py_ssize_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, p + i, 8);
        sub[0][w & 255]++; sub[1][(w >> 8) & 255]++; sub[2][(w >> 16) & 255]++; sub[3][(w >> 24) & 255]++;
        sub[0][(w >> 32) & 255]++; sub[1][(w >> 40) & 255]++; sub[2][(w >> 48) & 255]++; sub[3][w >> 56]++;
    }
    for (; i < n; i++) sub[0][p[i]]++;
}

static const char pack_counts_doc[] =
    "pack_counts(ids u8, width, out u8, counts i64): pack ids width (1, 2, 4 or 8) bits wide as IDS_ does\n"
    "(LSB first; each id masked to width bits) into out (ceil(n width / 8) bytes) and add each byte's\n"
    "occurrences to counts (256): IDSL's byte symbols and their histogram, each 16 KiB piece counted right\n"
    "after it is packed (still in cache).  The GIL is released.  With xlog (float64, xlog[c] = c log2 c),\n"
    "returns sum over the 256 counts of xlog[count] added in order (lanes._sum_xlog2x, the entropy floor's\n"
    "sum), None where a count is past the table; else None.";

static PyObject *py_pack_counts(PyObject *self, PyObject *args)
{
    PyObject *io, *oo, *co, *xo = Py_None;
    int width;
    if (!PyArg_ParseTuple(args, "OiOO|O", &io, &width, &oo, &co, &xo)) return NULL;
    Py_buffer ib, ob, cb, xb;
    xb.obj = NULL;
    if (get_buf(io, &ib, 0, "ids") < 0) return NULL;
    if (get_buf(oo, &ob, 1, "out") < 0) { PyBuffer_Release(&ib); return NULL; }
    if (get_buf(co, &cb, 1, "counts") < 0) { PyBuffer_Release(&ib); PyBuffer_Release(&ob); return NULL; }
    if (xo != Py_None && (get_buf(xo, &xb, 0, "xlog") < 0 || float_kind(&xb) != 8)) {
        if (xb.obj) PyBuffer_Release(&xb);
        PyBuffer_Release(&ib); PyBuffer_Release(&ob); PyBuffer_Release(&cb);
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "pack_counts: xlog must be float64");
        return NULL;
    }
    PyObject *res = NULL;
    double xsum = 0.0;
    int have_xsum = 0;
    Py_ssize_t n = ib.len;
    if (ib.itemsize != 1 || ob.itemsize != 1 || cb.itemsize != 8 || cb.len != 256 * 8
        || (width != 1 && width != 2 && width != 4 && width != 8) || ob.len != (n * width + 7) / 8) {
        PyErr_SetString(PyExc_ValueError, "pack_counts: bad arguments");
        goto done;
    }
    Py_BEGIN_ALLOW_THREADS
    const uint8_t *v = (const uint8_t *)ib.buf;
    uint8_t *out = (uint8_t *)ob.buf;
    int64_t *c = (int64_t *)cb.buf;
    uint32_t sub[4][256];
    const int per = 8 / width;
    const uint32_t mask = (1u << width) - 1;
    Py_ssize_t m = n / per;
    for (Py_ssize_t i0 = 0; i0 < m; i0 += PACK_PIECE) {  /* a piece packed (vectorised), then counted in L1 */
        Py_ssize_t i1 = i0 + PACK_PIECE < m ? i0 + PACK_PIECE : m;
        if (width == 8) memcpy(out + i0, v + i0, (size_t)(i1 - i0));
        else if (width == 4)
            for (Py_ssize_t i = i0; i < i1; i++) out[i] = (uint8_t)((v[2 * i] & 15u) | (v[2 * i + 1] << 4));
        else if (width == 2)
            for (Py_ssize_t i = i0; i < i1; i++)
                out[i] = (uint8_t)((v[4 * i] & 3u) | ((v[4 * i + 1] & 3u) << 2) | ((v[4 * i + 2] & 3u) << 4)
                                   | (v[4 * i + 3] << 6));
        else
            for (Py_ssize_t i = i0; i < i1; i++) {
                uint32_t b = 0;
                for (int j = 0; j < 8; j++) b |= (v[8 * i + j] & 1u) << j;
                out[i] = (uint8_t)b;
            }
        memset(sub, 0, sizeof(sub));
        byte_counts(out + i0, i1 - i0, sub);
        for (int s = 0; s < 256; s++) c[s] += (int64_t)sub[0][s] + sub[1][s] + sub[2][s] + sub[3][s];
    }
    if (m * per < n) {  /* the last byte: the IDs left, zero padding bits */
        uint32_t b = 0;
        for (Py_ssize_t j = m * per; j < n; j++) b |= (v[j] & mask) << ((j - m * per) * width);
        out[m] = (uint8_t)b;
        c[b]++;
    }
    if (xb.obj) {  /* sum c log2 c from the table, in the order of np.add.accumulate (the numpy twin) */
        const double *t = (const double *)xb.buf;
        Py_ssize_t tn = xb.len / 8;
        have_xsum = 1;
        for (int s = 0; s < 256 && have_xsum; s++) {
            if (c[s] < 0 || c[s] >= tn) have_xsum = 0;
            else xsum += t[c[s]];
        }
    }
    Py_END_ALLOW_THREADS
    if (have_xsum) {
        res = PyFloat_FromDouble(xsum);
    } else {
        Py_INCREF(Py_None);
        res = Py_None;
    }
done:
    if (xb.obj) PyBuffer_Release(&xb);
    PyBuffer_Release(&ib); PyBuffer_Release(&ob); PyBuffer_Release(&cb);
    return res;
}

/* ---- a screen for structure zstd could use beyond order-0 coding (numpy twin: wire/structure.py) ---- */

#define SCREEN_KEY 5  /* bytes per repeat key: zstd level 3's shortest match */
#define SCREEN_BITS 14  /* the anchor table: 2^14 slots, the earliest anchor of each hash */
#define SCREEN_MUL 0x9E3779B97F4A7C15ull

/* The SCREEN_KEY bytes at p (little-endian; one 8-byte load where 8 bytes remain before end). */
static inline uint64_t screen_key(const uint8_t *p, const uint8_t *end)
{
#if PY_LITTLE_ENDIAN
    if (end - p >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        return w & (((uint64_t)1 << (8 * SCREEN_KEY)) - 1);
    }
#else
    (void)end;
#endif
    return (uint64_t)p[0] | (uint64_t)p[1] << 8 | (uint64_t)p[2] << 16 | (uint64_t)p[3] << 24 | (uint64_t)p[4] << 32;
}

/* One slice p[0, n) (n <= 2^16): hits of its last `window` bytes' keys against its anchors (the
 * earliest of each hash), its window's bytes counted in hist.  A slot holds the anchor's position + 1
 * and 16 more bits of its hash, so that a probe meeting another key rarely loads it. */
static Py_ssize_t screen_slice(const uint8_t *p, Py_ssize_t n, Py_ssize_t stride, Py_ssize_t window, int64_t *hist)
{
    const uint8_t *end = p + n;
    uint32_t tab[1 << SCREEN_BITS];
    memset(tab, 0, sizeof(tab));
    Py_ssize_t nk = n >= SCREEN_KEY ? n - SCREEN_KEY + 1 : 0, hits = 0;
    for (Py_ssize_t j = nk > 0 ? (nk - 1) / stride * stride : -1; j >= 0; j -= stride) {  /* last first: */
        uint64_t g = screen_key(p + j, end) * SCREEN_MUL;  /* the earliest anchor of a hash stays */
        tab[g >> (64 - SCREEN_BITS)] = (uint32_t)(j + 1) | (uint32_t)((g >> 32) & 0xFFFF0000u);
    }
    Py_ssize_t p0 = n > window ? n - window : 0;
    for (Py_ssize_t j = p0; j < nk; j++) {
        uint64_t k = screen_key(p + j, end), g = k * SCREEN_MUL;
        uint32_t slot = tab[g >> (64 - SCREEN_BITS)];
        if ((slot ^ (uint32_t)(g >> 32)) >> 16) continue;  /* empty, or another hash: no load */
        Py_ssize_t a = (Py_ssize_t)(slot & 0xFFFFu) - 1;
        hits += a >= 0 && a != j && screen_key(p + a, end) == k;
    }
    uint32_t sub[4][256];
    memset(sub, 0, sizeof(sub));
    byte_counts(p + p0, n - p0, sub);
    for (int v = 0; v < 256; v++) hist[v] += (int64_t)sub[0][v] + sub[1][v] + sub[2][v] + sub[3][v];
    return hits;
}

static const char byte_screen_doc[] =
    "byte_screen(buf u8, starts i64, length, stride, window, hist i64) -> hits\n"
    "For each slice buf[starts[i], starts[i] + length) (length <= 2^16; clipped to buf): keys are the 5\n"
    "bytes at each position j <= its length - 5, hashed to 14 bits ((key * 0x9E3779B97F4A7C15 mod 2^64)\n"
    ">> 50); anchors are positions 0, stride, 2 stride, ..., the earliest of each hash kept; the window is\n"
    "its last `window` bytes.  hits: the windows' key positions whose hash's anchor is another position\n"
    "with the same key, summed; hist[i, v] += occurrences of v in slice i's window (hist: len(starts) x 256).\n"
    "The GIL is released.";

static PyObject *py_byte_screen(PyObject *self, PyObject *args)
{
    PyObject *bo, *so, *ho;
    Py_ssize_t length, stride, window;
    if (!PyArg_ParseTuple(args, "OOnnnO", &bo, &so, &length, &stride, &window, &ho)) return NULL;
    Py_buffer bb, sb, hb;
    if (get_buf(bo, &bb, 0, "buf") < 0) return NULL;
    if (get_buf(so, &sb, 0, "starts") < 0) { PyBuffer_Release(&bb); return NULL; }
    if (get_buf(ho, &hb, 1, "hist") < 0) { PyBuffer_Release(&bb); PyBuffer_Release(&sb); return NULL; }
    PyObject *res = NULL;
    Py_ssize_t ns = sb.len / 8;
    const int64_t *st = (const int64_t *)sb.buf;
    int ok = bb.itemsize == 1 && sb.itemsize == 8 && hb.itemsize == 8 && hb.len == ns * 256 * 8 && stride >= 1
             && window >= 0 && length >= 0 && length <= 65536;
    for (Py_ssize_t i = 0; ok && i < ns; i++) ok = st[i] >= 0 && st[i] <= bb.len;
    if (!ok) {
        PyErr_SetString(PyExc_ValueError, "byte_screen: bad arguments");
        goto done;
    }
    Py_ssize_t hits = 0;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < ns; i++) {
        Py_ssize_t n = bb.len - st[i] < length ? bb.len - st[i] : length;
        hits += screen_slice((const uint8_t *)bb.buf + st[i], n, stride, window, (int64_t *)hb.buf + 256 * i);
    }
    Py_END_ALLOW_THREADS
    res = PyLong_FromSsize_t(hits);
done:
    PyBuffer_Release(&bb); PyBuffer_Release(&sb); PyBuffer_Release(&hb);
    return res;
}

static const char lanes_encode_doc[] =
    "lanes_encode(sym u8|u16, f u32, cum u32, S, m, b0, b1, out u8, lens i64[, simd=1]) -> bytes written\n"
    "IDSL lane streams of blocks [b0, b1) of the m symbols sym (FORMAT.md 4.6) into out, lane after lane;\n"
    "lens: each of their lanes' lengths.  Returns -2 for a symbol without frequency, -1 if out is too small.\n"
    "simd=0 leaves out the AVX2 coder of full byte-symbol blocks (the same bytes; for tests).";

static PyObject *py_lanes_encode(PyObject *self, PyObject *args)
{
    PyObject *so, *fo, *co, *oo, *lo;
    int S;
    Py_ssize_t m, b0, b1;
    int simd = 1;
    if (!PyArg_ParseTuple(args, "OOOinnnOO|i", &so, &fo, &co, &S, &m, &b0, &b1, &oo, &lo, &simd)) return NULL;
    Py_buffer sb, fb, cb, ob, lb;
    if (get_buf(so, &sb, 0, "sym") < 0) return NULL;
    if (get_buf(fo, &fb, 0, "f") < 0) { PyBuffer_Release(&sb); return NULL; }
    if (get_buf(co, &cb, 0, "cum") < 0) { PyBuffer_Release(&sb); PyBuffer_Release(&fb); return NULL; }
    if (get_buf(oo, &ob, 1, "out") < 0) { PyBuffer_Release(&sb); PyBuffer_Release(&fb); PyBuffer_Release(&cb); return NULL; }
    if (get_buf(lo, &lb, 1, "lens") < 0) {
        PyBuffer_Release(&sb); PyBuffer_Release(&fb); PyBuffer_Release(&cb); PyBuffer_Release(&ob); return NULL;
    }
    PyObject *res = NULL;
    enc_sym *tab = NULL;
    uint8_t *scratch = NULL;
#ifdef LANES_AVX2
    enc_tab8 *tab8 = NULL;
#endif
    Py_ssize_t nb = (m + LANES_BLOCK - 1) / LANES_BLOCK;
    int wide = sb.itemsize == 2;
    if (S < 1 || S > 22 || (sb.itemsize != 1 && sb.itemsize != 2) || sb.len / sb.itemsize != m || fb.itemsize != 4
        || cb.itemsize != 4 || fb.len != cb.len || lb.itemsize != 8 || b0 < 0 || b1 > nb || b0 > b1
        || fb.len / 4 > 65536) {
        PyErr_SetString(PyExc_ValueError, "lanes_encode: bad arguments");
        goto done;
    }
    {
        Py_ssize_t lanes = 0;
        for (Py_ssize_t b = b0; b < b1; b++) {
            Py_ssize_t s = b + 1 < nb ? LANES_BLOCK : m - b * LANES_BLOCK;
            lanes += lanes_of(s);
        }
        if (lb.len / 8 != lanes) {
            PyErr_SetString(PyExc_ValueError, "lanes_encode: lens must have one entry per lane of the blocks");
            goto done;
        }
    }
    {
        const uint32_t *f = (const uint32_t *)fb.buf, *cum = (const uint32_t *)cb.buf;
        Py_ssize_t k = fb.len / 4;
        Py_ssize_t cap = 4 + 3 * (LANES_BLOCK / LANES_MAX);
        Py_ssize_t entries = wide ? k : 256;  /* u8 symbols index all 256 entries (those >= k are bad) */
        tab = (enc_sym *)PyMem_RawMalloc((size_t)(entries > k ? entries : k) * sizeof(enc_sym));
        scratch = (uint8_t *)PyMem_RawMalloc((size_t)(LANES_MAX * cap));
        if (!tab || !scratch) { PyErr_NoMemory(); goto done; }
#ifdef LANES_AVX2
        int vec;  /* full byte-symbol blocks by the AVX2 coder: a table it can hold, a CPU that has it */
        vec = simd && !wide && S >= 9 && S <= 16 && k <= 256 && have_avx2();
        /* a symbol without frequency may sit at cum = M (those after the last used one): it never
         * enters the table (enc_tab8_init skips it), so only used symbols need cum < 2^16 */
        for (Py_ssize_t c = 0; vec && c < k; c++) vec = f[c] <= (1u << S) && (f[c] == 0 || cum[c] < (1u << S));
        if (vec && !(tab8 = (enc_tab8 *)PyMem_RawMalloc(sizeof(enc_tab8)))) { PyErr_NoMemory(); goto done; }
#else
        (void)simd;
#endif
        Py_ssize_t used = 0;
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t c = 0; c < k; c++) enc_sym_init(&tab[c], cum[c], f[c], S);
        for (Py_ssize_t c = k; c < entries; c++) enc_sym_init(&tab[c], 0, 0, S);
#ifdef LANES_AVX2
        if (vec) enc_tab8_init(tab8, f, cum, k);
#endif
        int64_t *lens = (int64_t *)lb.buf;
        for (Py_ssize_t b = b0; b < b1 && used >= 0; b++) {
            Py_ssize_t s = b + 1 < nb ? LANES_BLOCK : m - b * LANES_BLOCK, got;
#ifdef LANES_AVX2
            if (vec && s == LANES_BLOCK)
                got = lanes_encode_block_avx2((const uint8_t *)sb.buf, b * LANES_BLOCK, tab8, S, scratch, cap,
                                              (uint8_t *)ob.buf + used, ob.len - used, lens);
            else
#endif
            got = (wide ? lanes_encode_block_u16 : lanes_encode_block_u8)(
                sb.buf, b * LANES_BLOCK, s, tab, k, scratch, cap, (uint8_t *)ob.buf + used, ob.len - used, lens, S > 16);
            lens += lanes_of(s);
            used = got < 0 ? got : used + got;
        }
        Py_END_ALLOW_THREADS
        res = PyLong_FromSsize_t(used);
    }
done:
    PyMem_RawFree(tab);
    PyMem_RawFree(scratch);
#ifdef LANES_AVX2
    PyMem_RawFree(tab8);
#endif
    PyBuffer_Release(&sb); PyBuffer_Release(&fb); PyBuffer_Release(&cb); PyBuffer_Release(&ob); PyBuffer_Release(&lb);
    return res;
}

/* Decode one symbol of a lane: the state update, then the renormalisation (while x < 2^23:
 * x = x << 8 | next byte) without a data-dependent branch where 3 bytes remain: x < 2^(23 - 8i) for
 * i = 0, 1, 2 counts the bytes (independent of their values), read as one big-endian run.  0, or 1
 * when the stream ends first. */
static inline int dec_get(uint32_t *x, const uint8_t **p, const uint8_t *end, const uint16_t *slot_sym,
                          const uint32_t *f, const uint32_t *cum, int S, uint32_t mask, uint32_t *c)
{
    uint32_t xs = *x, slot = xs & mask, sy = slot_sym[slot];
    xs = f[sy] * (xs >> S) + slot - cum[sy];
    const uint8_t *q = *p;
    if (end - q >= 3) {
        int n = (xs < RANS_L) + (xs < (RANS_L >> 8)) + (xs < (RANS_L >> 16));
        uint64_t v = ((uint64_t)xs << 24) | ((uint32_t)q[0] << 16) | ((uint32_t)q[1] << 8) | q[2];
        xs = (uint32_t)(v >> (24 - 8 * n));
        q += n;
    } else {
        while (xs < RANS_L) {
            if (q >= end) return 1;
            xs = (xs << 8) | *q++;
        }
    }
    *x = xs;
    *p = q;
    *c = sy;
    return 0;
}

#if defined(__GNUC__) || defined(__clang__)
#define BSWAP32(v) __builtin_bswap32(v)
#else
#define BSWAP32(v) ((((v) & 0xFFu) << 24) | (((v) & 0xFF00u) << 8) | (((v) >> 8) & 0xFF00u) | ((v) >> 24))
#endif

/* dec_get for a lane with at least 4 bytes left (the caller checks), its state and pointer in
 * locals: the renormalisation's 0..3 bytes read as one big-endian 4-byte word. */
#define DEC_STEP(X, P, C) do {                                                                          \
    uint32_t x_ = (X), slot_ = x_ & mask, sy_ = slot_sym[slot_];                                        \
    x_ = f[sy_] * (x_ >> S) + slot_ - cum[sy_];                                                         \
    uint32_t n_ = (uint32_t)(x_ < RANS_L) + (uint32_t)(x_ < (RANS_L >> 8)) + (uint32_t)(x_ < (RANS_L >> 16)); \
    uint32_t w_;                                                                                        \
    memcpy(&w_, (P), 4);                                                                                \
    (X) = (uint32_t)((((uint64_t)x_ << 32) | BSWAP32(w_)) >> (32 - 8 * n_));                           \
    (P) += n_;                                                                                          \
    (C) = sy_;                                                                                          \
} while (0)

/* Symbol C of row t, lane j of the block's output: the symbol itself (u8, or u16 when wide), or
 * with V > 0 the symbol's V-byte row of the value table (the IDs' values, never the IDs). */
#define DEC_OUT(T, J, C) do {                                                                          \
    Py_ssize_t i_ = (T) * W + (J);                                                                      \
    if (V) memcpy(ov + i_ * V, rows + (size_t)(C) * V, V);                                              \
    else if (wide) o16[i_] = (uint16_t)(C); else o8[i_] = (uint8_t)(C);                                 \
} while (0)

/* One block's W lanes decoded into out[o, o + s); 1 if a lane is corrupt.  Four lanes at a time
 * through the full rows, their states and pointers in locals (independent chains) while each has
 * 4 bytes left, then dec_get's careful steps; the other lanes and the partial last row by dec_get. */
static inline int lanes_decode_block(const uint8_t *buf, const uint16_t *slot_sym, const uint32_t *f, const uint32_t *cum,
                                     int S, Py_ssize_t o, Py_ssize_t s, const int64_t *st, const int64_t *ln, void *out,
                                     const int wide, const uint8_t *rows, const int V)
{
    int W = lanes_of(s);
    uint32_t x[LANES_MAX], mask = (1u << S) - 1, c;
    const uint8_t *p[LANES_MAX], *end[LANES_MAX];
    for (int j = 0; j < W; j++) {
        p[j] = buf + st[j];
        end[j] = p[j] + ln[j];
        x[j] = (uint32_t)p[j][0] | ((uint32_t)p[j][1] << 8) | ((uint32_t)p[j][2] << 16) | ((uint32_t)p[j][3] << 24);
        if (x[j] >> 31) return 1;  /* a coder's state is below 2^31: every step then stays below it */
        p[j] += 4;
    }
    uint8_t *o8 = (uint8_t *)out + o;
    uint16_t *o16 = (uint16_t *)out + o;
    uint8_t *ov = (uint8_t *)out + o * V;
    Py_ssize_t full = s / W;
    int grouped = W - W % 4;
    for (int j0 = 0; j0 < grouped; j0 += 4) {
        uint32_t x0 = x[j0], x1 = x[j0 + 1], x2 = x[j0 + 2], x3 = x[j0 + 3], c0, c1, c2, c3;
        const uint8_t *p0 = p[j0], *p1 = p[j0 + 1], *p2 = p[j0 + 2], *p3 = p[j0 + 3];
        const uint8_t *e0 = end[j0] - 4, *e1 = end[j0 + 1] - 4, *e2 = end[j0 + 2] - 4, *e3 = end[j0 + 3] - 4;
        Py_ssize_t t = 0;
        for (; t < full && p0 <= e0 && p1 <= e1 && p2 <= e2 && p3 <= e3; t++) {
            DEC_STEP(x0, p0, c0); DEC_STEP(x1, p1, c1); DEC_STEP(x2, p2, c2); DEC_STEP(x3, p3, c3);
            DEC_OUT(t, j0, c0); DEC_OUT(t, j0 + 1, c1); DEC_OUT(t, j0 + 2, c2); DEC_OUT(t, j0 + 3, c3);
        }
        x[j0] = x0; x[j0 + 1] = x1; x[j0 + 2] = x2; x[j0 + 3] = x3;
        p[j0] = p0; p[j0 + 1] = p1; p[j0 + 2] = p2; p[j0 + 3] = p3;
        for (; t < full; t++)  /* the rows left, near a stream's end */
            for (int j = j0; j < j0 + 4; j++) {
                if (dec_get(&x[j], &p[j], end[j], slot_sym, f, cum, S, mask, &c)) return 1;
                DEC_OUT(t, j, c);
            }
    }
    for (Py_ssize_t t = 0; t < full; t++)
        for (int j = grouped; j < W; j++) {
            if (dec_get(&x[j], &p[j], end[j], slot_sym, f, cum, S, mask, &c)) return 1;
            DEC_OUT(t, j, c);
        }
    for (int j = 0; j < (int)(s - full * W); j++) {  /* the last, partial row */
        if (dec_get(&x[j], &p[j], end[j], slot_sym, f, cum, S, mask, &c)) return 1;
        DEC_OUT(full, j, c);
    }
    for (int j = 0; j < W; j++)
        if (x[j] != RANS_L || p[j] != end[j]) return 1;
    return 0;
}

/* lanes_decode_block's value mode with V fixed (one specialised copy per row size: the copies are
 * then plain moves). */
static int lanes_decode_block_values(const uint8_t *buf, const uint16_t *slot_sym, const uint32_t *f,
                                     const uint32_t *cum, int S, Py_ssize_t o, Py_ssize_t s, const int64_t *st,
                                     const int64_t *ln, void *out, const uint8_t *rows, int V)
{
#define DEC_VALUES(VV) return lanes_decode_block(buf, slot_sym, f, cum, S, o, s, st, ln, out, 0, rows, VV)
    switch (V) {
        case 1: DEC_VALUES(1);
        case 2: DEC_VALUES(2);
        case 4: DEC_VALUES(4);
        case 8: DEC_VALUES(8);
        case 16: DEC_VALUES(16);
        case 32: DEC_VALUES(32);
        default: DEC_VALUES(64);
    }
#undef DEC_VALUES
}

#ifdef LANES_AVX2
/* One block of byte symbols (W lanes, s symbols) in AVX2, S <= 16: the lanes as ceil(W / 8) vectors
 * of eight states (lanes past W idle: they read the section's first word and never move), each row's
 * symbols decoded together while every lane has 4 bytes left, then dec_get's careful steps for the
 * rows left and the partial last row.  Per vector and row: the slot's symbol (a byte table padded by
 * 3, read by a gather), its (f - 1) | cum << 16 (a gather) -- or, where every f <= 2^12 (tab32),
 * both from one gather of sym | (f - 1) << 8 | (slot - cum) << 20 --, DEC_STEP's arithmetic lane for lane
 * (f (x >> S) < 2^31: x < 2^31, f <= 2^S), the renormalisation's 0..3 bytes from a gathered
 * big-endian word per lane.  Output: with V = 4 or 8 (W = 32 only) the symbols' V-byte rows, gathered
 * and stored 8 at a time (the IDs never stored; with nt, 32-byte aligned rows, by non-temporal stores,
 * fenced before the careful steps: an output larger than the caches is written without reading each
 * line first); with V = 0 the symbols as bytes (8 stored at a
 * time: up to 7 bytes past a row's end, rewritten by the next row; out needs 8 bytes of slack).
 * The same symbols and the same rejections as the scalar decoder. */
__attribute__((target("avx2")))
static int lanes_decode_block_avx2(const uint8_t *buf, const uint8_t *slot8, const uint32_t *fc, const uint32_t *tab32,
                                   const uint16_t *slot_sym, const uint32_t *f, const uint32_t *cum, int S, Py_ssize_t s,
                                   const int64_t *st, const int64_t *ln, uint8_t *ov, const uint8_t *rows, int V, int nt)
{
    const int W = lanes_of(s), nv = (W + 7) / 8;
    const Py_ssize_t full = s / W;
    uint32_t x[LANES_MAX] __attribute__((aligned(32))), mask = (1u << S) - 1, c;
    int32_t po[LANES_MAX] __attribute__((aligned(32))), eo[LANES_MAX] __attribute__((aligned(32)));
    int32_t on[LANES_MAX] __attribute__((aligned(32)));
    for (int j = 0; j < 8 * nv; j++) {
        on[j] = j < W ? -1 : 0;
        x[j] = RANS_L;
        po[j] = 0;
        eo[j] = INT32_MAX;
        if (j >= W) continue;
        const uint8_t *q = buf + st[j];
        x[j] = (uint32_t)q[0] | ((uint32_t)q[1] << 8) | ((uint32_t)q[2] << 16) | ((uint32_t)q[3] << 24);
        if (x[j] >> 31) return 1;
        po[j] = (int32_t)(st[j] + 4);
        eo[j] = (int32_t)(st[j] + ln[j] - 4);  /* a lane's word at po is inside its stream while po <= eo */
    }
    const __m256i maskv = _mm256_set1_epi32((int)mask), lo16 = _mm256_set1_epi32(0xFFFF), lo8 = _mm256_set1_epi32(0xFF);
    const __m256i lo12 = _mm256_set1_epi32(0xFFF);
    const __m256i one = _mm256_set1_epi32(1), c32 = _mm256_set1_epi32(32), zero = _mm256_setzero_si256();
    const __m256i L0 = _mm256_set1_epi32((int)RANS_L), L1 = _mm256_set1_epi32((int)(RANS_L >> 8)),
                  L2 = _mm256_set1_epi32((int)(RANS_L >> 16));
    const __m128i sv = _mm_cvtsi32_si128(S);
    const __m256i bswap = _mm256_setr_epi8(3, 2, 1, 0, 7, 6, 5, 4, 11, 10, 9, 8, 15, 14, 13, 12,
                                           3, 2, 1, 0, 7, 6, 5, 4, 11, 10, 9, 8, 15, 14, 13, 12);
    const __m256i low = _mm256_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
                                         0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
    const __m256i join = _mm256_setr_epi32(0, 4, 1, 1, 1, 1, 1, 1);
    __m256i xv[4], pv[4], ev[4], act[4];
    nt = nt && (V == 8 || V == 4) && !((uintptr_t)ov & 31);  /* every row's stores then 32-byte aligned */
    for (int v = 0; v < nv; v++) {
        xv[v] = _mm256_load_si256((const __m256i *)(x + 8 * v));
        pv[v] = _mm256_load_si256((const __m256i *)(po + 8 * v));
        ev[v] = _mm256_load_si256((const __m256i *)(eo + 8 * v));
        act[v] = _mm256_load_si256((const __m256i *)(on + 8 * v));
    }
    Py_ssize_t t = 0;
    for (; t < full; t++) {
        __m256i late = _mm256_cmpgt_epi32(pv[0], ev[0]);
        for (int v = 1; v < nv; v++) late = _mm256_or_si256(late, _mm256_cmpgt_epi32(pv[v], ev[v]));
        if (!_mm256_testz_si256(late, late)) break;
        uint8_t *orow = ov + t * W * (V ? V : 1);
        for (int v = 0; v < nv; v++) {
            __m256i slot = _mm256_and_si256(xv[v], maskv), sym, xs;
            if (tab32) {  /* every f <= 2^12: one gather of sym | (f - 1) << 8 | (slot - cum) << 20 */
                __m256i e = _mm256_i32gather_epi32((const int *)tab32, slot, 4);
                sym = _mm256_and_si256(e, lo8);
                __m256i fs = _mm256_add_epi32(_mm256_and_si256(_mm256_srli_epi32(e, 8), lo12), one);
                xs = _mm256_add_epi32(_mm256_mullo_epi32(fs, _mm256_srl_epi32(xv[v], sv)), _mm256_srli_epi32(e, 20));
            } else {
                sym = _mm256_and_si256(_mm256_i32gather_epi32((const int *)slot8, slot, 1), lo8);
                __m256i e = _mm256_i32gather_epi32((const int *)fc, sym, 4);
                __m256i fs = _mm256_add_epi32(_mm256_and_si256(e, lo16), one);
                xs = _mm256_add_epi32(_mm256_mullo_epi32(fs, _mm256_srl_epi32(xv[v], sv)),
                                      _mm256_sub_epi32(slot, _mm256_srli_epi32(e, 16)));
            }
            __m256i n = _mm256_sub_epi32(zero, _mm256_add_epi32(_mm256_add_epi32(_mm256_cmpgt_epi32(L0, xs),
                                                                                 _mm256_cmpgt_epi32(L1, xs)),
                                                                _mm256_cmpgt_epi32(L2, xs)));
            n = _mm256_and_si256(n, act[v]);  /* idle lanes stay at their word */
            __m256i wd = _mm256_shuffle_epi8(_mm256_i32gather_epi32((const int *)buf, pv[v], 1), bswap);
            __m256i n8 = _mm256_slli_epi32(n, 3);
            xv[v] = _mm256_or_si256(_mm256_sllv_epi32(xs, n8), _mm256_srlv_epi32(wd, _mm256_sub_epi32(c32, n8)));
            pv[v] = _mm256_add_epi32(pv[v], n);
            if (V == 8) {
                __m256i lo = _mm256_i32gather_epi64((const long long *)rows, _mm256_castsi256_si128(sym), 8);
                __m256i hi = _mm256_i32gather_epi64((const long long *)rows, _mm256_extracti128_si256(sym, 1), 8);
                if (nt) {
                    _mm256_stream_si256((__m256i *)(orow + 64 * v), lo);
                    _mm256_stream_si256((__m256i *)(orow + 64 * v + 32), hi);
                } else {
                    _mm256_storeu_si256((__m256i *)(orow + 64 * v), lo);
                    _mm256_storeu_si256((__m256i *)(orow + 64 * v + 32), hi);
                }
            } else if (V == 4) {
                __m256i val = _mm256_i32gather_epi32((const int *)rows, sym, 4);
                if (nt) _mm256_stream_si256((__m256i *)(orow + 32 * v), val);
                else _mm256_storeu_si256((__m256i *)(orow + 32 * v), val);
            } else {
                __m256i b8 = _mm256_permutevar8x32_epi32(_mm256_shuffle_epi8(sym, low), join);
                _mm_storel_epi64((__m128i *)(orow + 8 * v), _mm256_castsi256_si128(b8));
            }
        }
    }
    if (nt) _mm_sfence();
    const uint8_t *p[LANES_MAX], *end[LANES_MAX];
    for (int v = 0; v < nv; v++) {
        _mm256_store_si256((__m256i *)(x + 8 * v), xv[v]);
        _mm256_store_si256((__m256i *)(po + 8 * v), pv[v]);
    }
    for (int j = 0; j < W; j++) {
        p[j] = buf + po[j];
        end[j] = buf + st[j] + ln[j];
    }
    const size_t vb = V ? (size_t)V : 1;
    for (; t <= full; t++)  /* the rows left, near a stream's end, and the partial last row */
        for (int j = 0; j < (t < full ? W : (int)(s - full * W)); j++) {
            if (dec_get(&x[j], &p[j], end[j], slot_sym, f, cum, S, mask, &c)) return 1;
            if (V) memcpy(ov + (t * W + j) * vb, rows + (size_t)c * vb, vb);
            else ov[t * W + j] = (uint8_t)c;
        }
    for (int j = 0; j < W; j++)
        if (x[j] != RANS_L || p[j] != end[j]) return 1;
    return 0;
}
#endif

/* ---- decode outputs: huge pages, faulted in before the decoder writes them -----------------------
 * A decoder's output is fresh memory: every first store to a page traps into the kernel, which
 * zeroes it.  A numpy array gets transparent huge pages only over its 2 MiB-aligned interior (numpy's
 * madvise), so up to 2 x 511 edge pages fault 4 KiB at a time, and every fault lands in the middle of
 * the decode, its zeroing evicting the decoder's streams and tables from the core's cache.
 * huge_buffer(n) maps n bytes from a 2 MiB boundary with MADV_HUGEPAGE (one fault per 2 MiB where
 * the kernel allows it), reported to tracemalloc as numpy's buffers are; out_prefault then faults a
 * range in before the decoder runs over it (MADV_POPULATE_WRITE, Linux 5.14; else one store per
 * 4 KiB page: the decoder overwrites every byte).  Memory already mapped costs a page-table walk. */
#if defined(__linux__)
#include <sys/mman.h>
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif
#define HUGE_BUFFERS 1
#endif
#define PAGE_BYTES 4096
#define HUGE_PAGE (2u << 20)
/* Outputs from here up: faulted in first (below, MADV_POPULATE_WRITE over 4 KiB pages cost more than
 * the faults it saves: a 4 MB numpy output at d = 1e6 decoded in 1.5-1.7 ms against 1.25-1.4 without)
 * and written by the AVX2 decoder's non-temporal stores.  kernels.HUGE_OUTPUT maps them on huge pages. */
#define PREFAULT_MIN (4 << 20)
#define STREAM_MIN PREFAULT_MIN
#define TRACE_DOMAIN 389047  /* numpy's tracemalloc domain: the decoded arrays count as numpy's do */

static void out_prefault(uint8_t *p, Py_ssize_t n)
{
    if (n < PREFAULT_MIN) return;
#ifdef HUGE_BUFFERS
    uintptr_t a = ((uintptr_t)p + PAGE_BYTES - 1) & ~(uintptr_t)(PAGE_BYTES - 1);
    uintptr_t e = ((uintptr_t)p + (uintptr_t)n) & ~(uintptr_t)(PAGE_BYTES - 1);
    if (e > a && madvise((void *)a, e - a, MADV_POPULATE_WRITE) == 0) return;
#endif
    for (Py_ssize_t i = 0; i < n; i += PAGE_BYTES) ((volatile uint8_t *)p)[i] = 0;
}

#ifdef HUGE_BUFFERS
/* Freed mappings kept for the next output (the same trade glibc makes for blocks under its 32 MiB mmap
 * threshold, which a 1e7-float output exceeds): a process decoding in a loop then writes into memory
 * it already has, with no page faults and no zeroing.  At most POOL_SLOTS mappings and pool_cap bytes
 * (huge_buffer_pool sets it; 0 keeps none).  Touched only under the GIL (huge_buffer, the dealloc). */
#define POOL_SLOTS 4
static struct { uint8_t *ptr; size_t mapped; } pool[POOL_SLOTS];
static size_t pool_bytes, pool_cap = (size_t)64 << 20;

typedef struct {
    PyObject_HEAD
    uint8_t *ptr;
    Py_ssize_t len;
    size_t mapped;
} HugeBufObject;

static int hugebuf_getbuffer(PyObject *self, Py_buffer *view, int flags)
{
    HugeBufObject *h = (HugeBufObject *)self;
    return PyBuffer_FillInfo(view, self, h->ptr, h->len, 0, flags);
}

static void hugebuf_dealloc(PyObject *self)
{
    HugeBufObject *h = (HugeBufObject *)self;
    if (h->ptr) {
        PyTraceMalloc_Untrack(TRACE_DOMAIN, (uintptr_t)h->ptr);
        int kept = 0;
        for (int i = 0; i < POOL_SLOTS && !kept && pool_bytes + h->mapped <= pool_cap; i++)
            if (!pool[i].ptr) {
                pool[i].ptr = h->ptr;
                pool[i].mapped = h->mapped;
                pool_bytes += h->mapped;
                kept = 1;
            }
        if (!kept) munmap(h->ptr, h->mapped);
    }
    Py_TYPE(self)->tp_free(self);
}

static PyBufferProcs hugebuf_as_buffer = {hugebuf_getbuffer, NULL};

static PyTypeObject HugeBufType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "mucsc.codec._kernels.HugeBuffer",
    .tp_basicsize = sizeof(HugeBufObject),
    .tp_dealloc = hugebuf_dealloc,
    .tp_as_buffer = &hugebuf_as_buffer,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "n writable bytes mapped from a 2 MiB boundary, huge pages advised (see huge_buffer).",
};

/* A kept mapping of at least len bytes (the smallest; its tail past len unmapped), or NULL. */
static uint8_t *pool_take(size_t len)
{
    int best = -1;
    for (int i = 0; i < POOL_SLOTS; i++)
        if (pool[i].ptr && pool[i].mapped >= len && (best < 0 || pool[i].mapped < pool[best].mapped)) best = i;
    if (best < 0) return NULL;
    uint8_t *p = pool[best].ptr;
    if (pool[best].mapped > len) munmap(p + len, pool[best].mapped - len);
    pool_bytes -= pool[best].mapped;
    pool[best].ptr = NULL;
    pool[best].mapped = 0;
    return p;
}

PyDoc_STRVAR(huge_buffer_doc,
"huge_buffer(n) -> buffer\n\n"
"n >= 1 writable, uninitialised bytes from a 2 MiB boundary: a freed one's mapping when one is kept\n"
"(its pages already there), else a new mapping with transparent huge pages advised (the kernel's\n"
"choice), not faulted in yet.  Traced by tracemalloc (numpy's domain) while alive; when the last view\n"
"goes, kept for the next (huge_buffer_pool) or unmapped.  MemoryError when the mapping fails.");

static PyObject *py_huge_buffer(PyObject *self, PyObject *arg)
{
    Py_ssize_t n = PyLong_AsSsize_t(arg);
    if (n == -1 && PyErr_Occurred()) return NULL;
    if (n < 1 || n > PY_SSIZE_T_MAX - 2 * (Py_ssize_t)HUGE_PAGE) {
        PyErr_SetString(PyExc_ValueError, "huge_buffer: need 1 <= n < 2^63 - 4 MiB");
        return NULL;
    }
    size_t len = ((size_t)n + PAGE_BYTES - 1) & ~(size_t)(PAGE_BYTES - 1);
    uint8_t *p = pool_take(len);
    if (!p) {
        size_t span = len + HUGE_PAGE;
        uint8_t *raw = (uint8_t *)mmap(NULL, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (raw == (uint8_t *)MAP_FAILED) return PyErr_NoMemory();
        p = (uint8_t *)(((uintptr_t)raw + HUGE_PAGE - 1) & ~(uintptr_t)(HUGE_PAGE - 1));
        if (p > raw) munmap(raw, (size_t)(p - raw));  /* the unaligned head and the tail past len: unmapped */
        if (raw + span > p + len) munmap(p + len, (size_t)(raw + span - (p + len)));
        (void)madvise(p, len, MADV_HUGEPAGE);  /* advice: refused (no THP) is fine */
    }
    HugeBufObject *h = PyObject_New(HugeBufObject, &HugeBufType);
    if (h == NULL) { munmap(p, len); return NULL; }
    h->ptr = p;
    h->len = n;
    h->mapped = len;
    (void)PyTraceMalloc_Track(TRACE_DOMAIN, (uintptr_t)p, len);
    return (PyObject *)h;
}

PyDoc_STRVAR(huge_buffer_pool_doc,
"huge_buffer_pool(cap) -> (previous cap, bytes kept)\n\n"
"Keep up to cap bytes (at most 4 mappings) of freed huge_buffer memory for the next ones; cap < 0\n"
"only reports.  Lowering it unmaps what is kept beyond it (0: everything).");

static PyObject *py_huge_buffer_pool(PyObject *self, PyObject *arg)
{
    Py_ssize_t cap = PyLong_AsSsize_t(arg);
    if (cap == -1 && PyErr_Occurred()) return NULL;
    size_t prev = pool_cap;
    if (cap >= 0) {
        pool_cap = (size_t)cap;
        for (int i = 0; i < POOL_SLOTS && pool_bytes > pool_cap; i++)
            if (pool[i].ptr) {
                munmap(pool[i].ptr, pool[i].mapped);
                pool_bytes -= pool[i].mapped;
                pool[i].ptr = NULL;
                pool[i].mapped = 0;
            }
    }
    return Py_BuildValue("(nn)", (Py_ssize_t)prev, (Py_ssize_t)pool_bytes);
}
#endif

/* ---- CRC-32 (zlib's: reflected polynomial 0xEDB88320) by carry-less multiplication --------------
 * The message trailer's check (FORMAT.md 3.1) reads every byte of a message before it decodes: zlib
 * 1.2's table CRC runs ~5 GB/s, a tenth of a 40 MB output's decode time at d = 1e7.  Four 128-bit
 * accumulators fold 64 bytes a step with PCLMULQDQ (Gopal et al., "Fast CRC computation for generic
 * polynomials using PCLMULQDQ", Intel 2009; the constants are Linux's crc32-pclmul_asm.S: x^(k) mod P
 * bit-reflected), then fold to 128 bits, reduce to 32 (Barrett), and finish the last < 16 bytes with
 * the byte table.  The same value as zlib.crc32 for every input (tests/test_kernels.py). */
#ifdef LANES_AVX2  /* x86 (elsewhere zlib's CRC is the faster one) */
#define CRC_FOLDS 1
static uint32_t crc_table[256];
static int crc_pclmul = -1;  /* the CPU folds with PCLMULQDQ; set with the table, under the GIL */

static void crc_init(void)
{
    for (uint32_t b = 0; b < 256; b++) {
        uint32_t c = b;
        for (int i = 0; i < 8; i++) c = (c >> 1) ^ (0xEDB88320u & (0u - (c & 1)));
        crc_table[b] = c;
    }
    __builtin_cpu_init();
    crc_pclmul = __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.1");
}

/* The register (pre-inverted) advanced over n bytes, one table step a byte. */
static uint32_t crc32_bytes(uint32_t c, const uint8_t *p, size_t n)
{
    while (n--) c = crc_table[(c ^ *p++) & 0xFF] ^ (c >> 8);
    return c;
}

/* The register c advanced over n >= 64 bytes, 16 at a time; the last n % 16 are left to the caller. */
__attribute__((target("pclmul,sse4.1")))
static uint32_t crc32_fold(uint32_t c, const uint8_t *p, size_t n)
{
    const __m128i k12 = _mm_set_epi64x(0x1c6e41596LL, 0x154442bd4LL), k34 = _mm_set_epi64x(0xccaa009eLL, 0x1751997d0LL);
    const __m128i k5 = _mm_set_epi64x(0, 0x163cd6124LL), pu = _mm_set_epi64x(0x1f7011641LL, 0x1db710641LL);
    const __m128i mask32 = _mm_set_epi32(0, 0, 0, -1);
    __m128i x1 = _mm_loadu_si128((const __m128i *)p), x2 = _mm_loadu_si128((const __m128i *)(p + 16));
    __m128i x3 = _mm_loadu_si128((const __m128i *)(p + 32)), x4 = _mm_loadu_si128((const __m128i *)(p + 48));
    x1 = _mm_xor_si128(x1, _mm_cvtsi32_si128((int)c));
    p += 64;
    n -= 64;
#define CRC_FOLD(X, K, D) (X) = _mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128((X), (K), 0x00), \
                                                            _mm_clmulepi64_si128((X), (K), 0x11)), (D))
    for (; n >= 64; p += 64, n -= 64) {
        CRC_FOLD(x1, k12, _mm_loadu_si128((const __m128i *)p));
        CRC_FOLD(x2, k12, _mm_loadu_si128((const __m128i *)(p + 16)));
        CRC_FOLD(x3, k12, _mm_loadu_si128((const __m128i *)(p + 32)));
        CRC_FOLD(x4, k12, _mm_loadu_si128((const __m128i *)(p + 48)));
    }
    CRC_FOLD(x1, k34, x2);
    CRC_FOLD(x1, k34, x3);
    CRC_FOLD(x1, k34, x4);
    for (; n >= 16; p += 16, n -= 16) CRC_FOLD(x1, k34, _mm_loadu_si128((const __m128i *)p));
#undef CRC_FOLD
    /* 128 -> 64 bits (with 32 zero bits appended), 64 -> 32, then Barrett's reduction */
    x1 = _mm_xor_si128(_mm_srli_si128(x1, 8), _mm_clmulepi64_si128(k34, x1, 0x01));
    x1 = _mm_xor_si128(_mm_srli_si128(x1, 4), _mm_clmulepi64_si128(_mm_and_si128(x1, mask32), k5, 0x00));
    __m128i t = _mm_and_si128(_mm_clmulepi64_si128(_mm_and_si128(x1, mask32), pu, 0x10), mask32);
    x1 = _mm_xor_si128(x1, _mm_clmulepi64_si128(t, pu, 0x00));
    return (uint32_t)_mm_extract_epi32(x1, 1);
}

/* zlib.crc32(p[0:n], crc). */
static uint32_t crc32_run(uint32_t crc, const uint8_t *p, size_t n)
{
    uint32_t c = ~crc;
    if (crc_pclmul > 0 && n >= 64) {
        c = crc32_fold(c, p, n);
        p += n - n % 16;
        n %= 16;
    }
    return ~crc32_bytes(c, p, n);
}

PyDoc_STRVAR(crc32_doc,
"crc32(data[, crc=0]) -> int\n\n"
"zlib.crc32(data, crc) of a bytes-like object (any layout: its bytes in order), folded 64 bytes a step\n"
"with PCLMULQDQ where the CPU has it (else zlib's byte table); the GIL released for large data.");

static PyObject *py_crc32(PyObject *self, PyObject *args)
{
    PyObject *o;
    unsigned long crc = 0;
    if (!PyArg_ParseTuple(args, "O|k", &o, &crc)) return NULL;
    if (crc > 0xFFFFFFFFul) {
        PyErr_SetString(PyExc_ValueError, "crc32: crc is a 32-bit value");
        return NULL;
    }
    Py_buffer b;
    if (PyObject_GetBuffer(o, &b, PyBUF_SIMPLE) < 0) return NULL;
    if (crc_pclmul < 0) crc_init();  /* under the GIL: every caller sees it whole */
    uint32_t c;
    if (b.len >= (1 << 16)) {
        Py_BEGIN_ALLOW_THREADS
        c = crc32_run((uint32_t)crc, (const uint8_t *)b.buf, (size_t)b.len);
        Py_END_ALLOW_THREADS
    } else {
        c = crc32_run((uint32_t)crc, (const uint8_t *)b.buf, (size_t)b.len);
    }
    PyBuffer_Release(&b);
    return PyLong_FromUnsignedLong(c);
}
#endif

static const char lanes_decode_doc[] =
    "lanes_decode(buf u8, f u32, cum u32, S, m, b0, b1, starts i64, lens i64, out u8|u16[, rows u8[, simd=1]])\n"
    "Decode blocks [b0, b1) of m IDSL symbols (FORMAT.md 4.6; starts/lens: their lanes' streams in buf,\n"
    "checked against it) into out (m symbols): 0, or 1 if a lane ends early, not in state 2^23 or with\n"
    "bytes left.  With rows (256 rows of V = len(rows) / 256 bytes, V a power of 2 up to 64; byte symbols)\n"
    "out is the symbols' rows instead (bytes; symbol i at i V; the last symbol's row cut to what is left of\n"
    "out, which holds (m - 1) V + 1 .. m V bytes): -1 if a lane is corrupt, else the symbol m - 1 when the\n"
    "blocks include it (its padding bits are the caller's to check), else 0.  Byte symbols with S <= 16 run\n"
    "the AVX2 decoder where the CPU has it (full blocks; in the value mode also the last block, to symbols\n"
    "first, and only rows of 4 or 8 bytes); simd=0 leaves it out (the same output; for tests).";

static PyObject *py_lanes_decode(PyObject *self, PyObject *args)
{
    PyObject *bo, *fo, *co, *so, *lo, *oo, *ro = NULL;
    int S, simd = 1;
    Py_ssize_t m, b0, b1;
    if (!PyArg_ParseTuple(args, "OOOinnnOOO|Op", &bo, &fo, &co, &S, &m, &b0, &b1, &so, &lo, &oo, &ro, &simd))
        return NULL;
    Py_buffer bb, fb, cb, sb, lb, ob, rb = {0};
    if (get_buf(bo, &bb, 0, "buf") < 0) return NULL;
    if (get_buf(fo, &fb, 0, "f") < 0) { PyBuffer_Release(&bb); return NULL; }
    if (get_buf(co, &cb, 0, "cum") < 0) { PyBuffer_Release(&bb); PyBuffer_Release(&fb); return NULL; }
    if (get_buf(so, &sb, 0, "starts") < 0) { PyBuffer_Release(&bb); PyBuffer_Release(&fb); PyBuffer_Release(&cb); return NULL; }
    if (get_buf(lo, &lb, 0, "lens") < 0) {
        PyBuffer_Release(&bb); PyBuffer_Release(&fb); PyBuffer_Release(&cb); PyBuffer_Release(&sb); return NULL;
    }
    if (get_buf(oo, &ob, 1, "out") < 0) {
        PyBuffer_Release(&bb); PyBuffer_Release(&fb); PyBuffer_Release(&cb); PyBuffer_Release(&sb);
        PyBuffer_Release(&lb); return NULL;
    }
    if (ro && ro != Py_None && get_buf(ro, &rb, 0, "rows") < 0) {
        PyBuffer_Release(&bb); PyBuffer_Release(&fb); PyBuffer_Release(&cb); PyBuffer_Release(&sb);
        PyBuffer_Release(&lb); PyBuffer_Release(&ob); return NULL;
    }
    PyObject *res = NULL;
    uint16_t *slot_sym = NULL;
    uint8_t *slot8 = NULL, *tmp = NULL;
    uint32_t *fc = NULL, *tab32 = NULL;
    Py_ssize_t nb = (m + LANES_BLOCK - 1) / LANES_BLOCK, k = fb.len / 4, V = rb.buf ? rb.len / 256 : 0;
    int wide = !V && ob.itemsize == 2;
    int shape_ok = V ? (rb.len == 256 * V && V <= 64 && !(V & (V - 1)) && k <= 256 && m >= 1
                        && ob.len <= m * V && ob.len > (m - 1) * V)
                     : ((ob.itemsize == 1 || ob.itemsize == 2) && ob.len / ob.itemsize == m && (wide || k <= 256));
    if (S < 1 || S > 22 || fb.itemsize != 4 || cb.itemsize != 4 || fb.len != cb.len || k > 65536 || !shape_ok
        || sb.itemsize != 8 || lb.itemsize != 8 || sb.len != lb.len || b0 < 0 || b1 > nb || b0 > b1) {
        PyErr_SetString(PyExc_ValueError, "lanes_decode: bad arguments");
        goto done;
    }
    {
        const uint32_t *f = (const uint32_t *)fb.buf, *cum = (const uint32_t *)cb.buf;
        const int64_t *st = (const int64_t *)sb.buf, *ln = (const int64_t *)lb.buf;
        Py_ssize_t lanes = 0, M = (Py_ssize_t)1 << S, total = 0;
        for (Py_ssize_t b = b0; b < b1; b++)
            lanes += lanes_of(b + 1 < nb ? LANES_BLOCK : m - b * LANES_BLOCK);
        int ok = lanes == sb.len / 8;
        for (Py_ssize_t j = 0; ok && j < lanes; j++)
            ok = st[j] >= 0 && ln[j] >= 4 && ln[j] <= bb.len && st[j] <= bb.len - ln[j];
        for (Py_ssize_t c = 0; ok && c < k; c++) total += f[c];
        if (!ok || total != M) {
            PyErr_SetString(PyExc_ValueError, "lanes_decode: lanes, streams or table do not fit");
            goto done;
        }
        slot_sym = (uint16_t *)PyMem_RawMalloc((size_t)M * sizeof(uint16_t));
        if (!slot_sym) { PyErr_NoMemory(); goto done; }
        int vec = 0;  /* byte-symbol blocks by the AVX2 decoder (values: full blocks, rows of 4 or 8 bytes) */
#ifdef LANES_AVX2
        vec = simd && !wide && S <= 16 && bb.len < ((Py_ssize_t)1 << 31) - 8 && have_avx2();
#endif
        int vec_rows = vec && (V == 4 || V == 8);
        /* an output past the caches: its rows written around them (non-temporal stores), no line read first */
        int stream = vec_rows && ob.len >= STREAM_MIN;
        (void)stream;  /* read by the AVX2 decoder only */
        uint32_t fmax = 0;
        for (Py_ssize_t c = 0; c < k; c++) fmax = f[c] > fmax ? f[c] : fmax;
        if (vec) {
            slot8 = (uint8_t *)PyMem_RawMalloc((size_t)M + 4);  /* padded: a gather reads 4 bytes at a slot */
            fc = (uint32_t *)PyMem_RawCalloc(256, sizeof(uint32_t));
            if (!slot8 || !fc) { PyErr_NoMemory(); goto done; }
            if (fmax <= 4096 && (b1 - b0) * LANES_BLOCK >= 4 * M) {  /* the one-gather table, where it pays */
                tab32 = (uint32_t *)PyMem_RawMalloc((size_t)M * sizeof(uint32_t));
                if (!tab32) { PyErr_NoMemory(); goto done; }
            }
        }
        if (V && b1 == nb && !(tmp = (uint8_t *)PyMem_RawMalloc(LANES_BLOCK + 8))) { PyErr_NoMemory(); goto done; }
        int err = 0;
        long last = 0;
        Py_BEGIN_ALLOW_THREADS
        if (V) {  /* this call's rows of the output */
            Py_ssize_t lo = b0 * LANES_BLOCK * V, hi = b1 * LANES_BLOCK * V;
            if (hi > ob.len) hi = ob.len;
            if (hi > lo) out_prefault((uint8_t *)ob.buf + lo, hi - lo);
        }
        for (Py_ssize_t c = 0; c < k; c++)
            for (uint32_t t = 0; t < f[c]; t++) slot_sym[cum[c] + t] = (uint16_t)c;
        if (vec) {
            for (Py_ssize_t c = 0; c < k; c++) memset(slot8 + cum[c], (int)c, f[c]);
            memset(slot8 + M, 0, 4);
            for (Py_ssize_t c = 0; c < k; c++) fc[c] = f[c] ? (f[c] - 1) | (cum[c] << 16) : 0;
            for (Py_ssize_t c = 0; tab32 && c < k; c++)
                for (uint32_t t = 0; t < f[c]; t++) tab32[cum[c] + t] = (uint32_t)c | (f[c] - 1) << 8 | t << 20;
        }
        for (Py_ssize_t b = b0; b < b1 && V && !err; b++) {  /* the values: IDs never stored */
            Py_ssize_t s = b + 1 < nb ? LANES_BLOCK : m - b * LANES_BLOCK;
            uint8_t *ob8 = (uint8_t *)ob.buf + b * LANES_BLOCK * V;
            if (b + 1 == nb) {  /* the last block's symbols first: its last row may be cut short */
#ifdef LANES_AVX2
                if (vec)
                    err = lanes_decode_block_avx2((const uint8_t *)bb.buf, slot8, fc, tab32, slot_sym, f, cum, S, s, st, ln,
                                                  tmp, NULL, 0, 0);
                else
#endif
                err = lanes_decode_block((const uint8_t *)bb.buf, slot_sym, f, cum, S, 0, s, st, ln, tmp, 0, NULL, 0);
                for (Py_ssize_t i = 0; !err && i + 1 < s; i++) memcpy(ob8 + i * V, (const uint8_t *)rb.buf + (size_t)tmp[i] * V, (size_t)V);
                if (!err) {
                    memcpy(ob8 + (s - 1) * V, (const uint8_t *)rb.buf + (size_t)tmp[s - 1] * V,
                           (size_t)(ob.len - (m - 1) * V));
                    last = tmp[s - 1];
                }
            }
#ifdef LANES_AVX2
            else if (vec_rows)
                err = lanes_decode_block_avx2((const uint8_t *)bb.buf, slot8, fc, tab32, slot_sym, f, cum, S, s, st, ln, ob8,
                                              (const uint8_t *)rb.buf, (int)V, stream);
#endif
            else
                err = lanes_decode_block_values((const uint8_t *)bb.buf, slot_sym, f, cum, S, b * LANES_BLOCK, s, st,
                                                ln, ob.buf, (const uint8_t *)rb.buf, (int)V);
            st += lanes_of(s);
            ln += lanes_of(s);
        }
        for (Py_ssize_t b = b0; b < b1 && !V && !err; b++) {
            Py_ssize_t s = b + 1 < nb ? LANES_BLOCK : m - b * LANES_BLOCK;
#ifdef LANES_AVX2
            if (vec && s == LANES_BLOCK)  /* 32 lanes: no byte stored past the block */
                err = lanes_decode_block_avx2((const uint8_t *)bb.buf, slot8, fc, tab32, slot_sym, f, cum, S, s, st, ln,
                                              (uint8_t *)ob.buf + b * LANES_BLOCK, NULL, 0, 0);
            else
#endif
            err = wide ? lanes_decode_block((const uint8_t *)bb.buf, slot_sym, f, cum, S, b * LANES_BLOCK, s, st, ln,
                                            ob.buf, 1, NULL, 0)
                       : lanes_decode_block((const uint8_t *)bb.buf, slot_sym, f, cum, S, b * LANES_BLOCK, s, st, ln,
                                            ob.buf, 0, NULL, 0);
            st += lanes_of(s);
            ln += lanes_of(s);
        }
        Py_END_ALLOW_THREADS
        res = PyLong_FromLong(V ? (err ? -1 : last) : err);
    }
done:
    PyMem_RawFree(slot_sym);
    PyMem_RawFree(slot8);
    PyMem_RawFree(fc);
    PyMem_RawFree(tab32);
    PyMem_RawFree(tmp);
    PyBuffer_Release(&bb); PyBuffer_Release(&fb); PyBuffer_Release(&cb); PyBuffer_Release(&sb);
    PyBuffer_Release(&lb); PyBuffer_Release(&ob);
    if (rb.buf) PyBuffer_Release(&rb);
    return res;
}

/* ---- a dot product in a fixed order (numpy twin: mucsc.codec.kernels.dot) -----------------------
 * acc[j] += a[8 i + j] b[8 i + j] in i order for the 8 columns (the tail as if padded with zeros),
 * then ((acc0 + acc1) + (acc2 + acc3)) + ((acc4 + acc5) + (acc6 + acc7)): the same float64
 * operations on every machine and thread count, unlike a BLAS dot (its kernel and thread split
 * set the order).  -ffp-contract=off keeps each product and sum rounded as numpy's. */

/* The fixed tree that ends the dot: ((acc0 + acc1) + (acc2 + acc3)) + ((acc4 + acc5) + (acc6 + acc7)). */
static inline double dot_tree(const double *acc)
{
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

PyDoc_STRVAR(dot_doc,
"dot(a f64, b f64) -> float\n\n"
"sum(a * b) in the fixed order of mucsc.codec.kernels.dot (8 column sums, then a fixed tree).  GIL released.");

static PyObject *py_dot(PyObject *self, PyObject *args)
{
    PyObject *ao, *bo;
    if (!PyArg_ParseTuple(args, "OO", &ao, &bo)) return NULL;
    Py_buffer ab, bb;
    if (get_buf(ao, &ab, 0, "a") < 0) return NULL;
    if (get_buf(bo, &bb, 0, "b") < 0) { PyBuffer_Release(&ab); return NULL; }
    PyObject *res = NULL;
    if (float_kind(&ab) != 8 || float_kind(&bb) != 8 || ab.len != bb.len) {
        PyErr_SetString(PyExc_ValueError, "dot: need two float64 buffers of one length");
        goto done;
    }
    {
        const double *a = (const double *)ab.buf, *b = (const double *)bb.buf;
        Py_ssize_t n = ab.len / 8, full = n - n % 8;
        double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t i = 0; i < full; i += 8)
            for (int j = 0; j < 8; j++) acc[j] += a[i + j] * b[i + j];
        for (int j = 0; j < 8; j++) acc[j] += full + j < n ? a[full + j] * b[full + j] : 0.0;
        Py_END_ALLOW_THREADS
        res = PyFloat_FromDouble(dot_tree(acc));
    }
done:
    PyBuffer_Release(&ab);
    PyBuffer_Release(&bb);
    return res;
}

/* ---- the realised error of a lookup decode (numpy twin: mucsc.codec.kernels.lookup_error) -------
 * For a decode that is tables[r][ids] (a clustering's levels), acc[0][j] += x^2 and acc[1 + r][j] +=
 * (tables[r][id] - x)^2 over element i of x in order, column j = i % 8: the accumulators of
 * kernels.dot, carried in and out (acc: (1 + rows) * 8 float64), so a caller going chunk by chunk
 * gets the same sums as one call, and the twin's cumulative sums the same float64 operations. */

PyDoc_STRVAR(lookup_error_doc,
"lookup_error(x f32|f64, ids u8|u16, tables f64 (rows, k), acc f64 ((1 + rows) * 8)) -> None\n\n"
"acc[0..7] += x^2 and acc[8 (1 + r) ..] += (tables[r, ids] - x)^2 in kernels.dot's 8 columns, element\n"
"i in column i % 8.  ValueError when an id is >= k.  GIL released.");

static PyObject *py_lookup_error(PyObject *self, PyObject *args)
{
    PyObject *o[4];
    if (!PyArg_ParseTuple(args, "OOOO", &o[0], &o[1], &o[2], &o[3])) return NULL;
    Py_buffer b[4];
    const char *names[4] = {"x", "ids", "tables", "acc"};
    for (int i = 0; i < 4; i++)
        if (get_buf(o[i], &b[i], i == 3, names[i]) < 0) { release_bufs(b, i); return NULL; }
    PyObject *res = NULL;
    int xk = float_kind(&b[0]);
    Py_ssize_t n = xk ? b[0].len / xk : 0, isz = b[1].itemsize, A = b[3].len / 64;
    Py_ssize_t rows = A - 1, k = rows > 0 ? b[2].len / 8 / rows : 0;
    if (!xk || (isz != 1 && isz != 2) || b[1].len != n * isz || float_kind(&b[2]) != 8 || float_kind(&b[3]) != 8
        || b[3].len % 64 || rows < 1 || rows > 8 || k < 1 || b[2].len != rows * k * 8) {
        PyErr_SetString(PyExc_ValueError, "lookup_error: bad arguments");
        goto done;
    }
    {
        const double *tab = (const double *)b[2].buf;
        double *acc = (double *)b[3].buf;
        int bad = 0;
        Py_BEGIN_ALLOW_THREADS
        /* one loop per (x, id) type pair, the common one or two tables unrolled: the same operations */
#define LOOKUP_ERROR_LOOP(XT, IT)                                                                      \
        {                                                                                              \
            const XT *xs = (const XT *)b[0].buf;                                                       \
            const IT *is = (const IT *)b[1].buf;                                                       \
            for (Py_ssize_t i = 0; i < n; i++) {                                                       \
                double v = (double)xs[i];                                                              \
                Py_ssize_t id = is[i];                                                                 \
                int j = (int)(i & 7);                                                                  \
                if (id >= k) { bad = 1; break; }                                                       \
                acc[j] += v * v;                                                                       \
                if (rows == 1) { double d = tab[id] - v; acc[8 + j] += d * d; }                         \
                else if (rows == 2) {                                                                  \
                    double d = tab[id] - v, e = tab[k + id] - v;                                       \
                    acc[8 + j] += d * d; acc[16 + j] += e * e;                                         \
                } else                                                                                 \
                    for (Py_ssize_t r = 0; r < rows; r++) {                                            \
                        double d = tab[r * k + id] - v;                                                \
                        acc[8 * (r + 1) + j] += d * d;                                                 \
                    }                                                                                  \
            }                                                                                          \
        }
        if (xk == 4 && isz == 1) LOOKUP_ERROR_LOOP(float, uint8_t)
        else if (xk == 4) LOOKUP_ERROR_LOOP(float, uint16_t)
        else if (isz == 1) LOOKUP_ERROR_LOOP(double, uint8_t)
        else LOOKUP_ERROR_LOOP(double, uint16_t)
#undef LOOKUP_ERROR_LOOP
        Py_END_ALLOW_THREADS
        if (bad) PyErr_SetString(PyExc_ValueError, "lookup_error: an id is out of range");
        else { Py_INCREF(Py_None); res = Py_None; }
    }
done:
    release_bufs(b, 4);
    return res;
}

/* ---- nearest-level assignment (spec/FORMAT.md 4.3.1; numpy twin: kernels.nearest) --------------
 * ids[m] = the number of boundaries t_k with x[m] > t_k (float64 comparisons: ties go to the lower
 * level; NaN, which numpy's searchsorted sorts last, to the top level), found from a table of
 * bucket starts over [t_0, t_last] and corrected by walking while a comparison says so: any start
 * gives the exact count, the table only makes the walk short.  The squared error (x - c[id])^2 is
 * summed as the numpy twin does: per chunk of `chunk` elements kernels.dot's 8 column sums and
 * fixed tree, the chunk sums added in order. */

PyDoc_STRVAR(nearest_doc,
"nearest(x f32|f64, t f64, c f64, ids u8|u16|u32, chunk) -> float\n\n"
"ids[m] = #{k : x[m] > t[k]} (t sorted, len(c) = len(t) + 1) and the squared error sum (x - c[ids])^2\n"
"in the order of mucsc.codec.kernels.nearest (chunk sums of the fixed-order dot).  GIL released.");

/* 16 buckets per boundary, at least 2^12 (Lloyd-Max levels crowd the middle of a heavy-tailed range:
 * with 8 per boundary and no floor, Z = 64 on 32.8M Student-t(4) values took 0.50 s, with these
 * 0.12-0.24 s on the shared VM) and at most 2^16 (a 256 KB table) */
#define NEAREST_BUCKETS_MIN (1 << 12)
#define NEAREST_BUCKETS_MAX (1 << 16)

static PyObject *py_nearest(PyObject *self, PyObject *args)
{
    PyObject *xo, *to, *co, *io;
    Py_ssize_t chunk;
    if (!PyArg_ParseTuple(args, "OOOOn", &xo, &to, &co, &io, &chunk)) return NULL;
    Py_buffer b[4];
    if (get_buf(xo, &b[0], 0, "x") < 0) return NULL;
    if (get_f64_bufs((PyObject *const[]){to, co}, &b[1], 2, 2, "nearest") < 0) { PyBuffer_Release(&b[0]); return NULL; }
    if (get_buf(io, &b[3], 1, "ids") < 0) { release_bufs(b, 3); return NULL; }
    PyObject *res = NULL;
    uint32_t *tbl = NULL;
    int xk = float_kind(&b[0]);
    char ic = fmt_char(&b[3]);
    int ik = (ic == 'B' && b[3].itemsize == 1) ? 1 : (ic == 'H' && b[3].itemsize == 2) ? 2
           : ((ic == 'I' || ic == 'L') && b[3].itemsize == 4) ? 4 : 0;
    Py_ssize_t n = xk ? b[0].len / xk : 0, nt = b[1].len / 8;
    if (!xk || !ik) {
        PyErr_SetString(PyExc_ValueError, "nearest: x must be float32/float64, ids uint8/uint16/uint32");
        goto done;
    }
    if (nt < 1 || b[2].len / 8 != nt + 1 || b[3].len / ik != n || chunk < 1) {
        PyErr_SetString(PyExc_ValueError, "nearest: need len(c) = len(t) + 1 >= 2, len(ids) = len(x), chunk >= 1");
        goto done;
    }
    if ((ik == 1 && nt + 1 > 256) || (ik == 2 && nt + 1 > 65536) || nt >= (Py_ssize_t)UINT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "nearest: too many levels for the ids' dtype");
        goto done;
    }
    {
        const double *t = (const double *)b[1].buf, *c = (const double *)b[2].buf;
        const double t0 = t[0], span = t[nt - 1] - t0;
        /* one bucket when the boundaries do not span a positive finite range */
        Py_ssize_t nb = 16 * nt < NEAREST_BUCKETS_MIN ? NEAREST_BUCKETS_MIN
                      : 16 * nt < NEAREST_BUCKETS_MAX ? 16 * nt : NEAREST_BUCKETS_MAX;
        if (!(span > 0) || !isfinite(span) || !isfinite(nb / span)) nb = 1;
        const double inv = nb > 1 ? nb / span : 0.0;
        tbl = (uint32_t *)PyMem_RawMalloc((size_t)nb * sizeof(uint32_t));
        if (!tbl) { PyErr_NoMemory(); goto done; }
        double err = 0.0;
        Py_BEGIN_ALLOW_THREADS
        {
            Py_ssize_t k = 0;  /* tbl[g]: the boundaries below bucket g's start (any start would do) */
            for (Py_ssize_t g = 0; g < nb; g++) {
                const double e = t0 + g / inv;
                while (nb > 1 && k < nt && t[k] < e) k++;
                tbl[g] = (uint32_t)k;
            }
        }
        const float *xf = (const float *)b[0].buf;
        const double *xd = (const double *)b[0].buf;
        for (Py_ssize_t s = 0; s < n; s += chunk) {
            const Py_ssize_t e = s + chunk < n ? s + chunk : n;
            double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
            for (Py_ssize_t m = s; m < e; m++) {
                const double v = xk == 4 ? (double)xf[m] : xd[m];
                Py_ssize_t k;
                if (v != v) k = nt;
                else if (v <= t0) k = 0;
                else if (v > t[nt - 1]) k = nt;
                else {
                    Py_ssize_t g = (Py_ssize_t)((v - t0) * inv);
                    g = g < 0 ? 0 : g >= nb ? nb - 1 : g;
                    k = tbl[g];
                    while (k > 0 && v <= t[k - 1]) k--;
                    while (k < nt && v > t[k]) k++;
                }
                if (ik == 1) ((uint8_t *)b[3].buf)[m] = (uint8_t)k;
                else if (ik == 2) ((uint16_t *)b[3].buf)[m] = (uint16_t)k;
                else ((uint32_t *)b[3].buf)[m] = (uint32_t)k;
                const double d = v - c[k];
                acc[(m - s) & 7] += d * d;
            }
            /* a tail padded with zeros adds 0.0 to the columns past it: no change to a sum of squares */
            err += dot_tree(acc);
        }
        Py_END_ALLOW_THREADS
        res = PyFloat_FromDouble(err);
    }
done:
    PyMem_RawFree(tbl);
    release_bufs(b, 4);
    return res;
}

/* ---- byte-indexed table gather (the decoder's ID lookup; numpy twin: parallel.unpack_take) ---- */

PyDoc_STRVAR(lookup_bytes_doc,
"lookup_bytes(packed, rows, out)\n\n"
"out[i] = rows[packed[i]] for every byte of packed (uint8): rows holds 256 items of S bytes\n"
"(S = len(rows) / 256: 1, 2, 4, 8, 16, 32 or 64), out len(packed) * S bytes (any item type).\n"
"numpy's take converts byte indices to intp first; this reads them as they are.  GIL released.");

/* one fixed-size copy per byte: the compiler turns memcpy of a constant size into plain moves */
#define GATHER_BYTES(S)                                                                  \
    do {                                                                                 \
        for (Py_ssize_t i_ = 0; i_ < n; i_++) memcpy(o + i_ * (S), r + (size_t)p[i_] * (S), (S)); \
    } while (0)

static PyObject *py_lookup_bytes(PyObject *self, PyObject *args)
{
    PyObject *po, *ro, *oo;
    if (!PyArg_ParseTuple(args, "OOO", &po, &ro, &oo)) return NULL;
    Py_buffer pb, rb, ob;
    if (get_buf(po, &pb, 0, "packed") < 0) return NULL;
    if (get_buf(ro, &rb, 0, "rows") < 0) { PyBuffer_Release(&pb); return NULL; }
    if (get_buf(oo, &ob, 1, "out") < 0) { PyBuffer_Release(&pb); PyBuffer_Release(&rb); return NULL; }
    PyObject *res = NULL;
    Py_ssize_t S = rb.len / 256, n = pb.len;
    if (pb.itemsize != 1 || fmt_char(&pb) != 'B' || rb.len != 256 * S || S < 1 || S > 64 || (S & (S - 1))
        || ob.len / S != n || ob.len % S) {
        PyErr_SetString(PyExc_ValueError, "lookup_bytes: need uint8 packed, 256 rows of 1..64 (a power of 2) "
                        "bytes, and out of len(packed) rows");
        goto done;
    }
    {
        const uint8_t *p = (const uint8_t *)pb.buf, *r = (const uint8_t *)rb.buf;
        uint8_t *o = (uint8_t *)ob.buf;
        Py_BEGIN_ALLOW_THREADS
        switch (S) {
            case 1: GATHER_BYTES(1); break;
            case 2: GATHER_BYTES(2); break;
            case 4: GATHER_BYTES(4); break;
            case 8: GATHER_BYTES(8); break;
            case 16: GATHER_BYTES(16); break;
            case 32: GATHER_BYTES(32); break;
            default: GATHER_BYTES(64); break;
        }
        Py_END_ALLOW_THREADS
    }
    Py_INCREF(Py_None);
    res = Py_None;
done:
    PyBuffer_Release(&pb);
    PyBuffer_Release(&rb);
    PyBuffer_Release(&ob);
    return res;
}

/* ---- a bytes object written in place (the message writer's single buffer) ---------------------- */

/* A new bytes object's contents are uninitialised and it is not shared yet: CPython's own code fills
 * such objects in place.  new_bytes(n) returns one with a writable buffer over it (an exporter that
 * holds a reference to the bytes, so no view can outlive them), so the writer can copy every
 * section straight into the message it returns instead of joining parts into it afterwards. */

typedef struct {
    PyObject_HEAD
    PyObject *bytes;
} WritableObject;

static int writable_getbuffer(PyObject *self, Py_buffer *view, int flags)
{
    PyObject *b = ((WritableObject *)self)->bytes;
    return PyBuffer_FillInfo(view, self, PyBytes_AS_STRING(b), PyBytes_GET_SIZE(b), 0, flags);
}

static void writable_dealloc(PyObject *self)
{
    Py_XDECREF(((WritableObject *)self)->bytes);
    Py_TYPE(self)->tp_free(self);
}

static PyBufferProcs writable_as_buffer = {writable_getbuffer, NULL};

static PyTypeObject WritableType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "mucsc.codec._kernels.Writable",
    .tp_basicsize = sizeof(WritableObject),
    .tp_dealloc = writable_dealloc,
    .tp_as_buffer = &writable_as_buffer,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A writable buffer over a new bytes object (see new_bytes).",
};

PyDoc_STRVAR(new_bytes_doc,
"new_bytes(n) -> (bytes, writable)\n\n"
"A new bytes object of n >= 2 uninitialised bytes and a writable buffer over it: fill every byte\n"
"through memoryview(writable), drop the writable, then hand out the bytes.");

static PyObject *py_new_bytes(PyObject *self, PyObject *arg)
{
    Py_ssize_t n = PyLong_AsSsize_t(arg);
    if (n == -1 && PyErr_Occurred()) return NULL;
    if (n < 2) {  /* 0 and 1 byte objects may be shared singletons */
        PyErr_SetString(PyExc_ValueError, "new_bytes: need n >= 2");
        return NULL;
    }
    PyObject *b = PyBytes_FromStringAndSize(NULL, n);
    if (b == NULL) return NULL;
    WritableObject *w = PyObject_New(WritableObject, &WritableType);
    if (w == NULL) { Py_DECREF(b); return NULL; }
    Py_INCREF(b);
    w->bytes = b;
    return Py_BuildValue("(NN)", b, (PyObject *)w);
}

/* ---------------------------------------------------------------------------------------------- */
/* LEB128 varints (rans._varints: the frequency tables of IDSA and IDSL)                           */
/* ---------------------------------------------------------------------------------------------- */

PyDoc_STRVAR(varints_doc,
"varints(values, out) -> count\n\n"
"The LEB128 varints of values (uint64) into out (uint8, >= 10 bytes per value): 7 bits a byte, least\n"
"significant first, the high bit set on every byte but a value's last.  Returns the bytes written.");

static PyObject *py_varints(PyObject *self, PyObject *args)
{
    PyObject *vo, *oo;
    if (!PyArg_ParseTuple(args, "OO", &vo, &oo)) return NULL;
    Py_buffer vb, ob;
    if (get_buf(vo, &vb, 0, "varints values") < 0) return NULL;
    if (get_buf(oo, &ob, 1, "varints out") < 0) { PyBuffer_Release(&vb); return NULL; }
    PyObject *res = NULL;
    char vc = fmt_char(&vb), oc = fmt_char(&ob);
    Py_ssize_t n = vb.len / 8;
    if (!((vc == 'Q' || vc == 'L') && vb.itemsize == 8) || !(oc == 'B' && ob.itemsize == 1) || ob.len / 10 < n) {
        PyErr_SetString(PyExc_ValueError, "varints: values uint64 (n), out uint8 (>= 10 n)");
        goto done;
    }
    {
        const uint64_t *v = (const uint64_t *)vb.buf;
        uint8_t *out = (uint8_t *)ob.buf;
        Py_ssize_t cnt = 0;
        for (Py_ssize_t i = 0; i < n; i++) {
            uint64_t x = v[i];
            while (x >= 0x80) { out[cnt++] = (uint8_t)((x & 0x7F) | 0x80); x >>= 7; }
            out[cnt++] = (uint8_t)x;
        }
        res = PyLong_FromSsize_t(cnt);
    }
done:
    PyBuffer_Release(&ob);
    PyBuffer_Release(&vb);
    return res;
}

/* ---- the dither's counter stream and its contexts (FORMAT.md 4.3, 4.5) ---------------------------- */

static inline uint64_t splitmix_mix(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

PyDoc_STRVAR(splitmix64_doc,
"splitmix64(key, start, shift, out)\n\n"
"out[j] = mix(key + (start + j + 1) * GAMMA) >> shift (uint64, arithmetic mod 2^64): SplitMix64's\n"
"outputs start+1 .. start+len(out) with state key, as kernels.splitmix64 (shift 0) and\n"
"dither.stream (shift 11) compute them with numpy.");

static PyObject *py_splitmix64(PyObject *self, PyObject *args)
{
    unsigned long long key, start;
    int shift;
    PyObject *oo;
    if (!PyArg_ParseTuple(args, "KKiO", &key, &start, &shift, &oo)) return NULL;
    if (shift < 0 || shift > 63) {
        PyErr_SetString(PyExc_ValueError, "splitmix64: shift must be in 0..63");
        return NULL;
    }
    Py_buffer ob;
    if (get_buf(oo, &ob, 1, "splitmix64 out") < 0) return NULL;
    char oc = fmt_char(&ob);
    if (!((oc == 'Q' || oc == 'L') && ob.itemsize == 8)) {
        PyBuffer_Release(&ob);
        PyErr_SetString(PyExc_ValueError, "splitmix64: out must be uint64");
        return NULL;
    }
    uint64_t *out = (uint64_t *)ob.buf;
    Py_ssize_t n = ob.len / 8;
    const uint64_t gamma = 0x9E3779B97F4A7C15ULL;
    Py_BEGIN_ALLOW_THREADS
    uint64_t z = (uint64_t)key + ((uint64_t)start + 1) * gamma;
    for (Py_ssize_t j = 0; j < n; j++, z += gamma) out[j] = splitmix_mix(z) >> shift;
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&ob);
    Py_RETURN_NONE;
}

/* Element i's context (t_i * count) >> 53 (t_i < 2^53, count <= 64: no overflow). */
static inline Py_ssize_t dither_context(uint64_t t, uint64_t count) { return (Py_ssize_t)((t * count) >> 53); }

static int stream_buf(PyObject *o, Py_buffer *b, Py_ssize_t count)
{
    if (get_buf(o, b, 0, "dither stream") < 0) return -1;
    char c = fmt_char(b);
    if (!((c == 'Q' || c == 'L') && b->itemsize == 8) || count < 1 || count > 64) {
        PyBuffer_Release(b);
        PyErr_SetString(PyExc_ValueError, "dither contexts: t must be uint64, count in 1..64");
        return -1;
    }
    return 0;
}

PyDoc_STRVAR(context_counts_doc,
"context_counts(t, count, out)\n\n"
"out[j] = the number of i with (t[i] * count) >> 53 == j (t: uint64 below 2^53; out: int64 of\n"
"length count): how many elements each dither context holds.  Raises ValueError if a t[i] is 2^53 or more.");

static PyObject *py_context_counts(PyObject *self, PyObject *args)
{
    PyObject *to, *oo;
    Py_ssize_t count;
    if (!PyArg_ParseTuple(args, "OnO", &to, &count, &oo)) return NULL;
    Py_buffer tb, ob;
    if (stream_buf(to, &tb, count) < 0) return NULL;
    if (get_buf(oo, &ob, 1, "context_counts out") < 0) { PyBuffer_Release(&tb); return NULL; }
    PyObject *res = NULL;
    char oc = fmt_char(&ob);
    if (!((oc == 'q' || oc == 'l') && ob.itemsize == 8) || ob.len / 8 != count) {
        PyErr_SetString(PyExc_ValueError, "context_counts: out must be int64 of length count");
        goto done;
    }
    {
        const uint64_t *t = (const uint64_t *)tb.buf;
        int64_t *out = (int64_t *)ob.buf;
        Py_ssize_t n = tb.len / 8;
        uint64_t big = 0;
        for (Py_ssize_t j = 0; j < count; j++) out[j] = 0;
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t i = 0; i < n; i++) {
            big |= t[i];
            out[dither_context(t[i] & ((1ULL << 53) - 1), (uint64_t)count)]++;
        }
        Py_END_ALLOW_THREADS
        if (big >> 53) {
            PyErr_SetString(PyExc_ValueError, "context_counts: t must be below 2^53");
            goto done;
        }
    }
    Py_INCREF(Py_None);
    res = Py_None;
done:
    PyBuffer_Release(&ob);
    PyBuffer_Release(&tb);
    return res;
}

PyDoc_STRVAR(context_route_doc,
"context_route(t, count, src, dst, to_contexts)\n\n"
"Moves uint32 symbols between index order and context order (the contexts 0 .. count - 1 one after\n"
"the other, index order within each; element i's context (t[i] * count) >> 53).  to_contexts true:\n"
"dst (context order) from src (index order), as dither.by_context's stable sort; false: dst (index\n"
"order) from src (context order).  src and dst have len(t) elements; t below 2^53 (ValueError else).\n"
"Returns the number of elements in each context (a list of count ints).");

static PyObject *py_context_route(PyObject *self, PyObject *args)
{
    PyObject *to, *so, *dso;
    Py_ssize_t count;
    int forward;
    if (!PyArg_ParseTuple(args, "OnOOp", &to, &count, &so, &dso, &forward)) return NULL;
    Py_buffer tb, sb, db;
    if (stream_buf(to, &tb, count) < 0) return NULL;
    if (get_buf(so, &sb, 0, "context_route src") < 0) { PyBuffer_Release(&tb); return NULL; }
    if (get_buf(dso, &db, 1, "context_route dst") < 0) { PyBuffer_Release(&sb); PyBuffer_Release(&tb); return NULL; }
    PyObject *res = NULL;
    Py_ssize_t n = tb.len / 8;
    char sc = fmt_char(&sb), dc_ = fmt_char(&db);
    if (!((sc == 'I' || (sc == 'L' && sb.itemsize == 4)) && sb.itemsize == 4) ||
        !((dc_ == 'I' || (dc_ == 'L' && db.itemsize == 4)) && db.itemsize == 4) ||
        sb.len / 4 != n || db.len / 4 != n) {
        PyErr_SetString(PyExc_ValueError, "context_route: src and dst must be uint32 of len(t) elements");
        goto done;
    }
    {
        const uint64_t *t = (const uint64_t *)tb.buf;
        const uint32_t *src = (const uint32_t *)sb.buf;
        uint32_t *dst = (uint32_t *)db.buf;
        Py_ssize_t cnt[64] = {0}, cur[64], c = count;
        uint64_t big = 0;
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t i = 0; i < n; i++) {  /* counted on masked words; a word >= 2^53 is refused below */
            big |= t[i];
            cnt[dither_context(t[i] & ((1ULL << 53) - 1), (uint64_t)c)]++;
        }
        Py_END_ALLOW_THREADS
        if (big >> 53) {
            PyErr_SetString(PyExc_ValueError, "context_route: t must be below 2^53");
            goto done;
        }
        Py_BEGIN_ALLOW_THREADS
        Py_ssize_t at = 0;
        for (Py_ssize_t j = 0; j < c; j++) { cur[j] = at; at += cnt[j]; }
        if (forward) {
            for (Py_ssize_t i = 0; i < n; i++) dst[cur[dither_context(t[i], (uint64_t)c)]++] = src[i];
        } else {
            for (Py_ssize_t i = 0; i < n; i++) dst[i] = src[cur[dither_context(t[i], (uint64_t)c)]++];
        }
        Py_END_ALLOW_THREADS
        res = PyList_New(c);
        for (Py_ssize_t j = 0; res && j < c; j++) {
            PyObject *v = PyLong_FromSsize_t(cnt[j]);
            if (!v) { Py_CLEAR(res); break; }
            PyList_SET_ITEM(res, j, v);
        }
    }
done:
    PyBuffer_Release(&db);
    PyBuffer_Release(&sb);
    PyBuffer_Release(&tb);
    return res;
}

/* ================================================================================================ */
/* dithered rounding's fused passes (codecs/_dithered.py, numerics/dither.py; FORMAT.md 4.5).      */
/* Each computes what the numpy path computes, operation for operation (float64, no FMA).  Where   */
/* one meets a case it does not handle (an index beyond +-2^62, a non-finite value, a malformed    */
/* stream or escape) it returns a non-zero code and the caller takes the numpy path, which computes */
/* or rejects that input as the reference does: the bytes, values and errors are the numpy path's. */
/* ================================================================================================ */

#define DITHER_SCALE (1.0 / 9007199254740992.0)        /* 2^-53: v_i = t_i 2^-53, exact */
#define DITHER_BOUND 4611686018427387904.0              /* 2^62: a floor below it converts exactly */
#define DITHER_MAX_INDEX ((int64_t)1 << 52)

/* A buffer of one integer type (format character c1 or c2, itemsize bytes), else ValueError naming it. */
static int typed_buf(PyObject *o, Py_buffer *b, int writable, const char *name, char c1, char c2,
                     Py_ssize_t itemsize, const char *kind)
{
    if (get_buf(o, b, writable, name) < 0) return -1;
    char c = fmt_char(b);
    if (!((c == c1 || c == c2) && b->itemsize == itemsize)) {
        PyBuffer_Release(b);
        PyErr_Format(PyExc_ValueError, "%s: %s buffer needed", name, kind);
        return -1;
    }
    return 0;
}

static int i64_buf(PyObject *o, Py_buffer *b, int writable, const char *name)
{
    return typed_buf(o, b, writable, name, 'q', 'l', 8, "int64");
}

static int u32_buf(PyObject *o, Py_buffer *b, int writable, const char *name)
{
    return typed_buf(o, b, writable, name, 'I', 'L', 4, "uint32");
}

/* numpy's pairwise summation of a[0 .. n) (float64, contiguous; numpy 2's DOUBLE_pairwise_sum): the
 * order np.add.reduce and each segment of np.add.reduceat (after its first element) sum in. */
static double np_pairwise_sum(const double *a, Py_ssize_t n)
{
    if (n < 8) {
        double res = -0.0;
        for (Py_ssize_t i = 0; i < n; i++) res += a[i];
        return res;
    }
    if (n <= 128) {
        double r[8];
        Py_ssize_t i;
        for (int j = 0; j < 8; j++) r[j] = a[j];
        for (i = 8; i < n - (n % 8); i += 8)
            for (int j = 0; j < 8; j++) r[j] += a[i + j];
        double res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
        for (; i < n; i++) res += a[i];
        return res;
    }
    Py_ssize_t n2 = n / 2;
    n2 -= n2 % 8;
    return np_pairwise_sum(a, n2) + np_pairwise_sum(a + n2, n - n2);
}

/* The element-wise part of dither_quantize on at most 128 elements: y = floor(a + v), the index as a
 * double, and fq = f (1 - f), f = a - floor(a), a = (x - offset) / step.  Written once per x type and
 * compiled twice: for any x86-64 and, picked at run time, for AVX2 (floor and the divisions four at
 * a time; the same IEEE operations, so the same numbers). */
#define DITHER_LEAF(NAME, XT)                                                                            \
    static void NAME(const XT *x, const uint64_t *t, int n, double step, double offset, double *y,      \
                     double *fq)                                                                         \
    {                                                                                                    \
        for (int i = 0; i < n; i++) {                                                                    \
            double a = ((double)x[i] - offset) / step;                                                   \
            y[i] = floor(a + (double)(int64_t)(t[i] & ((1ULL << 53) - 1)) * DITHER_SCALE);               \
            double f = a - floor(a);                                                                     \
            fq[i] = f * (1.0 - f);                                                                       \
        }                                                                                                \
    }
DITHER_LEAF(dither_leaf_f32, float)
DITHER_LEAF(dither_leaf_f64, double)
#ifdef LANES_AVX2
__attribute__((target("avx2"))) DITHER_LEAF(dither_leaf_f32_avx2, float)
__attribute__((target("avx2"))) DITHER_LEAF(dither_leaf_f64_avx2, double)
#endif

typedef struct {
    const void *x;
    int xk, avx2;
    const uint64_t *t;
    double step, offset;
    int64_t *q, *joint, lo, hi, q_base;
    Py_ssize_t span, fine;
    int bad;
} dq_job;

/* Round x[lo .. lo + n) and return the sum of its f (1 - f) in numpy's pairwise order (the leaves
 * of numpy's recursion are the blocks rounded here, so nothing is stored but q). */
static double dq_run(dq_job *jb, Py_ssize_t lo, Py_ssize_t n)
{
    if (n > 128) {
        Py_ssize_t n2 = n / 2;
        n2 -= n2 % 8;
        double left = dq_run(jb, lo, n2);
        return left + dq_run(jb, lo + n2, n - n2);
    }
    double y[128], fq[128];
    const uint64_t *t = jb->t + lo;
#ifdef LANES_AVX2
    if (jb->avx2) {
        if (jb->xk == 4) dither_leaf_f32_avx2((const float *)jb->x + lo, t, (int)n, jb->step, jb->offset, y, fq);
        else dither_leaf_f64_avx2((const double *)jb->x + lo, t, (int)n, jb->step, jb->offset, y, fq);
    } else
#endif
    {
        if (jb->xk == 4) dither_leaf_f32((const float *)jb->x + lo, t, (int)n, jb->step, jb->offset, y, fq);
        else dither_leaf_f64((const double *)jb->x + lo, t, (int)n, jb->step, jb->offset, y, fq);
    }
    int64_t *q = jb->q + lo, qlo = jb->lo, qhi = jb->hi;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (!(fabs(y[i]) < DITHER_BOUND)) { jb->bad = 1; return 0.0; }
        int64_t v = (int64_t)y[i];
        q[i] = v;
        qlo = v < qlo ? v : qlo;
        qhi = v > qhi ? v : qhi;
        if (jb->joint) {
            uint64_t col = (uint64_t)v - (uint64_t)jb->q_base;
            if (col >= (uint64_t)jb->span) { jb->bad = 1; return 0.0; }
            jb->joint[dither_context(t[i] & ((1ULL << 53) - 1), (uint64_t)jb->fine) * jb->span + (Py_ssize_t)col]++;
        }
    }
    jb->lo = qlo;
    jb->hi = qhi;
    return np_pairwise_sum(fq, n);
}

PyDoc_STRVAR(dither_quantize_doc,
"dither_quantize(x, t, step, offset, q, q_base, fine, joint) -> (q_min, q_max, straddle) or None\n\n"
"q[i] = floor((x[i] - offset) / step + t[i] 2^-53) (dither.quantize: x float32 or float64 widened,\n"
"float64 operations in numpy's order); straddle = the sum of f (1 - f), f = a - floor(a),\n"
"a = (x[i] - offset) / step, in numpy's pairwise order (dither.straddle); unless joint is None\n"
"(int64, fine x span cells, zeroed here), joint[c span + q[i] - q_base] += 1 with\n"
"c = (t[i] fine) >> 53 (dither.choose_alphabet's histogram of the indices per finest context).\n"
"t: uint64 below 2^53; q: int64.  None where an index is not finite, not below 2^62 in magnitude\n"
"or (with joint) outside q_base .. q_base + span - 1: the caller takes the numpy path for that input.");

static PyObject *py_dither_quantize(PyObject *self, PyObject *args)
{
    PyObject *xo, *to, *qo, *jo;
    double step, offset;
    long long q_base;
    Py_ssize_t fine;
    if (!PyArg_ParseTuple(args, "OOddOLnO", &xo, &to, &step, &offset, &qo, &q_base, &fine, &jo)) return NULL;
    Py_buffer b[4];
    int got = 0, have_j = 0;
    if (get_buf(xo, &b[0], 0, "dither_quantize x") < 0) return NULL;
    got = 1;
    if (stream_buf(to, &b[1], 1) < 0) goto fail;
    got = 2;
    if (i64_buf(qo, &b[2], 1, "dither_quantize q") < 0) goto fail;
    got = 3;
    if (jo != Py_None) {
        if (i64_buf(jo, &b[3], 1, "dither_quantize joint") < 0) goto fail;
        have_j = got++;
    }
    int xk = float_kind(&b[0]);
    Py_ssize_t n = xk ? b[0].len / xk : -1, span = have_j && fine >= 1 && fine <= 64 ? b[have_j].len / 8 / fine : 1;
    if (!xk || b[1].len / 8 != n || b[2].len / 8 != n
        || (have_j && (fine < 1 || fine > 64 || span < 1 || span * fine * 8 != b[have_j].len))) {
        PyErr_SetString(PyExc_ValueError, "dither_quantize: x float32/float64, t uint64, q int64, all of one length; "
                                          "joint int64 of fine (1..64) x span cells");
        goto fail;
    }
    {
        dq_job jb = {b[0].buf, xk, 0, (const uint64_t *)b[1].buf, step, offset, (int64_t *)b[2].buf,
                     have_j ? (int64_t *)b[have_j].buf : NULL, INT64_MAX, INT64_MIN, q_base, span, fine, 0};
#ifdef LANES_AVX2
        jb.avx2 = have_avx2();
#endif
        const uint64_t *t = jb.t;
        uint64_t big = 0;
        double straddle = 0.0;
        if (jb.joint) memset(jb.joint, 0, (size_t)(span * fine) * 8);
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t i = 0; i < n; i++) big |= t[i];
        if (n) straddle = dq_run(&jb, 0, n);
        Py_END_ALLOW_THREADS
        release_bufs(b, got);
        if (big >> 53) {
            PyErr_SetString(PyExc_ValueError, "dither_quantize: t must be below 2^53");
            return NULL;
        }
        if (jb.bad || n == 0) Py_RETURN_NONE;
        return Py_BuildValue("(LLd)", (long long)jb.lo, (long long)jb.hi, straddle);
    }
fail:
    release_bufs(b, got);
    return NULL;
}

PyDoc_STRVAR(dither_split_doc,
"dither_split(q, t, count, q_lo, inner, escape, ordered[, per]) -> (list of count ints, bytes)\n\n"
"The symbols of the indices q (int64) in context order (dither.Alphabet.split then\n"
"dither.by_context): s = q - q_lo for 0 <= s < inner, else the escape symbol inner (escape true),\n"
"whose q go, in index order, to the int64 array returned as bytes.  ordered: uint32 of len(q).\n"
"per (int64, count + 1): the elements of each context and the escaped ones, where the caller has\n"
"counted them (one pass instead of two; checked: ValueError where they are not q's).\n"
"Returns the elements in each context and the escaped q; ValueError for an index outside an\n"
"alphabet without escape.");

static PyObject *py_dither_split(PyObject *self, PyObject *args)
{
    PyObject *qo, *to, *oo, *po = Py_None;
    Py_ssize_t count;
    long long q_lo, inner;
    int escape;
    if (!PyArg_ParseTuple(args, "OOnLLpO|O", &qo, &to, &count, &q_lo, &inner, &escape, &oo, &po)) return NULL;
    Py_buffer b[4];
    int got = 0;
    PyObject *escs = NULL;
    if (i64_buf(qo, &b[0], 0, "dither_split q") < 0) return NULL;
    got = 1;
    if (stream_buf(to, &b[1], count) < 0) goto fail;
    got = 2;
    if (u32_buf(oo, &b[2], 1, "dither_split ordered") < 0) goto fail;
    got = 3;
    if (po != Py_None) {
        if (i64_buf(po, &b[3], 0, "dither_split per") < 0) goto fail;
        got = 4;
    }
    Py_ssize_t n = b[0].len / 8;
    if (b[1].len / 8 != n || b[2].len / 4 != n || inner < 1 || inner > 65536 || (got == 4 && b[3].len / 8 != count + 1)) {
        PyErr_SetString(PyExc_ValueError, "dither_split: t and ordered as long as q, inner in 1..65536, per of count + 1");
        goto fail;
    }
    {
        const int64_t *q = (const int64_t *)b[0].buf;
        const uint64_t *t = (const uint64_t *)b[1].buf;
        uint32_t *dst = (uint32_t *)b[2].buf;
        Py_ssize_t cnt[64] = {0}, cur[64], end[64], ne = 0, e = 0, total = 0;
        uint64_t big = 0;
        int given = got == 4, wrong = 0;
        if (given) {
            const int64_t *per = (const int64_t *)b[3].buf;
            for (Py_ssize_t j = 0; j <= count; j++) wrong |= per[j] < 0 || per[j] > n;
            for (Py_ssize_t j = 0; j < count && !wrong; j++) { cnt[j] = (Py_ssize_t)per[j]; total += cnt[j]; }
            ne = wrong ? 0 : (Py_ssize_t)per[count];
            wrong |= total != n;
        } else {
            Py_BEGIN_ALLOW_THREADS
            for (Py_ssize_t i = 0; i < n; i++) {
                big |= t[i];
                cnt[dither_context(t[i] & ((1ULL << 53) - 1), (uint64_t)count)]++;
                ne += (uint64_t)q[i] - (uint64_t)q_lo >= (uint64_t)inner;
            }
            Py_END_ALLOW_THREADS
        }
        if (wrong || big >> 53 || (ne && !escape)) {
            PyErr_SetString(PyExc_ValueError, wrong ? "dither_split: per is not the counts of q"
                                              : big >> 53 ? "dither_split: t must be below 2^53"
                                                          : "dither_split: an index outside an alphabet without escape");
            goto fail;
        }
        escs = PyBytes_FromStringAndSize(NULL, ne * 8);
        if (!escs) goto fail;
        int64_t *esc = (int64_t *)PyBytes_AS_STRING(escs);
        Py_BEGIN_ALLOW_THREADS
        Py_ssize_t at = 0;
        for (Py_ssize_t j = 0; j < count; j++) { cur[j] = at; at += cnt[j]; end[j] = at; }
        if (given) {  /* one pass: the counts checked as it goes (each write within its context) */
            for (Py_ssize_t i = 0; i < n; i++) {
                uint64_t ti = t[i];
                big |= ti;
                uint64_t s = (uint64_t)q[i] - (uint64_t)q_lo;
                Py_ssize_t c = dither_context(ti & ((1ULL << 53) - 1), (uint64_t)count);
                if (s >= (uint64_t)inner) {
                    if (e == ne || !escape) { wrong = 1; break; }
                    esc[e++] = q[i];
                    s = (uint64_t)inner;
                }
                if (cur[c] == end[c]) { wrong = 1; break; }
                dst[cur[c]++] = (uint32_t)s;
            }
            wrong |= e != ne || big >> 53;
        } else {
            for (Py_ssize_t i = 0; i < n; i++) {
                uint64_t s = (uint64_t)q[i] - (uint64_t)q_lo;
                if (s >= (uint64_t)inner) {
                    esc[e++] = q[i];
                    s = (uint64_t)inner;
                }
                dst[cur[dither_context(t[i], (uint64_t)count)]++] = (uint32_t)s;
            }
        }
        Py_END_ALLOW_THREADS
        release_bufs(b, got);
        if (wrong) {
            Py_DECREF(escs);
            PyErr_SetString(PyExc_ValueError, big >> 53 ? "dither_split: t must be below 2^53"
                                                        : "dither_split: per is not the counts of q");
            return NULL;
        }
        PyObject *res = PyList_New(count);
        for (Py_ssize_t j = 0; res && j < count; j++) {
            PyObject *v = PyLong_FromSsize_t(cnt[j]);
            if (!v) { Py_CLEAR(res); break; }
            PyList_SET_ITEM(res, j, v);
        }
        if (!res) { Py_DECREF(escs); return NULL; }
        PyObject *pair = Py_BuildValue("(NN)", res, escs);
        return pair;
    }
fail:
    release_bufs(b, got);
    return NULL;
}

/* One context's IDSA decoder (rans_decode_part's state), read by dither_decode element by element. */
typedef struct {
    const uint8_t *buf;
    const uint32_t *f, *cum;
    uint64_t *coarse;  /* coarse[b]: the symbol s holding slot b << shift | cum[s] << 16 | f[s] << 40 */
    uint32_t *xs;      /* the caller's states and positions, written back at the end */
    int64_t *ps;
    const int64_t *ends;
    uint32_t x[64], mask;
    int64_t p[64];
    int S, W, j, shift;
} dither_dec;

#define DITHER_DEC_BUFS 6
#define DITHER_BLOCK 1024  /* elements a step of dither_decode: uniforms and contexts, symbols, values */
#define DITHER_COARSE_BITS 10  /* 2^10 eight-byte entries a context: 16 contexts' tables stay in L2 */

/* Take one context's decoder from its tuple (buf, f, cum, S, W, x, p, ends); 0 or -1 (error set).
 * Its slot -> symbol lookup is a table of 2^min(S, 10) buckets (each the symbol holding the bucket's
 * first slot, with its cum and f: one load) and a step up the cumulative frequencies: 8 KiB instead
 * of the 2^S entries that would not stay in cache once the contexts alternate element by element.  Symbols of one context
 * are ordered by cum (FORMAT.md 4.4), so the step up is exact. */
static int dither_dec_init(PyObject *item, dither_dec *d, Py_buffer *b, Py_ssize_t k)
{
    PyObject *o[6];
    int S, W;
    if (!PyTuple_Check(item) || !PyArg_ParseTuple(item, "OOOiiOOO", &o[0], &o[1], &o[2], &S, &W, &o[3], &o[4], &o[5]))
        return -1;
    for (int i = 0; i < 6; i++) {
        if (get_buf(o[i], &b[i], i == 3 || i == 4, "dither_decode lanes") < 0) { release_bufs(b, i); return -1; }
    }
    Py_ssize_t M = (Py_ssize_t)1 << (S < 1 || S > 22 ? 0 : S);
    if (S < 1 || S > 22 || W < 1 || W > 64 || b[1].itemsize != 4 || b[2].itemsize != 4 || b[1].len / 4 != k
        || b[2].len != b[1].len || b[3].len != 4 * W || b[3].itemsize != 4 || b[4].len != 8 * W || b[5].len != 8 * W
        || b[0].itemsize != 1) {
        release_bufs(b, 6);
        PyErr_SetString(PyExc_ValueError, "dither_decode: a context's decoder has bad arguments");
        return -1;
    }
    d->buf = (const uint8_t *)b[0].buf;
    d->f = (const uint32_t *)b[1].buf;
    d->cum = (const uint32_t *)b[2].buf;
    d->xs = (uint32_t *)b[3].buf;
    d->ps = (int64_t *)b[4].buf;
    d->ends = (const int64_t *)b[5].buf;
    d->S = S; d->W = W; d->j = 0; d->mask = (uint32_t)M - 1;
    d->shift = S > DITHER_COARSE_BITS ? S - DITHER_COARSE_BITS : 0;
    uint64_t total = 0;
    int ok = 1;
    for (Py_ssize_t s = 0; s < k; s++) {  /* cum must be f's running sum, the whole summing to 2^S */
        ok &= d->cum[s] == total;
        total += d->f[s];
    }
    ok &= total == (uint64_t)M;
    Py_ssize_t nb = M >> d->shift;
    d->coarse = ok ? (uint64_t *)malloc((size_t)nb * sizeof(uint64_t)) : NULL;
    if (ok && !d->coarse) { release_bufs(b, 6); PyErr_NoMemory(); return -1; }
    for (Py_ssize_t i = 0, s = 0; ok && i < nb; i++) {
        uint64_t slot = (uint64_t)i << d->shift;
        while (s < k && (uint64_t)d->cum[s] + d->f[s] <= slot) s++;
        d->coarse[i] = (uint64_t)s | (uint64_t)d->cum[s] << 16 | (uint64_t)d->f[s] << 40;
    }
    for (int j = 0; j < W; j++) {
        d->x[j] = d->xs[j];
        d->p[j] = d->ps[j];
        if (d->p[j] < 0 || d->ends[j] < d->p[j] || d->ends[j] > (int64_t)b[0].len) ok = 0;
    }
    if (!ok) {
        free(d->coarse);
        d->coarse = NULL;
        release_bufs(b, 6);
        PyErr_SetString(PyExc_ValueError, "dither_decode: a context's table or lanes do not fit");
        return -1;
    }
    return 0;
}

/* A block of the dither stream from state z (element i: mix(z + i GAMMA) >> 11): v_i = t_i 2^-53
 * into vb and the context (t_i count) >> 53 into cb.  Compiled for any x86-64 and, picked at run
 * time, for AVX-512DQ (64-bit multiplies and int64 -> double eight at a time; the same integers
 * and the same exact conversions). */
#define DITHER_UNIFORMS(NAME)                                                                            \
    static void NAME(uint64_t z, int m, uint64_t count, double *vb, uint8_t *cb)                        \
    {                                                                                                    \
        for (int i = 0; i < m; i++) {                                                                    \
            uint64_t t = splitmix_mix(z + (uint64_t)i * GAMMA) >> 11;                                    \
            cb[i] = (uint8_t)((t * count) >> 53);                                                        \
            vb[i] = (double)(int64_t)t * DITHER_SCALE;                                                   \
        }                                                                                                \
    }
DITHER_UNIFORMS(dither_uniforms_any)
#ifdef LANES_AVX2
__attribute__((target("avx512f,avx512dq"))) static void dither_uniforms_avx512(uint64_t z, int m, uint64_t count,
                                                                               double *vb, uint8_t *cb)
{
    const __m512i m1 = _mm512_set1_epi64((long long)0xBF58476D1CE4E5B9ULL);
    const __m512i m2 = _mm512_set1_epi64((long long)0x94D049BB133111EBULL);
    const __m512i g8 = _mm512_set1_epi64((long long)(8 * GAMMA)), cnt = _mm512_set1_epi64((long long)count);
    const __m512d scale = _mm512_set1_pd(DITHER_SCALE);
    __m512i zz = _mm512_add_epi64(_mm512_set1_epi64((long long)z),
                                  _mm512_mullo_epi64(_mm512_setr_epi64(0, 1, 2, 3, 4, 5, 6, 7),
                                                     _mm512_set1_epi64((long long)GAMMA)));
    int i = 0;
    for (; i + 8 <= m; i += 8, zz = _mm512_add_epi64(zz, g8)) {
        __m512i x = _mm512_mullo_epi64(_mm512_xor_si512(zz, _mm512_srli_epi64(zz, 30)), m1);
        x = _mm512_mullo_epi64(_mm512_xor_si512(x, _mm512_srli_epi64(x, 27)), m2);
        __m512i t = _mm512_srli_epi64(_mm512_xor_si512(x, _mm512_srli_epi64(x, 31)), 11);
        _mm512_storeu_pd(vb + i, _mm512_mul_pd(_mm512_cvtepi64_pd(t), scale));
        _mm_storel_epi64((__m128i *)(cb + i), _mm512_cvtepi64_epi8(_mm512_srli_epi64(_mm512_mullo_epi64(t, cnt), 53)));
    }
    dither_uniforms_any(z + (uint64_t)i * GAMMA, m - i, count, vb + i, cb + i);
}

CPU_HAS(have_avx512dq, __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq"))
#endif

static void dither_uniforms(int wide, uint64_t z, int m, uint64_t count, double *vb, uint8_t *cb)
{
#ifdef LANES_AVX2
    if (wide) { dither_uniforms_avx512(z, m, count, vb, cb); return; }
#endif
    (void)wide;
    dither_uniforms_any(z, m, count, vb, cb);
}

/* One symbol of lane L of a run without bounds checks (dither_dec_run's fast path: S <= 16 and
 * every state at least RANS_L, so a step needs at most two renormalisation bytes, taken without a
 * branch, and the lane has them): its bucket and a step up the cumulative frequencies, the state
 * update, the bytes (as many as the state is below RANS_L and below RANS_L / 256: the checked
 * loop's count), the symbol to sb[at]. */
#define DITHER_FAST_STEP(L, at)                                                                          \
    do {                                                                                                 \
        uint32_t xv = xl[L], slot = xv & mask;                                                           \
        uint64_t ent = coarse[slot >> shift];                                                            \
        uint32_t sy = (uint32_t)(ent & 0xFFFF), c0 = (uint32_t)(ent >> 16) & 0xFFFFFF;                  \
        uint32_t f0 = (uint32_t)(ent >> 40);                                                             \
        if (slot - c0 >= f0) { /* past the bucket's first symbol (the last one ends at 2^S) */          \
            do sy++; while (slot - cumt[sy] >= ft[sy]);                                                  \
            c0 = cumt[sy];                                                                               \
            f0 = ft[sy];                                                                                 \
        }                                                                                                \
        xv = f0 * (xv >> S) + slot - c0;                                                                 \
        int64_t pj = pl[L];                                                                              \
        uint32_t two = (uint32_t)buf[pj] << 8 | buf[pj + 1];                                             \
        uint32_t nb = (uint32_t)(xv < RANS_L) + (uint32_t)(xv < (RANS_L >> 8)); /* xv >= 2^7: <= 2 */   \
        xv = (xv << (8 * nb)) | (two >> (16 - 8 * nb));                                                  \
        pl[L] = pj + nb;                                                                                 \
        xl[L] = xv;                                                                                      \
        sb[at] = sy;                                                                                     \
    } while (0)

/* The next nc symbols of one context (its lanes' states in locals, one chain per lane), symbol u
 * written to sb[pc[u]]; *code = 1 where a lane's stream ends early.  A function of its own: its
 * few variables stay in registers.  Where S <= 16, every state is in [RANS_L, 2^31) (an invariant
 * of the decode from there on: a state update neither wraps nor leaves less than 2^(23 - S) >= 2^7;
 * a state from the stream's head outside it takes the checked loop) and every lane has
 * two bytes left for each of its symbols in the run, the run takes DITHER_FAST_STEP a round of W
 * lanes at a time (the same arithmetic and bytes as the checked loop, which reads bytes while the
 * state is below RANS_L); else the checked loop. */
#define DITHER_DEC_RUN(NAME)                                                                        \
    static void NAME(dither_dec *d, const uint16_t *pc, int nc, uint32_t *sb, int *code)            \
{                                                                                                   \
    const int W = d->W, S = d->S, shift = d->shift;                                                 \
    const uint32_t mask = d->mask, *cumt = d->cum, *ft = d->f;                                      \
    const uint64_t *coarse = d->coarse;                                                             \
    const uint8_t *buf = d->buf;                                                                    \
    const int64_t *ends = d->ends;                                                                  \
    uint32_t xl[64];                                                                                \
    int64_t pl[64];                                                                                 \
    int j = d->j, fast = S <= 16, u = 0;                                                            \
    const int64_t most = 2 * (int64_t)((nc + W - 1) / W);                                           \
    for (int l = 0; l < W; l++) {                                                                   \
        xl[l] = d->x[l];                                                                            \
        pl[l] = d->p[l];                                                                            \
        fast &= xl[l] >= RANS_L && xl[l] < RANS_L << 8 && pl[l] + most <= ends[l];                  \
    }                                                                                               \
    if (fast) {                                                                                     \
        for (; u < nc && j; u++) {  /* to the end of the round under way */                         \
            DITHER_FAST_STEP(j, pc[u]);                                                             \
            j = j + 1 == W ? 0 : j + 1;                                                             \
        }                                                                                           \
        for (; u + W <= nc; u += W)                                                                 \
            for (int l = 0; l < W; l++) DITHER_FAST_STEP(l, pc[u + l]);                             \
        for (; u < nc; u++, j++) DITHER_FAST_STEP(j, pc[u]);  /* j < W: fewer than W left */        \
        goto out;                                                                                   \
    }                                                                                               \
    for (; u < nc; u++) {                                                                           \
        uint32_t xv = xl[j], slot = xv & mask;                                                      \
        uint64_t ent = coarse[slot >> shift];                                                       \
        uint32_t sy = (uint32_t)(ent & 0xFFFF), c0 = (uint32_t)(ent >> 16) & 0xFFFFFF, f0 = (uint32_t)(ent >> 40);\
        if (slot - c0 >= f0) {  /* past the bucket's first symbol: step up (the last one ends at 2^S) */\
            do sy++; while (slot - cumt[sy] >= ft[sy]);                                             \
            c0 = cumt[sy];                                                                          \
            f0 = ft[sy];                                                                            \
        }                                                                                           \
        xv = f0 * (xv >> S) + slot - c0;                                                            \
        int64_t pj = pl[j];                                                                         \
        while (xv < RANS_L) {                                                                       \
            if (pj >= ends[j]) { *code = 1; goto out; }                                             \
            xv = (xv << 8) | buf[pj++];                                                             \
        }                                                                                           \
        pl[j] = pj;                                                                                 \
        xl[j] = xv;                                                                                 \
        j = j + 1 == W ? 0 : j + 1;                                                                 \
        sb[pc[u]] = sy;                                                                             \
    }                                                                                               \
out:                                                                                                \
    for (int l = 0; l < W; l++) { d->x[l] = xl[l]; d->p[l] = pl[l]; }                               \
    d->j = j;                                                                                       \
}
__attribute__((noinline)) DITHER_DEC_RUN(dither_dec_run_any)
#ifdef LANES_AVX2
__attribute__((noinline, target("bmi,bmi2"))) DITHER_DEC_RUN(dither_dec_run_bmi2)

CPU_HAS(have_bmi2, __builtin_cpu_supports("bmi2"))
#endif

/* dither_dec_run compiled for any x86-64 or, picked at run time, with BMI2's shifts by a register
 * other than cl (the same operations). */
static void dither_dec_run(int bmi2, dither_dec *d, const uint16_t *pc, int nc, uint32_t *sb, int *code)
{
#ifdef LANES_AVX2
    if (bmi2) { dither_dec_run_bmi2(d, pc, nc, sb, code); return; }
#endif
    (void)bmi2;
    dither_dec_run_any(d, pc, nc, sb, code);
}

/* dither_decode's values of a block without escapes: out[i] = (q + (0.5 - v) share) step + offset,
 * q = q_lo + s[i] (exact in float64), the operations in dither.dequantize's order; compiled for
 * any x86-64 and for AVX2 (the same IEEE operations, four at a time).  Returns 1 where a value is
 * not finite in out's type. */
#define DITHER_VALUES(NAME, OT, BIG, ABS)                                                                \
    static int NAME(const double *vb, const uint32_t *sb, int m, double qlo, double share, double step, \
                    double offset, OT *o)                                                                \
    {                                                                                                    \
        int inf = 0;                                                                                     \
        for (int i = 0; i < m; i++) {                                                                    \
            double y = 0.5 - vb[i];                                                                      \
            y = y * share;                                                                               \
            y = y + (qlo + (double)(int32_t)sb[i]);                                                      \
            y = y * step;                                                                                \
            y = y + offset;                                                                              \
            OT fy = (OT)y;                                                                               \
            inf |= !(ABS(fy) <= BIG);                                                                    \
            o[i] = fy;                                                                                   \
        }                                                                                                \
        return inf;                                                                                      \
    }
DITHER_VALUES(dither_values_f32_any, float, FLT_MAX, fabsf)
DITHER_VALUES(dither_values_f64_any, double, DBL_MAX, fabs)
#ifdef LANES_AVX2
__attribute__((target("avx2"))) DITHER_VALUES(dither_values_f32_avx2, float, FLT_MAX, fabsf)
__attribute__((target("avx2"))) DITHER_VALUES(dither_values_f64_avx2, double, DBL_MAX, fabs)
#endif

/* The AVX2 build where it was compiled and the CPU has it (avx2), else the portable one. */
#ifdef LANES_AVX2
#define DITHER_VALUES_PICK(avx2, T, ...) ((avx2) ? dither_values_##T##_avx2(__VA_ARGS__) : dither_values_##T##_any(__VA_ARGS__))
#else
#define DITHER_VALUES_PICK(avx2, T, ...) ((void)(avx2), dither_values_##T##_any(__VA_ARGS__))
#endif

static int dither_values_f32(int avx2, const double *vb, const uint32_t *sb, int m, double qlo, double share,
                             double step, double offset, float *o)
{
    return DITHER_VALUES_PICK(avx2, f32, vb, sb, m, qlo, share, step, offset, o);
}

static int dither_values_f64(int avx2, const double *vb, const uint32_t *sb, int m, double qlo, double share,
                             double step, double offset, double *o)
{
    return DITHER_VALUES_PICK(avx2, f64, vb, sb, m, qlo, share, step, offset, o);
}

PyDoc_STRVAR(dither_decode_doc,
"dither_decode(key, count, lanes, q_lo, k, escape, esc, step, offset, share, out) -> (code, esc_read, counts)\n\n"
"The whole dithered group in one pass (codecs/_dithered.decode's chunks fused): for each element i\n"
"its t_i (dither.stream), its context (t_i count) >> 53, that context's next symbol from its IDSA\n"
"lanes (lanes[c] = (buf u8, f u32, cum u32, S, W, x u32[W], p i64[W], ends i64[W]):\n"
"rans_decode_part's arguments but the table, the states and positions updated in place), its index (q_lo + s, or\n"
"the next zigzag varint of esc + q_lo for the escape symbol k - 1 when escape), and\n"
"out[i] = (q + (0.5 - v_i) share) step + offset in float64 cast to out's type (float32/float64).\n"
"counts: the elements of each context.  code 0: done (the caller checks the counts against the\n"
"lanes, the final states and that esc_read is all of esc); else the\n"
"first problem met (1 a lane ends early, 2 an escape runs past esc, 3 an escape out of range,\n"
"4 a value not finite): the caller decodes with the numpy path, which names it.");

static PyObject *py_dither_decode(PyObject *self, PyObject *args)
{
    unsigned long long key;
    Py_ssize_t count, k;
    PyObject *lo_, *eo, *oo;
    long long q_lo;
    int escape;
    double step, offset, share;
    if (!PyArg_ParseTuple(args, "KnOLnpOdddO", &key, &count, &lo_, &q_lo, &k, &escape, &eo, &step, &offset, &share, &oo))
        return NULL;
    if (count < 1 || count > 64 || k < 1 || k > 65536 || !PyTuple_Check(lo_) || PyTuple_GET_SIZE(lo_) != count) {
        PyErr_SetString(PyExc_ValueError, "dither_decode: count in 1..64 decoders (a tuple), k in 1..65536");
        return NULL;
    }
    dither_dec *dec = (dither_dec *)calloc((size_t)count, sizeof(dither_dec));
    Py_buffer *bufs = (Py_buffer *)calloc((size_t)count * DITHER_DEC_BUFS, sizeof(Py_buffer));
    Py_buffer eb, ob;
    int inited = 0, have_e = 0, have_o = 0;
    PyObject *res = NULL;
    if (!dec || !bufs) { PyErr_NoMemory(); goto done; }
    for (; inited < count; inited++)
        if (dither_dec_init(PyTuple_GET_ITEM(lo_, inited), &dec[inited], &bufs[inited * DITHER_DEC_BUFS], k) < 0) goto done;
    if (get_buf(eo, &eb, 0, "dither_decode esc") < 0) goto done;
    have_e = 1;
    if (get_buf(oo, &ob, 1, "dither_decode out") < 0) goto done;
    have_o = 1;
    int ok_ = float_kind(&ob);
    if (!ok_ || eb.itemsize != 1) {
        PyErr_SetString(PyExc_ValueError, "dither_decode: esc bytes, out float32 or float64");
        goto done;
    }
    {
        Py_ssize_t n = ob.len / ok_, ep = 0, elen = eb.len;
        const uint8_t *e = (const uint8_t *)eb.buf;
        float *o32 = (float *)ob.buf;
        double *o64 = (double *)ob.buf;
        const uint64_t zlimit = ((uint64_t)1 << 54) + 1;  /* 2 limit + 1, limit = 2 MAX_INDEX */
        const uint32_t esym = escape ? (uint32_t)(k - 1) : 0xFFFFFFFFu;
        int code = 0, inf = 0;
        Py_ssize_t cnt[64] = {0};
        /* each context's element positions in the block (the symbols decoded a context at a time) */
        uint16_t *pos = (uint16_t *)malloc((size_t)count * DITHER_BLOCK * sizeof(uint16_t));
        double *vb = (double *)malloc(DITHER_BLOCK * 2 * sizeof(double));
        uint32_t *sb = (uint32_t *)malloc(DITHER_BLOCK * sizeof(uint32_t));
        if (!pos || !vb || !sb) {
            free(pos); free(vb); free(sb);
            PyErr_NoMemory();
            goto done;
        }
        double *qb = vb + DITHER_BLOCK;
        uint8_t cb[DITHER_BLOCK];
        const double qlo_d = (double)q_lo;  /* |q_lo| <= 2^52: exact, and so is q_lo + s */
#ifdef LANES_AVX2
        const int avx2 = have_avx2(), wide = have_avx512dq(), bmi2 = have_bmi2();
#else
        const int avx2 = 0, wide = 0, bmi2 = 0;
#endif
        Py_BEGIN_ALLOW_THREADS
        uint64_t z = (uint64_t)key + GAMMA;
        for (Py_ssize_t i0 = 0; i0 < n && !code; i0 += DITHER_BLOCK) {
            int m = n - i0 < DITHER_BLOCK ? (int)(n - i0) : DITHER_BLOCK;
            /* the block's uniforms, each element's position listed under its context */
            int bcnt[64];
            for (int c = 0; c < count; c++) bcnt[c] = 0;
            dither_uniforms(wide, z, m, (uint64_t)count, vb, cb);
            z += (uint64_t)m * GAMMA;
            if (count == 1) {
                for (int i = 0; i < m; i++) pos[i] = (uint16_t)i;
                bcnt[0] = m;
            } else {
                for (int i = 0; i < m; i++) {
                    int c = cb[i];
                    pos[c * DITHER_BLOCK + bcnt[c]++] = (uint16_t)i;
                }
            }
            /* the symbols, a context at a time (its lanes' states in locals, one chain per lane),
             * each put at its element's place in the block */
            for (int c = 0; c < count && !code; c++) {
                int nc = bcnt[c];
                cnt[c] += nc;
                if (nc) dither_dec_run(bmi2, &dec[c], pos + (Py_ssize_t)c * DITHER_BLOCK, nc, sb, &code);
            }
            if (code) break;
            uint32_t esc_seen = 0;
            if (escape)
                for (int i = 0; i < m; i++) esc_seen |= sb[i] == esym;
            if (!esc_seen) {  /* the values straight from the symbols (vectorisable) */
                if (ok_ == 4) inf |= dither_values_f32(avx2, vb, sb, m, qlo_d, share, step, offset, o32 + i0);
                else inf |= dither_values_f64(avx2, vb, sb, m, qlo_d, share, step, offset, o64 + i0);
                continue;
            }
            /* the indices, in element order (the escapes are read in that order) */
            for (int i = 0; i < m; i++) {
                uint32_t s = sb[i];
                int64_t q;
                if (s == esym) {
                    uint64_t zz = 0;
                    int shift = 0;
                    for (;;) {
                        if (ep >= elen) { code = 2; break; }
                        uint8_t byte = e[ep++];
                        uint64_t pl = byte & 0x7F;
                        if (pl && (shift > 56 || (pl << shift) >> shift != pl)) { code = 3; break; }
                        if (pl) zz |= pl << shift;
                        if (zz > zlimit) { code = 3; break; }
                        if (!(byte & 0x80)) break;
                        if (shift < 63) shift += 7;
                    }
                    if (code) break;
                    q = (int64_t)(zz >> 1) ^ -(int64_t)(zz & 1);
                    q += q_lo;
                    if (q > DITHER_MAX_INDEX || q < -DITHER_MAX_INDEX || (q >= q_lo && q < q_lo + k - 1)) { code = 3; break; }
                } else {
                    q = q_lo + (int64_t)s;
                }
                qb[i] = (double)q;  /* |q| <= 2^52: exact */
            }
            if (code) break;
            /* the values: (q + (0.5 - v) share) step + offset, in that order (vectorisable) */
            if (ok_ == 4) {
                float *o = o32 + i0;
                for (int i = 0; i < m; i++) {
                    double y = 0.5 - vb[i];
                    y = y * share;
                    y = y + qb[i];
                    y = y * step;
                    y = y + offset;
                    float fy = (float)y;
                    inf |= !(fabsf(fy) <= FLT_MAX);  /* not finite: checked after the pass */
                    o[i] = fy;
                }
            } else {
                double *o = o64 + i0;
                for (int i = 0; i < m; i++) {
                    double y = 0.5 - vb[i];
                    y = y * share;
                    y = y + qb[i];
                    y = y * step;
                    y = y + offset;
                    inf |= !(fabs(y) <= DBL_MAX);
                    o[i] = y;
                }
            }
        }
        if (!code && inf) code = 4;
        Py_END_ALLOW_THREADS
        free(pos); free(vb); free(sb);
        for (Py_ssize_t c = 0; c < count; c++)
            for (int j = 0; j < dec[c].W; j++) { dec[c].xs[j] = dec[c].x[j]; dec[c].ps[j] = dec[c].p[j]; }
        PyObject *counts = PyList_New(count);
        for (Py_ssize_t c = 0; counts && c < count; c++) {
            PyObject *v = PyLong_FromSsize_t(cnt[c]);
            if (!v) { Py_CLEAR(counts); break; }
            PyList_SET_ITEM(counts, c, v);
        }
        if (counts) res = Py_BuildValue("(inN)", code, ep, counts);
    }
done:
    if (have_o) PyBuffer_Release(&ob);
    if (have_e) PyBuffer_Release(&eb);
    for (int c = 0; c < inited; c++) {
        release_bufs(&bufs[c * DITHER_DEC_BUFS], 6);
        free(dec[c].coarse);
    }
    free(bufs);
    free(dec);
    return res;
}

/* np.add.reduceat(a, first)'s entry for the segment a[s .. e): a[s] + the rest, pairwise. */
static inline double np_segment_sum(const double *a, Py_ssize_t s, Py_ssize_t e)
{
    return a[s] + np_pairwise_sum(a + s + 1, e - s - 1);
}

/* dither_cells' terms of each element: z = floor(xs scale), the remainder b (times w) and its square
 * term; compiled for any x86-64 and for AVX2 (the same IEEE operations, four at a time). */
#define DITHER_CELLS_TERMS(NAME)                                                                         \
    static void NAME(const double *xs, const double *w, Py_ssize_t n, double scale, double *zs, double *bw, \
                     double *g2)                                                                         \
    {                                                                                                    \
        if (w) {                                                                                         \
            for (Py_ssize_t i = 0; i < n; i++) {                                                         \
                double g = xs[i] * scale, z = floor(g), r = (g - z) * w[i];                              \
                zs[i] = z; bw[i] = r; g2[i] = r * (r / w[i]);                                            \
            }                                                                                            \
        } else {                                                                                         \
            for (Py_ssize_t i = 0; i < n; i++) {                                                         \
                double g = xs[i] * scale, z = floor(g), r = g - z;                                       \
                zs[i] = z; bw[i] = r; g2[i] = r * r;                                                     \
            }                                                                                            \
        }                                                                                                \
    }
DITHER_CELLS_TERMS(dither_cells_terms)
#ifdef LANES_AVX2
__attribute__((target("avx2"))) DITHER_CELLS_TERMS(dither_cells_terms_avx2)
#endif

typedef struct {
    const double *xs, *w;
    double scale;
    int avx2;
} cells_job;

/* The end of the cell starting at s (z = floor(xs[s] scale)): the first e > s whose z is larger,
 * or n; galloping then bisecting, since the z never decrease. */
static Py_ssize_t cells_end(const double *xs, Py_ssize_t n, Py_ssize_t s, double z, double scale)
{
    Py_ssize_t lo = s, step = 1, hi;  /* floor(xs[lo] scale) == z; hi: beyond the cell or n */
    for (;;) {
        hi = lo + step;
        if (hi >= n) { hi = n; break; }
        if (floor(xs[hi] * scale) != z) break;
        lo = hi;
        step *= 2;
    }
    while (hi - lo > 1) {
        Py_ssize_t mid = lo + (hi - lo) / 2;
        if (floor(xs[mid] * scale) != z) hi = mid; else lo = mid;
    }
    return hi;
}

/* numpy's pairwise sums (np_pairwise_sum's order) of w, b (w) and the square term over
 * xs[lo .. lo + n): the terms made a leaf (<= 128 elements) at a time on the stack, so nothing
 * but the sums is stored. */
static void cells_terms_sums(const cells_job *jb, Py_ssize_t lo, Py_ssize_t n, double out[3])
{
    if (n > 128) {
        Py_ssize_t n2 = n / 2;
        n2 -= n2 % 8;
        double l[3], r[3];
        cells_terms_sums(jb, lo, n2, l);
        cells_terms_sums(jb, lo + n2, n - n2, r);
        for (int k = 0; k < 3; k++) out[k] = l[k] + r[k];
        return;
    }
    double zs[128], bw[128], g2[128];
    const double *w = jb->w ? jb->w + lo : NULL;
#ifdef LANES_AVX2
    if (jb->avx2) dither_cells_terms_avx2(jb->xs + lo, w, n, jb->scale, zs, bw, g2);
    else
#endif
    dither_cells_terms(jb->xs + lo, w, n, jb->scale, zs, bw, g2);
    out[0] = w ? np_pairwise_sum(w, n) : 0.0;
    out[1] = np_pairwise_sum(bw, n);
    out[2] = np_pairwise_sum(g2, n);
}

PyDoc_STRVAR(dither_cells_doc,
"dither_cells(xs, w, scale, cell, W, B, G) -> m or -1\n\n"
"dither.expected_choice's pass over its sorted sample xs (float64; weights w, float64, or None for\n"
"all 1): g = xs scale, z = floor(g), b = g - z; the runs of equal z (cells) in order, and per cell\n"
"cell = z, W = its weight, B = the sum of b w (b without weights), G = the sum of (b w) ((b w) / w)\n"
"(b^2 without weights), each summed as np.add.reduceat sums (the segment's first term plus numpy's\n"
"pairwise sum of the rest; W without weights the count).  cell int64, W, B, G float64, each at\n"
"least len(xs) long; returns the number of cells m, or -1 where a z is not finite or not below 2^62\n"
"in magnitude (the caller takes the numpy path).");

static PyObject *py_dither_cells(PyObject *self, PyObject *args)
{
    PyObject *xo, *wo, *co, *Wo, *Bo, *Go;
    double scale;
    if (!PyArg_ParseTuple(args, "OOdOOOO", &xo, &wo, &scale, &co, &Wo, &Bo, &Go)) return NULL;
    Py_buffer b[6];
    int got = 0, have_w = wo != Py_None;
    PyObject *objs[6] = {xo, Wo, Bo, Go, co, wo};
    for (; got < 4; got++)
        if (get_buf(objs[got], &b[got], got > 0, "dither_cells") < 0) goto fail;
    if (i64_buf(co, &b[4], 1, "dither_cells cell") < 0) goto fail;
    got = 5;
    if (have_w) {
        if (get_buf(wo, &b[5], 0, "dither_cells w") < 0) goto fail;
        got = 6;
    }
    Py_ssize_t n = b[0].len / 8;
    int ok = n >= 1 && float_kind(&b[0]) == 8 && (!have_w || (float_kind(&b[5]) == 8 && b[5].len == b[0].len))
             && b[4].len / 8 >= n;
    for (int i = 1; i < 4; i++) ok = ok && float_kind(&b[i]) == 8 && b[i].len / 8 >= n;
    if (!ok) {
        PyErr_SetString(PyExc_ValueError, "dither_cells: xs (float64, not empty), w (float64 of len(xs)) or None; cell "
                                          "int64, W, B, G float64 of at least len(xs)");
        goto fail;
    }
    {
        const double *xs = (const double *)b[0].buf, *w = have_w ? (const double *)b[5].buf : NULL;
        double *W = (double *)b[1].buf, *B = (double *)b[2].buf, *G = (double *)b[3].buf;
        int64_t *cell = (int64_t *)b[4].buf;
        Py_ssize_t m = 0;
        int bad = 0;
        Py_BEGIN_ALLOW_THREADS
        cells_job jb = {xs, w, scale, 0};
#ifdef LANES_AVX2
        jb.avx2 = have_avx2();
#endif
        /* xs ascending and scale > 0: z = floor(xs scale) never decreases (IEEE multiplication and
         * floor are monotone), so the z of the first and last elements bound every z and each cell's
         * end is found by a search; NaN sorts last and fails the bound */
        double z0 = floor(xs[0] * scale), z1 = floor(xs[n - 1] * scale);
        bad = !(scale > 0) || !(fabs(z0) < DITHER_BOUND) || !(fabs(z1) < DITHER_BOUND);
        for (Py_ssize_t s = 0; !bad && s < n; m++) {
            double z = floor(xs[s] * scale);
            Py_ssize_t e = cells_end(xs, n, s, z, scale);
            double first[3], rest[3];
            cells_terms_sums(&jb, s, 1, first);
            cells_terms_sums(&jb, s + 1, e - s - 1, rest);
            cell[m] = (int64_t)z;
            W[m] = w ? w[s] + rest[0] : (double)(e - s);
            B[m] = first[1] + rest[1];
            G[m] = first[2] + rest[2];
            s = e;
        }
        Py_END_ALLOW_THREADS
        release_bufs(b, got);
        return PyLong_FromSsize_t(bad ? -1 : m);
    }
fail:
    release_bufs(b, got);
    return NULL;
}

/* ==== end of the dithered rounding's fused passes ================================================= */

/* ---------------------------------------------------------------------------------------------- */
/* summary thinning (summary.Summary.thin)                                                        */
/* ---------------------------------------------------------------------------------------------- */

/* numpy.maximum(x, y) of two float64 values: x when x >= y or x is NaN, else y. */
static inline double np_max(double x, double y) { return (x >= y || isnan(x)) ? x : y; }

/* One segment's J by eq. 8-9 from prefix sums at its ends: centroids.segment_costs' operations. */
static inline double seg_cost(double a, double b, double dW, double d1, double d2)
{
    return np_max((a + b) * d1 - a * b * dW - d2, 0.0);
}

PyDoc_STRVAR(thin_doc,
"thin(xc, W, P1, P2, shift, v, n, lam, level_bytes, rounds, ratio, lg, log2) -> m\n\n"
"summary.Summary.thin's rounds on levels v and counts n (float64, m0 each, changed in place; the\n"
"kept ones in front, m of them returned) over the sorted centred data xc (N) and its prefix sums\n"
"W, P1, P2 (N + 1): the same operations in the same order.  Each round writes the interior levels'\n"
"max(n_neighbour, n_k) / n_k into ratio (float64, >= m0) and calls log2(q) (q of them), which must\n"
"write numpy's log2 of ratio[:q] into lg[:q] (numpy's own SIMD log2 may differ from libm's).");

static PyObject *py_thin(PyObject *self, PyObject *args)
{
    PyObject *o[8], *cb;
    Py_buffer bf[8];
    double shift, lam, level_bytes;
    int rounds;
    if (!PyArg_ParseTuple(args, "OOOOdOOddiOOO", &o[0], &o[1], &o[2], &o[3], &shift, &o[4], &o[5], &lam,
                          &level_bytes, &rounds, &o[6], &o[7], &cb)) return NULL;
    if (!PyCallable_Check(cb)) {
        PyErr_SetString(PyExc_TypeError, "thin: log2 must be callable");
        return NULL;
    }
    if (get_f64_bufs(o, bf, 8, 4, "thin") < 0) return NULL;
    PyObject *res = NULL;
    double *work = NULL;
    unsigned char *drop = NULL;
    Py_ssize_t N = bf[0].len / 8, m = bf[4].len / 8;
    if (bf[1].len / 8 != N + 1 || bf[2].len / 8 != N + 1 || bf[3].len / 8 != N + 1 || bf[5].len / 8 != m
        || bf[6].len / 8 < m || bf[7].len / 8 < m || m > PY_SSIZE_T_MAX / 64) {
        PyErr_SetString(PyExc_ValueError, "thin: xc (N), W, P1, P2 (N + 1), v, n (m), ratio, lg (>= m) must be float64");
        goto done;
    }
    work = PyMem_RawMalloc((size_t)(7 * m + 1) * sizeof(double));
    drop = PyMem_RawMalloc((size_t)m + 1);
    if (!work || !drop) { PyErr_NoMemory(); goto done; }
    {
        const double *xc = (const double *)bf[0].buf, *W = (const double *)bf[1].buf;
        const double *P1 = (const double *)bf[2].buf, *P2 = (const double *)bf[3].buf;
        double *v = (double *)bf[4].buf, *n = (double *)bf[5].buf;
        double *ratio = (double *)bf[6].buf;
        const double *lg = (const double *)bf[7].buf;
        double *c = work, *Wk = c + m, *P1k = Wk + m, *P2k = P1k + m, *seg = P2k + m, *moved = seg + m, *up = moved + m;
        for (Py_ssize_t i = 0; i < m; i++) {  /* k = searchsorted(xc, v - shift, 'left'): kept levels keep theirs */
            c[i] = v[i] - shift;
            Py_ssize_t k = search_left(xc, N, c[i]);
            Wk[i] = W[k];
            P1k[i] = P1[k];
            P2k[i] = P2[k];
        }
        for (int r = 0; r < rounds && m > 3; r++) {
            Py_ssize_t q = m - 2;
            for (Py_ssize_t i = 0; i + 1 < m; i++)
                seg[i] = seg_cost(c[i], c[i + 1], Wk[i + 1] - Wk[i], P1k[i + 1] - P1k[i], P2k[i + 1] - P2k[i]);
            for (Py_ssize_t j = 0; j < q; j++) {
                double nk = n[j + 1];
                ratio[j] = np_max(np_max(n[j], n[j + 2]), nk) / nk;
            }
            PyObject *ok = PyObject_CallFunction(cb, "n", q);  /* lg[:q] = numpy's log2(ratio[:q]) */
            if (!ok) goto done;
            Py_DECREF(ok);
            int any = 0;
            for (Py_ssize_t j = 0; j < q; j++) {
                double a = c[j], b = c[j + 2], nk = n[j + 1];
                double merged = seg_cost(a, b, Wk[j + 2] - Wk[j], P1k[j + 2] - P1k[j], P2k[j + 2] - P2k[j]);
                double dJ = merged - seg[j] - seg[j + 1];
                double rare = (nk > 0 ? nk * lg[j] : 0.0) / 8;
                drop[j] = dJ < lam * (level_bytes + rare);
            }
            for (Py_ssize_t j = 1; j < q; j += 2) drop[j] &= !drop[j - 1];  /* never two neighbours */
            for (Py_ssize_t j = 2; j < q; j += 2) drop[j] &= !drop[j - 1];
            for (Py_ssize_t j = 0; j < q; j++) any |= drop[j];
            if (!any) break;
            for (Py_ssize_t i = 0; i < m; i++) moved[i] = 0.0;
            for (Py_ssize_t j = 0; j < q; j++)  /* a dropped level's count to its neighbours (eq. 7) */
                if (drop[j]) {
                    up[j] = n[j + 1] * (c[j + 1] - c[j]) / (c[j + 2] - c[j]);
                    moved[j + 2] += up[j];
                }
            for (Py_ssize_t j = 0; j < q; j++)  /* after all the upward moves, as numpy's two updates */
                if (drop[j]) moved[j] += n[j + 1] - up[j];
            Py_ssize_t out = 0;
            for (Py_ssize_t i = 0; i < m; i++) {
                if (i >= 1 && i <= q && drop[i - 1]) continue;
                n[out] = n[i] + moved[i];
                c[out] = c[i];
                Wk[out] = Wk[i];
                P1k[out] = P1k[i];
                P2k[out] = P2k[i];
                v[out++] = v[i];
            }
            m = out;
        }
    }
    res = PyLong_FromSsize_t(m);
done:
    PyMem_RawFree(work);
    PyMem_RawFree(drop);
    release_bufs(bf, 8);
    return res;
}

/* ---------------------------------------------------------------------------------------------- */
/* 1-D k-means optimum (levels_floor.beyond: a lower bound, not a format step)                     */
/* ---------------------------------------------------------------------------------------------- */

/* Squared error of x[a..b) about its mean from prefix sums (0 for an empty range). */
static inline double km_cost(const double *P1, const double *P2, Py_ssize_t a, Py_ssize_t b)
{
    if (b <= a) return 0.0;
    double s1 = P1[b] - P1[a], c = (P2[b] - P2[a]) - s1 * s1 / (double)(b - a);
    return c > 0.0 ? c : 0.0;
}

/* cur[b] = min over a in [olo, min(ohi, b)] of prev[a] + cost(a, b) for b in [lo, hi]: the
 * divide-and-conquer layer (the optimal a is non-decreasing in b for this cost). */
static void km_layer(const double *P1, const double *P2, const double *prev, double *cur, Py_ssize_t lo,
                     Py_ssize_t hi, Py_ssize_t olo, Py_ssize_t ohi)
{
    while (lo <= hi) {
        Py_ssize_t mid = lo + ((hi - lo) >> 1), arg = olo, top = ohi < mid ? ohi : mid;
        double best = INFINITY;
        for (Py_ssize_t a = olo; a <= top; a++) {
            double v = prev[a] + km_cost(P1, P2, a, mid);
            if (v < best) { best = v; arg = a; }
        }
        cur[mid] = best;
        km_layer(P1, P2, prev, cur, lo, mid - 1, olo, arg);  /* the left half recursively, the right by the loop */
        lo = mid + 1;
        olo = arg;
    }
}

PyDoc_STRVAR(kmeans_doc,
"kmeans(xs, k) -> J\n\n"
"The least squared error of x approximated by at most k values (1-D k-means, the clusters contiguous\n"
"in sorted order): xs sorted float64 (centred, for accuracy), k >= 1.  Divide-and-conquer DP layers,\n"
"O(k n log n); a bound for levels_floor, within rounding of the exact optimum.");

static PyObject *py_kmeans(PyObject *self, PyObject *args)
{
    PyObject *xo;
    Py_ssize_t k;
    if (!PyArg_ParseTuple(args, "On", &xo, &k)) return NULL;
    Py_buffer xb;
    if (get_f64_bufs(&xo, &xb, 1, 1, "kmeans") < 0) return NULL;
    Py_ssize_t n = xb.len / 8;
    PyObject *res = NULL;
    double *work = NULL;
    if (k < 1 || n > PY_SSIZE_T_MAX / 64) {
        PyErr_SetString(PyExc_ValueError, "kmeans: k >= 1 needed");
        goto done;
    }
    work = PyMem_RawMalloc((size_t)(4 * (n + 1)) * sizeof(double));
    if (!work) { PyErr_NoMemory(); goto done; }
    {
        const double *x = (const double *)xb.buf;
        double *P1 = work, *P2 = P1 + n + 1, *prev = P2 + n + 1, *cur = prev + n + 1, J;
        Py_BEGIN_ALLOW_THREADS
        P1[0] = P2[0] = 0.0;
        for (Py_ssize_t i = 0; i < n; i++) { P1[i + 1] = P1[i] + x[i]; P2[i + 1] = P2[i] + x[i] * x[i]; }
        for (Py_ssize_t b = 0; b <= n; b++) prev[b] = km_cost(P1, P2, 0, b);
        for (Py_ssize_t layer = 2; layer <= k && layer <= n; layer++) {
            km_layer(P1, P2, prev, cur, 0, n, 0, n);
            double *t = prev; prev = cur; cur = t;
        }
        J = prev[n];
        Py_END_ALLOW_THREADS
        res = PyFloat_FromDouble(J);
    }
done:
    PyMem_RawFree(work);
    PyBuffer_Release(&xb);
    return res;
}

PyDoc_STRVAR(summary_stats_doc,
"summary_stats(xc, W, P1, P2, shift, levels, seg, counts, total)\n\n"
"summary.Summary.stats without its ~15 numpy calls: for sorted levels (float64, K) over the sorted\n"
"centred data xc (N) and its prefix sums W, P1, P2 (N + 1), each segment's J into seg (K - 1; the\n"
"caller sums it, as numpy does) and the expected count per level into counts (K), numpy's\n"
"operations in numpy's order (clip, maximum and the two += of the counts).");

static PyObject *py_summary_stats(PyObject *self, PyObject *args)
{
    PyObject *o[7];
    Py_buffer bf[7];
    double shift, total;
    if (!PyArg_ParseTuple(args, "OOOOdOOOd", &o[0], &o[1], &o[2], &o[3], &shift, &o[4], &o[5], &o[6], &total))
        return NULL;
    if (get_f64_bufs(o, bf, 7, 5, "summary_stats") < 0) return NULL;
    Py_ssize_t N = bf[0].len / 8, K = bf[4].len / 8;
    if (bf[1].len / 8 != N + 1 || bf[2].len / 8 != N + 1 || bf[3].len / 8 != N + 1 || K < 1
        || bf[5].len / 8 != K - 1 || bf[6].len / 8 != K) {
        PyErr_SetString(PyExc_ValueError,
                        "summary_stats: xc (N), W, P1, P2 (N + 1), levels (K >= 1), seg (K - 1), counts (K) must be float64");
        release_bufs(bf, 7);
        return NULL;
    }
    const double *xc = (const double *)bf[0].buf, *W = (const double *)bf[1].buf;
    const double *P1 = (const double *)bf[2].buf, *P2 = (const double *)bf[3].buf, *lv = (const double *)bf[4].buf;
    double *seg = (double *)bf[5].buf, *n = (double *)bf[6].buf;
    double pv = 0, pW = 0, p1 = 0, p2 = 0;
    for (Py_ssize_t j = 0; j < K; j++) {
        double v = lv[j] - shift;
        Py_ssize_t k = search_left(xc, N, v);
        double w = W[k], s1 = P1[k], s2 = P2[k];
        n[j] = 0.0;
        if (j > 0) {
            double dN = w - pW, d1 = s1 - p1;
            seg[j - 1] = seg_cost(pv, v, dN, d1, s2 - p2);
            double up = (d1 - pv * dN) / (v - pv), top = np_max(dN, 0.0);  /* np.clip(up, 0, max(N, 0)) */
            if (!isnan(up)) up = up > 0.0 ? up : 0.0;
            if (!isnan(up)) up = up < top ? up : top;
            n[j] += up;  /* n[1:] += up, then n[:-1] += N - up */
            n[j - 1] = n[j - 1] + (dN - up);
        }
        pv = v; pW = w; p1 = s1; p2 = s2;
    }
    n[K - 1] += total - pW;
    for (Py_ssize_t j = 0; j < K; j++) n[j] = np_max(n[j], 0.0);
    release_bufs(bf, 7);
    Py_RETURN_NONE;
}

/* ---------------------------------------------------------------------------------------------- */
/* minmax: parallel.bounds' two reductions in one pass                                             */
/* ---------------------------------------------------------------------------------------------- */

/* The running min and max of x[i] over ACC independent accumulators (the selects carry no chain
 * from one element to the next), and whether any x[i] is NaN.  T: float or double. */
#define MINMAX_PORTABLE(name, T)                                                                   \
    static int name(const T *x, Py_ssize_t n, double *lo, double *hi)                              \
    {                                                                                              \
        T mn[4] = {x[0], x[0], x[0], x[0]}, mx[4] = {x[0], x[0], x[0], x[0]};                      \
        int nan = 0;                                                                               \
        Py_ssize_t i = 0;                                                                          \
        for (; i + 4 <= n; i += 4)                                                                 \
            for (int k = 0; k < 4; k++) {                                                          \
                T v = x[i + k];                                                                    \
                mn[k] = v < mn[k] ? v : mn[k];                                                     \
                mx[k] = v > mx[k] ? v : mx[k];                                                     \
                nan |= v != v;                                                                     \
            }                                                                                      \
        for (; i < n; i++) {                                                                       \
            T v = x[i];                                                                            \
            mn[0] = v < mn[0] ? v : mn[0];                                                         \
            mx[0] = v > mx[0] ? v : mx[0];                                                         \
            nan |= v != v;                                                                         \
        }                                                                                          \
        for (int k = 1; k < 4; k++) {                                                              \
            mn[0] = mn[k] < mn[0] ? mn[k] : mn[0];                                                 \
            mx[0] = mx[k] > mx[0] ? mx[k] : mx[0];                                                 \
        }                                                                                          \
        *lo = (double)mn[0];                                                                       \
        *hi = (double)mx[0];                                                                       \
        return !nan;                                                                               \
    }
MINMAX_PORTABLE(minmax_f32, float)
MINMAX_PORTABLE(minmax_f64, double)

#ifdef X86_SIMD
/* The same with AVX2 (two accumulators of 8 floats / 4 doubles): _mm256_min_ps(v, acc) keeps acc
 * where v is NaN (NaN is flagged apart), so the lanes hold the min of the non-NaN values. */
#define MINMAX_AVX2(name, T, W, V, LOAD, MIN, MAX, CMP, OR, MASK, SET1, STORE)                      \
    __attribute__((target("avx2"))) static int name(const T *x, Py_ssize_t n, double *lo, double *hi) \
    {                                                                                              \
        V mn0 = SET1(x[0]), mn1 = mn0, mx0 = mn0, mx1 = mn0, bad = CMP(mn0, mn0, _CMP_UNORD_Q);    \
        Py_ssize_t i = 0;                                                                          \
        for (; i + 2 * W <= n; i += 2 * W) {                                                       \
            V a = LOAD(x + i), b = LOAD(x + i + W);                                                \
            mn0 = MIN(a, mn0); mx0 = MAX(a, mx0);                                                  \
            mn1 = MIN(b, mn1); mx1 = MAX(b, mx1);                                                  \
            bad = OR(bad, OR(CMP(a, a, _CMP_UNORD_Q), CMP(b, b, _CMP_UNORD_Q)));                   \
        }                                                                                          \
        T mn[W], mx[W];                                                                            \
        STORE(mn, MIN(mn1, mn0));                                                                  \
        STORE(mx, MAX(mx1, mx0));                                                                  \
        int nan = MASK(bad) != 0;                                                                  \
        T a = mn[0], b = mx[0];                                                                    \
        for (int k = 1; k < W; k++) {                                                              \
            a = mn[k] < a ? mn[k] : a;                                                             \
            b = mx[k] > b ? mx[k] : b;                                                             \
        }                                                                                          \
        for (; i < n; i++) {                                                                       \
            T v = x[i];                                                                            \
            a = v < a ? v : a;                                                                     \
            b = v > b ? v : b;                                                                     \
            nan |= v != v;                                                                         \
        }                                                                                          \
        *lo = (double)a;                                                                           \
        *hi = (double)b;                                                                           \
        return !nan;                                                                               \
    }
MINMAX_AVX2(minmax_f32_avx2, float, 8, __m256, _mm256_loadu_ps, _mm256_min_ps, _mm256_max_ps, _mm256_cmp_ps,
            _mm256_or_ps, _mm256_movemask_ps, _mm256_set1_ps, _mm256_storeu_ps)
MINMAX_AVX2(minmax_f64_avx2, double, 4, __m256d, _mm256_loadu_pd, _mm256_min_pd, _mm256_max_pd, _mm256_cmp_pd,
            _mm256_or_pd, _mm256_movemask_pd, _mm256_set1_pd, _mm256_storeu_pd)
#endif

PyDoc_STRVAR(minmax_doc,
"minmax(x) -> (min, max) or None\n\n"
"parallel.bounds' (np.minimum.reduce(x), np.maximum.reduce(x)) as Python floats, in one pass, for a\n"
"non-empty C-contiguous float32 or float64 buffer; None where numpy's answer is the one to take:\n"
"another buffer, a NaN, or a zero as the min or the max (-0.0 == 0.0, and which one numpy's\n"
"reduction returns is its order's choice).  Otherwise the min and max are unique values.");

#define MINMAX_RELEASE (1 << 16)  /* from this many values the pass releases the GIL */

static PyObject *py_minmax(PyObject *self, PyObject *o)
{
    Py_buffer b;
    if (PyObject_GetBuffer(o, &b, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    int kind = float_kind(&b);
    Py_ssize_t n = kind ? b.len / kind : 0;
    double lo = 0.0, hi = 0.0;
    int ok = 0;
    if (n > 0) {
        PyThreadState *ts = n >= MINMAX_RELEASE ? PyEval_SaveThread() : NULL;  /* the GIL: for long passes */
#ifdef X86_SIMD
        if (have_avx2())
            ok = kind == 4 ? minmax_f32_avx2((const float *)b.buf, n, &lo, &hi)
                           : minmax_f64_avx2((const double *)b.buf, n, &lo, &hi);
        else
#endif
            ok = kind == 4 ? minmax_f32((const float *)b.buf, n, &lo, &hi)
                           : minmax_f64((const double *)b.buf, n, &lo, &hi);
        if (ts) PyEval_RestoreThread(ts);
    }
    PyBuffer_Release(&b);
    if (!ok || lo == 0.0 || hi == 0.0) Py_RETURN_NONE;
    return Py_BuildValue("dd", lo, hi);
}

static PyMethodDef methods[] = {
    {"minmax", py_minmax, METH_O, minmax_doc},
    {"new_bytes", py_new_bytes, METH_O, new_bytes_doc},
#ifdef HUGE_BUFFERS
    {"huge_buffer", py_huge_buffer, METH_O, huge_buffer_doc},
    {"huge_buffer_pool", py_huge_buffer_pool, METH_O, huge_buffer_pool_doc},
#endif
    {"sround", py_sround, METH_VARARGS, sround_doc},
    {"dp_levels", py_dp_levels, METH_VARARGS, dp_doc},
    {"outside", py_outside, METH_VARARGS, outside_doc},
    {"polish", py_polish, METH_VARARGS, polish_doc},
    {"prefix", py_prefix, METH_VARARGS, prefix_doc},
    {"cand_counts", py_cand_counts, METH_VARARGS, cand_counts_doc},
    {"dp_polish", py_dp_polish, METH_VARARGS, dp_polish_doc},
    {"candidates", py_candidates, METH_VARARGS, candidates_doc},
    {"solve_sorted", py_solve_sorted, METH_VARARGS, solve_sorted_doc},
    {"solve_round", py_solve_round, METH_VARARGS, solve_round_doc},
    {"rans_encode", py_rans_encode, METH_VARARGS, rans_encode_doc},
    {"rans_decode_part", py_rans_decode_part, METH_VARARGS, rans_decode_part_doc},
    {"normalize", py_normalize, METH_VARARGS, normalize_doc},
    {"symbol_counts", py_symbol_counts, METH_VARARGS, symbol_counts_doc},
    {"pack_counts", py_pack_counts, METH_VARARGS, pack_counts_doc},
    {"byte_screen", py_byte_screen, METH_VARARGS, byte_screen_doc},
    {"lanes_encode", py_lanes_encode, METH_VARARGS, lanes_encode_doc},
    {"lanes_decode", py_lanes_decode, METH_VARARGS, lanes_decode_doc},
#ifdef CRC_FOLDS
    {"crc32", py_crc32, METH_VARARGS, crc32_doc},
#endif
    {"lookup_bytes", py_lookup_bytes, METH_VARARGS, lookup_bytes_doc},
    {"dot", py_dot, METH_VARARGS, dot_doc},
    {"lookup_error", py_lookup_error, METH_VARARGS, lookup_error_doc},
    {"nearest", py_nearest, METH_VARARGS, nearest_doc},
    {"varints", py_varints, METH_VARARGS, varints_doc},
    {"splitmix64", py_splitmix64, METH_VARARGS, splitmix64_doc},
    {"context_counts", py_context_counts, METH_VARARGS, context_counts_doc},
    {"context_route", py_context_route, METH_VARARGS, context_route_doc},
    {"dither_quantize", py_dither_quantize, METH_VARARGS, dither_quantize_doc},
    {"dither_split", py_dither_split, METH_VARARGS, dither_split_doc},
    {"dither_decode", py_dither_decode, METH_VARARGS, dither_decode_doc},
    {"dither_cells", py_dither_cells, METH_VARARGS, dither_cells_doc},
    {"thin", py_thin, METH_VARARGS, thin_doc},
    {"summary_stats", py_summary_stats, METH_VARARGS, summary_stats_doc},
    {"kmeans", py_kmeans, METH_VARARGS, kmeans_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef moddef = {
    PyModuleDef_HEAD_INIT, "mucsc.codec._kernels",
    "Optional compiled kernels (stochastic rounding, centroid DP); see mucsc/codec/kernels.py.",
    -1, methods,
};

PyMODINIT_FUNC PyInit__kernels(void)
{
    if (PyType_Ready(&WritableType) < 0) return NULL;
#ifdef HUGE_BUFFERS
    if (PyType_Ready(&HugeBufType) < 0) return NULL;
#endif
#ifdef LANES_AVX2
    (void)have_avx2();  /* decided once here, under the GIL: the coder's threads only read it */
#endif
    return PyModule_Create(&moddef);
}
