/* The compiled CPU kernel: one pass over each masked row of host logits.
 *
 * Each 32-bit bitmask word covers 32 logits and is handled by what it holds:
 *   all ones   -> nothing is read or written (all-allowed words are skipped 8 at a time);
 *   few zeros  -> -inf is written at each cleared bit (bit scan), touching only those lines;
 *   all zeros  -> 32 stores of -inf, no reads;
 *   otherwise  -> a branch-free select (SSE2 on x86-64, a plain loop elsewhere).
 * So a JSON-like row costs a write pass, a row inside a string a few scattered stores and an
 * all-allowed row a read of its bitmask: never more than one read and write of the logits.
 *
 * Logits come through the buffer protocol as any array of 4- or 2-byte items (float32,
 * float16, an int16 view of bfloat16) and are written as bit patterns. The GIL is released
 * while rows are masked, in the OpenMP team of the runtime the process already loaded
 * (find_openmp below) or on the calling thread. No NumPy headers: only the CPython API.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

/* A word with at most this many cleared bits is scanned bit by bit: cheaper than the select
 * and it touches only the cache lines holding blocked tokens (bench/bench_apply.py, masks
 * string and blocked20, after a matmul). */
#ifndef FEW_BLOCKED
#define FEW_BLOCKED 4
#endif

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

/* Inline: without -mpopcnt, __builtin_popcount is a library call. */
static inline int popcount32(uint32_t x) {
    x = x - ((x >> 1) & 0x55555555u);
    x = (x & 0x33333333u) + ((x >> 2) & 0x33333333u);
    x = (x + (x >> 4)) & 0x0F0F0F0Fu;
    return (int)((x * 0x01010101u) >> 24);
}

#if defined(__GNUC__) || defined(__clang__)
#define CTZ32(x) __builtin_ctz(x)
#define PREFETCH_FOR_WRITE(p) __builtin_prefetch((p), 1)
#else
#define PREFETCH_FOR_WRITE(p) ((void)(p))
static int CTZ32(uint32_t x) { int n = 0; while (!(x & 1u)) { x >>= 1; n++; } return n; }
#endif

/* The first word in [w, stop) that blocks a token, or stop: all-allowed words are skipped
 * eight at a time (most of the cost of an all-allowed row is this scan). */
static inline Py_ssize_t next_blocking(const uint32_t *words, Py_ssize_t w, Py_ssize_t stop) {
#if defined(__SSE2__)
    const __m128i ones = _mm_set1_epi32(-1);
    for (; w + 8 <= stop; w += 8) {
        __m128i both = _mm_and_si128(_mm_loadu_si128((const __m128i *)(words + w)),
                                     _mm_loadu_si128((const __m128i *)(words + w + 4)));
        if (_mm_movemask_epi8(_mm_cmpeq_epi32(both, ones)) != 0xFFFF) break;
    }
#endif
    while (w < stop && words[w] == 0xFFFFFFFFu) w++;
    return w;
}

/* -inf into the 32 logits of an all-blocked word. */
static inline void fill_word32(uint32_t *p, uint32_t neg) {
#if defined(__SSE2__)
    __m128i v = _mm_set1_epi32((int)neg);
    for (int i = 0; i < 32; i += 4) _mm_storeu_si128((__m128i *)(p + i), v);
#else
    for (int i = 0; i < 32; i++) p[i] = neg;
#endif
}

static inline void fill_word16(uint16_t *p, uint16_t neg) {
#if defined(__SSE2__)
    __m128i v = _mm_set1_epi16((short)neg);
    for (int i = 0; i < 32; i += 8) _mm_storeu_si128((__m128i *)(p + i), v);
#else
    for (int i = 0; i < 32; i++) p[i] = neg;
#endif
}

/* p[i] = bit i of m set ? p[i] : neg, for the 32 logits of one word, without branches. */
static inline void select_word32(uint32_t *p, uint32_t m, uint32_t neg) {
#if defined(__SSE2__)
    const __m128i negv = _mm_set1_epi32((int)neg), mv = _mm_set1_epi32((int)m);
    __m128i bit = _mm_setr_epi32(1, 2, 4, 8);
    for (int i = 0; i < 32; i += 4) {
        __m128i keep = _mm_cmpeq_epi32(_mm_and_si128(mv, bit), bit);
        __m128i x = _mm_loadu_si128((const __m128i *)(p + i));
        x = _mm_or_si128(_mm_and_si128(keep, x), _mm_andnot_si128(keep, negv));
        _mm_storeu_si128((__m128i *)(p + i), x);
        bit = _mm_slli_epi32(bit, 4);
    }
#else
    for (int i = 0; i < 32; i++) {
        uint32_t keep = 0u - ((m >> i) & 1u);
        p[i] = (p[i] & keep) | (neg & ~keep);
    }
#endif
}

static inline void select_word16(uint16_t *p, uint32_t m, uint16_t neg) {
#if defined(__SSE2__)
    const __m128i negv = _mm_set1_epi16((short)neg);
    const __m128i low = _mm_setr_epi16(1, 2, 4, 8, 16, 32, 64, 128);
    const __m128i high = _mm_setr_epi16(256, 512, 1024, 2048, 4096, 8192, 16384, -32768);
    for (int h = 0; h < 2; h++) {
        __m128i mv = _mm_set1_epi16((short)(m >> (16 * h)));
        for (int k = 0; k < 2; k++) {
            __m128i bit = k ? high : low;
            __m128i keep = _mm_cmpeq_epi16(_mm_and_si128(mv, bit), bit);
            uint16_t *q = p + 16 * h + 8 * k;
            __m128i x = _mm_loadu_si128((const __m128i *)q);
            x = _mm_or_si128(_mm_and_si128(keep, x), _mm_andnot_si128(keep, negv));
            _mm_storeu_si128((__m128i *)q, x);
        }
    }
#else
    for (int i = 0; i < 32; i++) {
        uint16_t keep = (uint16_t)(0u - ((m >> i) & 1u));
        p[i] = (uint16_t)((p[i] & keep) | (neg & ~keep));
    }
#endif
}

/* Words ahead of the one being masked whose lines are prefetched for writing: a stream of
 * stores alone ran 1.5x slower than with the prefetch (write misses are not prefetched). */
#define PREFETCH_WORDS 16

/* Mask words [first, stop) of one row; ``full`` words cover 32 logits each, word ``full`` (if
 * any) only ``tail``. ELEM is the logits' bit-pattern type. */
#define MASK_WORDS(NAME, ELEM, FILL_WORD, SELECT_WORD)                                        \
    static void NAME(ELEM *row, const uint32_t *words, Py_ssize_t first, Py_ssize_t stop,     \
                     Py_ssize_t full, Py_ssize_t tail, ELEM neg) {                            \
        Py_ssize_t last_full = stop < full ? stop : full;                                     \
        for (Py_ssize_t w = first; (w = next_blocking(words, w, last_full)) < last_full; w++) { \
            uint32_t m = words[w];                                                            \
            ELEM *p = row + 32 * w;                                                           \
            if (w + PREFETCH_WORDS < last_full && words[w + PREFETCH_WORDS] != 0xFFFFFFFFu)   \
                PREFETCH_FOR_WRITE(p + 32 * PREFETCH_WORDS);                                  \
            if (m == 0) {                                                                     \
                FILL_WORD(p, neg);                                                            \
            } else if (popcount32(~m) <= FEW_BLOCKED) {                                       \
                for (uint32_t b = ~m; b; b &= b - 1) p[CTZ32(b)] = neg;                       \
            } else {                                                                          \
                SELECT_WORD(p, m, neg);                                                       \
            }                                                                                 \
        }                                                                                     \
        if (tail && first <= full && full < stop) {                                           \
            /* Bits at and past vocab have no logits to mask. */                              \
            ELEM *p = row + 32 * full;                                                        \
            for (uint32_t b = ~words[full] & ((1u << tail) - 1u); b; b &= b - 1)              \
                p[CTZ32(b)] = neg;                                                            \
        }                                                                                     \
    }

MASK_WORDS(mask_words32, uint32_t, fill_word32, select_word32)
MASK_WORDS(mask_words16, uint16_t, fill_word16, select_word16)

/* One call's work: ``count`` rows of ``row_words`` words each, seen as one run of words that
 * threads split evenly (so one long row is split too). */
typedef struct {
    char *bits;
    Py_ssize_t bits_stride, itemsize;
    const char *bitmask;
    Py_ssize_t bitmask_stride;
    const int64_t *rows, *bitmask_rows;
    Py_ssize_t count, full, tail, row_words;
    uint32_t neg;
} Job;

static void run_part(const Job *job, int part, int parts) {
    Py_ssize_t total = job->count * job->row_words;
    Py_ssize_t begin = total * part / parts, end = total * (part + 1) / parts;
    for (Py_ssize_t at = begin; at < end;) {
        Py_ssize_t i = at / job->row_words, first = at % job->row_words;
        Py_ssize_t stop = first + (end - at);
        if (stop > job->row_words) stop = job->row_words;
        const uint32_t *words =
            (const uint32_t *)(job->bitmask + job->bitmask_rows[i] * job->bitmask_stride);
        char *row = job->bits + job->rows[i] * job->bits_stride;
        if (job->itemsize == 4)
            mask_words32((uint32_t *)row, words, first, stop, job->full, job->tail, job->neg);
        else
            mask_words16((uint16_t *)row, words, first, stop, job->full, job->tail,
                         (uint16_t)job->neg);
        at += stop - first;
    }
}

/* Threads: the OpenMP runtime the process already has (Torch's libgomp, or an LLVM/Intel
 * runtime, all of which export GOMP_parallel). The kernel joins that team instead of starting
 * threads of its own: right after a framework op its threads are still spinning and take the
 * work at once, where threads of ours would compete with them for the cores. Nothing is
 * linked: without a loaded runtime the kernel runs on the calling thread.
 *
 * A team is woken only for work worth it (threads=0, the default):
 *   - light work stays on the calling thread: fewer than PARALLEL_MIN_WORDS bitmask words
 *     that block a token (an all-allowed batch costs a read of its bitmask, 0.03-0.05 ms at
 *     B=64 x 152k, less than a team hand-off can save and far less than it can cost);
 *   - on a machine whose cores other processes keep busy, a team member waits for a core
 *     before it starts, and the call waits for it at the team's barrier: 7-35 ms per call
 *     where one thread took 1.3 ms (2 cores, load average 3). So each team call measures how
 *     late its last member started; a member later than late_ns makes the next calls run on
 *     the calling thread (16, doubling while the team stays late, at most 4096), then the team
 *     is tried again. */
typedef void (*gomp_parallel_fn)(void (*)(void *), void *, unsigned, unsigned);
typedef int (*omp_int_fn)(void);
static gomp_parallel_fn gomp_parallel;
static omp_int_fn omp_thread_num, omp_num_threads, omp_max_threads;
static const char *omp_runtime;

/* Work below this many blocking words (32 tokens each: Torch's grain of 32k elements). */
#define PARALLEL_MIN_WORDS 1024
#define BACKOFF_FIRST 16
#define BACKOFF_MAX 4096
/* Read and written with the GIL held only. */
static long long late_ns = 500000;    /* a member this late: the team was waiting for cores */
static Py_ssize_t team_backoff;       /* calls on the calling thread after the last late team */
static Py_ssize_t team_skip;          /* of those, still to run */
static unsigned long long stat_team, stat_late, stat_light, stat_skipped, stat_empty;
static long long stat_last_lateness = -1;

#if defined(__unix__) || defined(__APPLE__)
#include <dlfcn.h>
#include <time.h>
static const char *OMP_SONAMES[] = {"libgomp.so.1", "libomp.so", "libomp.so.5", "libiomp5.so",
                                    "libomp.dylib", "libiomp5.dylib", NULL};

/* Looks again until a runtime is found: a framework may be imported after this module. */
static void find_openmp(void) {
    if (gomp_parallel) return;
    for (const char **name = OMP_SONAMES; *name; name++) {
        void *lib = dlopen(*name, RTLD_NOW | RTLD_NOLOAD);
        if (!lib) continue;
        gomp_parallel_fn parallel = (gomp_parallel_fn)dlsym(lib, "GOMP_parallel");
        omp_int_fn num = (omp_int_fn)dlsym(lib, "omp_get_thread_num");
        omp_int_fn count = (omp_int_fn)dlsym(lib, "omp_get_num_threads");
        omp_int_fn max = (omp_int_fn)dlsym(lib, "omp_get_max_threads");
        if (parallel && num && count && max) {
            omp_thread_num = num, omp_num_threads = count, omp_max_threads = max;
            omp_runtime = *name;
            gomp_parallel = parallel;  /* last: the flag the checks above read */
            return;
        }
        dlclose(lib);
    }
}

static long long now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}
#else
static void find_openmp(void) {}
static long long now_ns(void) { return 0; }
#endif

/* Members past this many are not timed (their lateness is not looked at). */
#define TIMED_MEMBERS 64
typedef struct {
    const Job *job;
    int parts;
    long long start[TIMED_MEMBERS];
} Team;

static void run_team_member(void *data) {
    Team *team = (Team *)data;
    int part = omp_thread_num(), parts = omp_num_threads();
    if (part < TIMED_MEMBERS) team->start[part] = now_ns();
    if (part == 0) team->parts = parts;
    run_part(team->job, part, parts);
}

/* Runs the job in a team of ``threads``; returns how late (ns) its last member started. */
static long long run_team(const Job *job, int threads) {
    Team team;
    team.job = job;
    team.parts = 0;
    long long begin = now_ns(), lateness = 0;
    gomp_parallel(run_team_member, &team, (unsigned)threads, 0);
    for (int i = 0; i < team.parts && i < TIMED_MEMBERS; i++)
        if (team.start[i] - begin > lateness) lateness = team.start[i] - begin;
    return lateness;
}

/* Words of the job's rows that block a token, counted until ``limit`` (bits past the
 * vocabulary do not count). */
static Py_ssize_t count_blocking(const Job *job, Py_ssize_t limit) {
    Py_ssize_t blocking = 0;
    for (Py_ssize_t i = 0; i < job->count; i++) {
        const uint32_t *words =
            (const uint32_t *)(job->bitmask + job->bitmask_rows[i] * job->bitmask_stride);
        for (Py_ssize_t w = 0; (w = next_blocking(words, w, job->full)) < job->full; w++)
            if (++blocking >= limit) return blocking;
        if (job->tail && (~words[job->full] & ((1u << job->tail) - 1u)))
            if (++blocking >= limit) return blocking;
    }
    return blocking;
}

static int get_rows(PyObject *obj, Py_buffer *view, const char *name) {
    if (PyObject_GetBuffer(obj, view, PyBUF_ND | PyBUF_FORMAT) < 0) return -1;
    if (view->ndim != 1 || view->itemsize != 8 ||
        (view->format[0] != 'q' && view->format[0] != 'l') || view->format[1] != '\0') {
        PyErr_Format(PyExc_TypeError, "%s must be a contiguous 1-D int64 array, got format %s "
                     "with %d dimensions", name, view->format, view->ndim);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

/* The team policy's bookkeeping after an automatic call (GIL held). */
static void note_call(int used, int skipped, long long lateness) {
    if (used == 0) {
        stat_empty++;
    } else if (skipped) {
        /* Two threads may have both seen the last skip: never below zero. */
        if (team_skip > 0) team_skip--;
        stat_skipped++;
    } else if (used == 1) {
        stat_light++;
    } else {
        stat_team++;
        stat_last_lateness = lateness;
        if (lateness > late_ns) {
            stat_late++;
            team_backoff = team_backoff ? team_backoff * 2 : BACKOFF_FIRST;
            if (team_backoff > BACKOFF_MAX) team_backoff = BACKOFF_MAX;
            team_skip = team_backoff;
        } else {
            team_backoff = 0;
        }
    }
}

PyDoc_STRVAR(team_stats_doc,
"team_stats(late_ns=None)\n--\n\n"
"Counters of the automatic thread policy (``threads=0``) in this process: ``team`` calls\n"
"run by an OpenMP team, ``late`` of those whose last member started more than ``late_ns``\n"
"after the call (then the next ``skip`` calls with work for a team run on the calling\n"
"thread, ``backoff`` the current length), ``light`` calls on the calling thread (too little\n"
"work, or no team), ``skipped`` calls on the calling thread after a late team, ``empty``\n"
"calls with nothing to mask,\n"
"``last_lateness_ns``. ``late_ns`` given: sets the threshold first (tests, tuning).");

static PyObject *team_stats(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *late_obj = Py_None;
    if (!PyArg_ParseTuple(args, "|O", &late_obj)) return NULL;
    if (late_obj != Py_None) {
        long long value = PyLong_AsLongLong(late_obj);
        if (value == -1 && PyErr_Occurred()) return NULL;
        if (value < 0) {
            PyErr_Format(PyExc_ValueError, "late_ns must be >= 0, got %lld", value);
            return NULL;
        }
        late_ns = value;
    }
    return Py_BuildValue("{s:K,s:K,s:K,s:K,s:K,s:n,s:n,s:L,s:L}", "team", stat_team,
                         "late", stat_late, "light", stat_light, "skipped", stat_skipped,
                         "empty", stat_empty, "skip", team_skip, "backoff", team_backoff,
                         "late_ns", late_ns, "last_lateness_ns", stat_last_lateness);
}

PyDoc_STRVAR(mask_rows_doc,
"mask_rows(bits, bitmask, rows, bitmask_rows, vocab, neg, threads=0)\n--\n\n"
"Write ``neg`` into ``bits[rows[i], t]`` for every ``t < vocab`` whose bit is clear in\n"
"``bitmask[bitmask_rows[i]]``. ``bits``: the logits as a writable 2-D array of 4- or 2-byte\n"
"items (float32, float16, or any integer view of bfloat16: only the item size is read; rows\n"
"may be strided, columns contiguous); ``bitmask``: 2-D uint32/int32 array\n"
"with contiguous rows; ``rows``/``bitmask_rows``: equal-length contiguous int64 arrays;\n"
"``neg``: the -inf bit pattern. ``threads``: 1 masks on the calling thread, N > 1 in a team of\n"
"N of the process's OpenMP threads, 0 automatic: the calling thread for light work or after\n"
"a late team, else as many as that runtime's default (see team_stats). Returns the number\n"
"of threads that masked (0: nothing to mask). Releases the GIL while masking.");

PyDoc_STRVAR(openmp_runtime_doc,
"openmp_runtime()\n--\n\n"
"The soname of the loaded OpenMP runtime whose threads ``mask_rows`` uses, or None.");

static PyObject *openmp_runtime(PyObject *self, PyObject *unused) {
    (void)self, (void)unused;
    find_openmp();
    if (!omp_runtime) Py_RETURN_NONE;
    return PyUnicode_FromString(omp_runtime);
}

static PyObject *mask_rows(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *bits_obj, *bitmask_obj, *rows_obj, *bitmask_rows_obj;
    Py_ssize_t vocab;
    unsigned long neg;
    int threads = 0;
    if (!PyArg_ParseTuple(args, "OOOOnk|i", &bits_obj, &bitmask_obj, &rows_obj,
                          &bitmask_rows_obj, &vocab, &neg, &threads))
        return NULL;
    if (threads < 0) {
        PyErr_Format(PyExc_ValueError, "threads must be >= 0, got %d", threads);
        return NULL;
    }
    Py_buffer bits = {0}, bitmask = {0}, rows = {0}, bitmask_rows = {0};
    PyObject *result = NULL;
    if (PyObject_GetBuffer(bits_obj, &bits, PyBUF_STRIDES | PyBUF_WRITABLE) < 0) goto done;
    if (PyObject_GetBuffer(bitmask_obj, &bitmask, PyBUF_STRIDES) < 0) goto done;
    if (get_rows(rows_obj, &rows, "rows") < 0) goto done;
    if (get_rows(bitmask_rows_obj, &bitmask_rows, "bitmask_rows") < 0) goto done;

    if (bits.ndim != 2 || (bits.itemsize != 4 && bits.itemsize != 2) ||
        bits.strides[1] != bits.itemsize || bits.strides[0] % bits.itemsize) {
        PyErr_Format(PyExc_ValueError, "bits must be a 2-D array of 2- or 4-byte items with "
                     "contiguous columns, got %d dimensions of %zd-byte items",
                     bits.ndim, bits.itemsize);
        goto done;
    }
    if (bitmask.ndim != 2 || bitmask.itemsize != 4 || bitmask.strides[1] != 4 ||
        bitmask.strides[0] % 4) {
        PyErr_Format(PyExc_ValueError, "bitmask must be a 2-D array of 4-byte words with "
                     "contiguous rows, got %d dimensions of %zd-byte items",
                     bitmask.ndim, bitmask.itemsize);
        goto done;
    }
    Py_ssize_t count = rows.shape[0];
    if (bitmask_rows.shape[0] != count) {
        PyErr_Format(PyExc_ValueError, "rows and bitmask_rows differ in length: %zd vs %zd",
                     count, bitmask_rows.shape[0]);
        goto done;
    }
    if (vocab < 0 || vocab > bits.shape[1] || vocab > bitmask.shape[1] * 32) {
        PyErr_Format(PyExc_ValueError, "vocab %zd must be in [0, %zd] (logits columns) and at "
                     "most %zd (bitmask bits)", vocab, bits.shape[1], bitmask.shape[1] * 32);
        goto done;
    }
    const int64_t *row_of = (const int64_t *)rows.buf;
    const int64_t *mask_row_of = (const int64_t *)bitmask_rows.buf;
    for (Py_ssize_t i = 0; i < count; i++) {
        if (row_of[i] < 0 || row_of[i] >= bits.shape[0] || mask_row_of[i] < 0 ||
            mask_row_of[i] >= bitmask.shape[0]) {
            PyErr_Format(PyExc_IndexError, "row pair %zd is (%lld, %lld), outside the %zd "
                         "logits rows and %zd bitmask rows", i, (long long)row_of[i],
                         (long long)mask_row_of[i], bits.shape[0], bitmask.shape[0]);
            goto done;
        }
    }

    Job job = {(char *)bits.buf, bits.strides[0], bits.itemsize, (const char *)bitmask.buf,
               bitmask.strides[0], row_of, mask_row_of, count, vocab / 32, vocab % 32,
               (vocab + 31) / 32, (uint32_t)neg};
    if (threads != 1) find_openmp();
    int automatic = threads == 0, skip = automatic && team_skip > 0, heavy = 0, used = 1;
    long long lateness = -1;
    Py_BEGIN_ALLOW_THREADS
    if (automatic) {
        Py_ssize_t blocking = count_blocking(&job, PARALLEL_MIN_WORDS);
        heavy = blocking >= PARALLEL_MIN_WORDS;
        used = blocking == 0 ? 0 : !heavy || skip || !gomp_parallel ? 1 : omp_max_threads();
    } else if (threads > 1 && !gomp_parallel) {
        used = 1;
    } else {
        used = threads;
    }
    if (used > 1)
        lateness = run_team(&job, used);
    else if (used == 1)
        run_part(&job, 0, 1);
    Py_END_ALLOW_THREADS
    if (automatic) note_call(used, heavy && skip, lateness);
    result = PyLong_FromLong(used);

done:
    if (bits.obj) PyBuffer_Release(&bits);
    if (bitmask.obj) PyBuffer_Release(&bitmask);
    if (rows.obj) PyBuffer_Release(&rows);
    if (bitmask_rows.obj) PyBuffer_Release(&bitmask_rows);
    return result;
}

static PyMethodDef methods[] = {
    {"mask_rows", mask_rows, METH_VARARGS, mask_rows_doc},
    {"openmp_runtime", openmp_runtime, METH_NOARGS, openmp_runtime_doc},
    {"team_stats", team_stats, METH_VARARGS, team_stats_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_cpu_mask",
    "Compiled CPU kernel of portable_guided (see kernels/host.py).", -1, methods,
};

PyMODINIT_FUNC PyInit__cpu_mask(void) { return PyModule_Create(&module); }
