/*
 * A stand-in HIP runtime (libamdhip64) for CI, where there is no AMD GPU.
 *
 * It exports the HIP runtime functions rocm-safe calls, with the C
 * signatures of ROCm's hip_runtime_api.h (HIP 5.x to 7.x), implemented over
 * host memory: one device ("device" memory is host memory with accounting),
 * copies and memsets done at once (the async forms too), streams, events,
 * modules and functions as validated handles, and kernel launches that are
 * RECORDED, never executed: the function's name, grid, block, dynamic
 * shared memory, stream and argument bytes, packed by the layout a test
 * registered for the kernel (standin_set_kernel_layout, from the code
 * object's metadata) the way the real runtime packs them from the same
 * metadata. So a test sees exactly what the crate asked the runtime for.
 *
 * Build (tests/common/hip_standin.rs does it, once per major):
 *   cc -shared -fPIC -O1 -DSTANDIN_MAJOR=7 -Wl,-soname,libamdhip64.so.7 \
 *      -o libamdhip64.so.7 standin.c -lpthread
 * STANDIN_MAJOR picks hipRuntimeGetVersion's answer and the last-error
 * rules: HIP 7 keeps the last *error* of a thread until hipGetLastError
 * reads it (a later success does not clear it; hipErrorNotReady is not an
 * error); HIP 5 and 6 keep the result of the thread's last call, success
 * included ("HIP API 7.0 changes", hipGetLastError).
 *
 * The device's gfx arch is the one HSA_OVERRIDE_GFX_VERSION names
 * ("11.5.1" -> gfx1151, "9.0.10" -> gfx90a), as ROCr would report it, else
 * gfx1151; hipModuleLoadData takes that arch's entry of an offload bundle
 * (hipErrorNoBinaryForGpu when there is none) and hipModuleGetFunction
 * finds the kernel's descriptor ("<name>.kd") in the ELF symbol table.
 * ROCM_SAFE_STANDIN_DEVICES (default 1; 0 = no device) and
 * ROCM_SAFE_STANDIN_MEM_MB (default 4096) set the device.
 *
 * Control exports for the tests are prefixed standin_ (standin_control.c):
 * injected failures (the Nth call of a function returns a given code, any
 * code, also ones no header defines), call counts, live handles and
 * memory, the recorded launches, and every thread's pending last error.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/syscall.h>

#ifndef STANDIN_MAJOR
#define STANDIN_MAJOR 7
#endif

#if STANDIN_MAJOR == 7
#define STANDIN_VERSION 70125424 /* 7.1.25424 */
#elif STANDIN_MAJOR == 6
#define STANDIN_VERSION 60443482 /* 6.4.43482 */
#elif STANDIN_MAJOR == 5
#define STANDIN_VERSION 50731921 /* 5.7.31921 */
#else
#error "STANDIN_MAJOR must be 5, 6 or 7"
#endif

#define EXPORT __attribute__((visibility("default")))

/* hipError_t: a C enum, passed and returned as int. Values from the header. */
typedef int hipError_t;
enum {
    hipSuccess = 0,
    hipErrorInvalidValue = 1,
    hipErrorOutOfMemory = 2,
    hipErrorInvalidConfiguration = 9,
    hipErrorInvalidMemcpyDirection = 21,
    hipErrorNoDevice = 100,
    hipErrorInvalidDevice = 101,
    hipErrorInvalidImage = 200,
    hipErrorNoBinaryForGpu = 209,
    hipErrorInvalidHandle = 400,
    hipErrorNotFound = 500,
    hipErrorNotReady = 600,
    hipErrorContextIsDestroyed = 709,
    hipErrorHostMemoryAlreadyRegistered = 712,
    hipErrorHostMemoryNotRegistered = 713,
    hipErrorLaunchFailure = 719,
    hipErrorNotSupported = 801,
    hipErrorUnknown = 999,
};

typedef enum hipMemcpyKind {
    hipMemcpyHostToHost = 0,
    hipMemcpyHostToDevice = 1,
    hipMemcpyDeviceToHost = 2,
    hipMemcpyDeviceToDevice = 3,
    hipMemcpyDefault = 4,
} hipMemcpyKind;

#define HIP_LAUNCH_PARAM_BUFFER_POINTER ((void *)0x01)
#define HIP_LAUNCH_PARAM_BUFFER_SIZE ((void *)0x02)
#define HIP_LAUNCH_PARAM_END ((void *)0x03)

#define MAGIC_STREAM 0x5354524du
#define MAGIC_EVENT 0x4556454eu
#define MAGIC_MODULE 0x4d4f4455u
#define MAGIC_FUNCTION 0x46554e43u

typedef struct ihipStream_t {
    unsigned magic;
    int live;
    unsigned flags;
    unsigned id;
} *hipStream_t;

typedef struct ihipEvent_t {
    unsigned magic;
    int live;
    unsigned flags;
    int recorded;
    uint64_t ns;
} *hipEvent_t;

typedef struct ihipModule_t {
    unsigned magic;
    int live;
    unsigned char *image; /* a copy of what was loaded */
    size_t image_len;
    const unsigned char *elf; /* the chosen code object, inside `image` */
    size_t elf_len;
} *hipModule_t;

typedef struct ihipModuleSymbol_t {
    unsigned magic;
    hipModule_t module;
    char name[256];
} *hipFunction_t;

typedef int hipDevice_t;

/* ----- global state (one lock) ----------------------------------------- */

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
#define LOCK() pthread_mutex_lock(&g_lock)
#define UNLOCK() pthread_mutex_unlock(&g_lock)

/* Handles are never freed: a destroyed one stays known, so a second use is
 * told apart from a handle that never existed. */
typedef struct {
    void **v;
    size_t n, cap;
} vec_t;

static int vec_push(vec_t *x, void *p) {
    if (x->n == x->cap) {
        size_t cap = x->cap ? x->cap * 2 : 64;
        void **v = realloc(x->v, cap * sizeof *v);
        if (!v) return -1;
        x->v = v;
        x->cap = cap;
    }
    x->v[x->n++] = p;
    return 0;
}

static int vec_has(const vec_t *x, const void *p) {
    for (size_t i = 0; i < x->n; i++)
        if (x->v[i] == p) return 1;
    return 0;
}

static vec_t g_streams, g_events, g_modules, g_functions;

enum { ALLOC_DEVICE = 1, ALLOC_HOST = 2, ALLOC_REGISTERED = 3 };
typedef struct {
    unsigned char *p;
    size_t len;
    int kind;
} range_t;
static range_t *g_ranges;
static size_t g_nranges, g_capranges;
static size_t g_device_used;

static int range_add(void *p, size_t len, int kind) {
    if (g_nranges == g_capranges) {
        size_t cap = g_capranges ? g_capranges * 2 : 256;
        range_t *r = realloc(g_ranges, cap * sizeof *r);
        if (!r) return -1;
        g_ranges = r;
        g_capranges = cap;
    }
    g_ranges[g_nranges].p = p;
    g_ranges[g_nranges].len = len;
    g_ranges[g_nranges].kind = kind;
    g_nranges++;
    return 0;
}

/* The index of the range starting at p of `kind`, or -1. */
static long range_at(const void *p, int kind) {
    for (size_t i = 0; i < g_nranges; i++)
        if (g_ranges[i].p == p && g_ranges[i].kind == kind) return (long)i;
    return -1;
}

static void range_remove(long i) {
    g_ranges[i] = g_ranges[--g_nranges];
}

/* Whether [p, p + len) lies inside memory the device can access: a device
 * allocation, pinned host memory or a registered range. */
static int device_accessible(const void *p, size_t len) {
    const unsigned char *a = p;
    for (size_t i = 0; i < g_nranges; i++) {
        const range_t *r = &g_ranges[i];
        if (a >= r->p && a <= r->p + r->len && len <= (size_t)(r->p + r->len - a)) return 1;
    }
    return 0;
}

static int g_devices = -1;
static size_t g_total = 0;
static char g_arch[32];

static void config(void) {
    if (g_devices >= 0) return;
    const char *d = getenv("ROCM_SAFE_STANDIN_DEVICES");
    g_devices = d && *d ? atoi(d) : 1;
    if (g_devices < 0) g_devices = 0;
    const char *m = getenv("ROCM_SAFE_STANDIN_MEM_MB");
    g_total = (size_t)(m && *m ? strtoull(m, NULL, 10) : 4096) << 20;
    /* HSA_OVERRIDE_GFX_VERSION=major.minor.stepping, each part decimal;
     * the gfx name writes minor and stepping as one hex digit each. */
    const char *o = getenv("HSA_OVERRIDE_GFX_VERSION");
    unsigned maj, min, step;
    if (o && sscanf(o, "%u.%u.%u", &maj, &min, &step) == 3 && min < 16 && step < 16)
        snprintf(g_arch, sizeof g_arch, "gfx%u%x%x", maj, min, step);
    else
        snprintf(g_arch, sizeof g_arch, "gfx1151");
}

/* ----- calls, injected failures, the last error ------------------------ */

#define MAX_FNS 64
typedef struct {
    const char *name;
    unsigned long calls;
    /* Injected failure: call number `fail_at` (1-based over the function's
     * calls) returns `fail_code`; with `fail_every`, each call from then. */
    unsigned long fail_at;
    int fail_code;
    int fail_every;
} fnstat_t;
static fnstat_t g_fns[MAX_FNS];
static int g_nfns;

static fnstat_t *fn_stat(const char *name) {
    for (int i = 0; i < g_nfns; i++)
        if (strcmp(g_fns[i].name, name) == 0) return &g_fns[i];
    if (g_nfns == MAX_FNS) return NULL;
    g_fns[g_nfns].name = strdup(name);
    return &g_fns[g_nfns++];
}

/* Per-thread last error, kept in a list so that tests can see every live
 * thread's pending error; a thread's entry goes when the thread exits. */
typedef struct tls_err {
    hipError_t err;
    long tid;
    struct tls_err *next, *prev;
} tls_err_t;
static pthread_key_t g_key;
static pthread_once_t g_key_once = PTHREAD_ONCE_INIT;
static tls_err_t *g_errs;

static void tls_gone(void *p) {
    tls_err_t *t = p;
    LOCK();
    if (t->prev) t->prev->next = t->next;
    else g_errs = t->next;
    if (t->next) t->next->prev = t->prev;
    UNLOCK();
    free(t);
}
static void key_init(void) { pthread_key_create(&g_key, tls_gone); }

/* Called with the lock held. */
static tls_err_t *tls_locked(void) {
    pthread_once(&g_key_once, key_init);
    tls_err_t *t = pthread_getspecific(g_key);
    if (!t) {
        t = calloc(1, sizeof *t);
        if (!t) return NULL;
        t->tid = (long)syscall(SYS_gettid);
        t->next = g_errs;
        if (g_errs) g_errs->prev = t;
        g_errs = t;
        pthread_setspecific(g_key, t);
    }
    return t;
}

/* Records a call's result as HIP of STANDIN_MAJOR does; lock held. */
static hipError_t result_locked(hipError_t e) {
    tls_err_t *t = tls_locked();
    if (!t) return e;
#if STANDIN_MAJOR >= 7
    if (e != hipSuccess && e != hipErrorNotReady) t->err = e;
#else
    t->err = e;
#endif
    return e;
}

/* Entry of every runtime function: counts the call and answers an injected
 * failure. Returns with the lock held and *out = hipSuccess, or with the
 * lock released and *out = the injected code (already recorded). */
static int enter(const char *name, hipError_t *out) {
    LOCK();
    config();
    fnstat_t *s = fn_stat(name);
    *out = hipSuccess;
    if (!s) return 0;
    s->calls++;
    if (s->fail_at && (s->calls == s->fail_at || (s->fail_every && s->calls > s->fail_at))) {
        *out = result_locked(s->fail_code);
        UNLOCK();
        return 1;
    }
    return 0;
}

#define ENTER(name)                                                                           \
    hipError_t injected_;                                                                     \
    if (enter(name, &injected_)) return injected_;
#define RETURN(e)                                                                             \
    do {                                                                                      \
        hipError_t r_ = result_locked(e);                                                     \
        UNLOCK();                                                                             \
        return r_;                                                                            \
    } while (0)

static __thread int t_device;

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* NULL is the null stream; hipStreamPerThread ((hipStream_t)2) is valid too. */
static hipError_t check_stream(hipStream_t s) {
    if (s == NULL || s == (hipStream_t)2) return hipSuccess;
    if (!vec_has(&g_streams, s)) return hipErrorInvalidHandle;
    return s->live ? hipSuccess : hipErrorContextIsDestroyed;
}

static hipError_t check_event(hipEvent_t e) {
    if (e == NULL || !vec_has(&g_events, e)) return hipErrorInvalidHandle;
    return e->live ? hipSuccess : hipErrorContextIsDestroyed;
}

/* ----- the exports ------------------------------------------------------- */

/* The runtime functions and the control exports, in parts of this one
 * translation unit (each part's statics stay private to the library). */
#include "standin_runtime.c"
#include "standin_modules.c"
#include "standin_control.c"
