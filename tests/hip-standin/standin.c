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
 * Control exports for the tests are prefixed standin_ (bottom of file):
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

/* ----- devices, versions ------------------------------------------------ */

EXPORT hipError_t hipInit(unsigned int flags) {
    ENTER("hipInit");
    RETURN(flags == 0 ? hipSuccess : hipErrorInvalidValue);
}

EXPORT hipError_t hipGetDeviceCount(int *count) {
    ENTER("hipGetDeviceCount");
    if (!count) RETURN(hipErrorInvalidValue);
    *count = g_devices;
    RETURN(g_devices > 0 ? hipSuccess : hipErrorNoDevice);
}

EXPORT hipError_t hipSetDevice(int deviceId) {
    ENTER("hipSetDevice");
    if (g_devices == 0) RETURN(hipErrorNoDevice);
    if (deviceId < 0 || deviceId >= g_devices) RETURN(hipErrorInvalidDevice);
    t_device = deviceId;
    RETURN(hipSuccess);
}

EXPORT hipError_t hipGetDevice(int *deviceId) {
    ENTER("hipGetDevice");
    if (!deviceId) RETURN(hipErrorInvalidValue);
    if (g_devices == 0) RETURN(hipErrorNoDevice);
    *deviceId = t_device;
    RETURN(hipSuccess);
}

EXPORT hipError_t hipDeviceSynchronize(void) {
    ENTER("hipDeviceSynchronize");
    RETURN(g_devices > 0 ? hipSuccess : hipErrorNoDevice);
}

static hipError_t check_ordinal(int o) {
    if (g_devices == 0) return hipErrorNoDevice;
    return o >= 0 && o < g_devices ? hipSuccess : hipErrorInvalidDevice;
}

EXPORT hipError_t hipDeviceGetName(char *name, int len, hipDevice_t device) {
    ENTER("hipDeviceGetName");
    hipError_t e = check_ordinal(device);
    if (e) RETURN(e);
    if (!name || len <= 0) RETURN(hipErrorInvalidValue);
    snprintf(name, (size_t)len, "rocm-safe stand-in HIP %d device %d (%s)", STANDIN_MAJOR,
             device, g_arch);
    RETURN(hipSuccess);
}

EXPORT hipError_t hipDeviceTotalMem(size_t *bytes, hipDevice_t device) {
    ENTER("hipDeviceTotalMem");
    hipError_t e = check_ordinal(device);
    if (e) RETURN(e);
    if (!bytes) RETURN(hipErrorInvalidValue);
    *bytes = g_total;
    RETURN(hipSuccess);
}

EXPORT hipError_t hipDeviceGetPCIBusId(char *pciBusId, int len, int device) {
    ENTER("hipDeviceGetPCIBusId");
    hipError_t e = check_ordinal(device);
    if (e) RETURN(e);
    if (!pciBusId || len <= 0) RETURN(hipErrorInvalidValue);
    snprintf(pciBusId, (size_t)len, "0000:%02x:00.0", (unsigned)(0xc3 + device));
    RETURN(hipSuccess);
}

EXPORT hipError_t hipMemGetInfo(size_t *free_bytes, size_t *total) {
    ENTER("hipMemGetInfo");
    if (g_devices == 0) RETURN(hipErrorNoDevice);
    if (!free_bytes || !total) RETURN(hipErrorInvalidValue);
    *total = g_total;
    *free_bytes = g_total - g_device_used;
    RETURN(hipSuccess);
}

EXPORT hipError_t hipRuntimeGetVersion(int *runtimeVersion) {
    ENTER("hipRuntimeGetVersion");
    if (!runtimeVersion) RETURN(hipErrorInvalidValue);
    *runtimeVersion = STANDIN_VERSION;
    RETURN(hipSuccess);
}

EXPORT hipError_t hipDriverGetVersion(int *driverVersion) {
    ENTER("hipDriverGetVersion");
    if (!driverVersion) RETURN(hipErrorInvalidValue);
    *driverVersion = STANDIN_VERSION;
    RETURN(hipSuccess);
}

/* ----- errors ------------------------------------------------------------ */

EXPORT hipError_t hipGetLastError(void) {
    LOCK();
    config();
    fnstat_t *s = fn_stat("hipGetLastError");
    if (s) s->calls++;
    tls_err_t *t = tls_locked();
    hipError_t e = t ? t->err : hipSuccess;
    if (t) t->err = hipSuccess;
    UNLOCK();
    return e;
}

EXPORT hipError_t hipExtGetLastError(void) { return hipGetLastError(); }

EXPORT hipError_t hipPeekAtLastError(void) {
    LOCK();
    config();
    fnstat_t *s = fn_stat("hipPeekAtLastError");
    if (s) s->calls++;
    tls_err_t *t = tls_locked();
    hipError_t e = t ? t->err : hipSuccess;
    UNLOCK();
    return e;
}

static const char *error_name(hipError_t e) {
    switch (e) {
    case hipSuccess: return "hipSuccess";
    case hipErrorInvalidValue: return "hipErrorInvalidValue";
    case hipErrorOutOfMemory: return "hipErrorOutOfMemory";
    case hipErrorInvalidConfiguration: return "hipErrorInvalidConfiguration";
    case hipErrorInvalidMemcpyDirection: return "hipErrorInvalidMemcpyDirection";
    case hipErrorNoDevice: return "hipErrorNoDevice";
    case hipErrorInvalidDevice: return "hipErrorInvalidDevice";
    case hipErrorInvalidImage: return "hipErrorInvalidImage";
    case hipErrorNoBinaryForGpu: return "hipErrorNoBinaryForGpu";
    case hipErrorInvalidHandle: return "hipErrorInvalidHandle";
    case hipErrorNotFound: return "hipErrorNotFound";
    case hipErrorNotReady: return "hipErrorNotReady";
    case hipErrorContextIsDestroyed: return "hipErrorContextIsDestroyed";
    case hipErrorHostMemoryAlreadyRegistered: return "hipErrorHostMemoryAlreadyRegistered";
    case hipErrorHostMemoryNotRegistered: return "hipErrorHostMemoryNotRegistered";
    case hipErrorLaunchFailure: return "hipErrorLaunchFailure";
    case hipErrorNotSupported: return "hipErrorNotSupported";
    case hipErrorUnknown: return "hipErrorUnknown";
    default: return NULL;
    }
}

/* As the real runtime: a name for every code it knows, "unknown error"
 * (and hipErrorUnknown's name) for the others. */
EXPORT const char *hipGetErrorName(hipError_t e) {
    const char *n = error_name(e);
    return n ? n : "hipErrorUnknown";
}

EXPORT const char *hipGetErrorString(hipError_t e) {
    switch (e) {
    case hipSuccess: return "no error";
    case hipErrorInvalidValue: return "invalid argument";
    case hipErrorOutOfMemory: return "out of memory";
    case hipErrorNoDevice: return "no ROCm-capable device is detected";
    case hipErrorInvalidDevice: return "invalid device ordinal";
    case hipErrorInvalidHandle: return "invalid resource handle";
    case hipErrorNotFound: return "named symbol not found";
    case hipErrorNoBinaryForGpu: return "no kernel image is available for execution on the device";
    case hipErrorContextIsDestroyed: return "context is destroyed";
    default: return error_name(e) ? error_name(e) : "unknown error";
    }
}

/* ----- memory ------------------------------------------------------------ */

static void *alloc_aligned(size_t bytes) {
    size_t rounded = (bytes + 255) & ~(size_t)255;
    if (rounded < bytes) return NULL;
    return aligned_alloc(256, rounded);
}

EXPORT hipError_t hipMalloc(void **ptr, size_t size) {
    ENTER("hipMalloc");
    if (!ptr) RETURN(hipErrorInvalidValue);
    if (g_devices == 0) RETURN(hipErrorNoDevice);
    if (size == 0) {
        *ptr = NULL;
        RETURN(hipSuccess);
    }
    if (size > g_total - g_device_used) RETURN(hipErrorOutOfMemory);
    void *p = alloc_aligned(size);
    if (!p || range_add(p, size, ALLOC_DEVICE)) {
        free(p);
        RETURN(hipErrorOutOfMemory);
    }
    /* Device memory is not zeroed: fill it with a pattern no kernel output
     * is likely to match, so that work that never ran cannot look done. */
    memset(p, 0xA5, size);
    g_device_used += size;
    *ptr = p;
    RETURN(hipSuccess);
}

EXPORT hipError_t hipFree(void *ptr) {
    ENTER("hipFree");
    if (!ptr) RETURN(hipSuccess);
    long i = range_at(ptr, ALLOC_DEVICE);
    if (i < 0) RETURN(hipErrorInvalidValue);
    g_device_used -= g_ranges[i].len;
    range_remove(i);
    free(ptr);
    RETURN(hipSuccess);
}

EXPORT hipError_t hipHostMalloc(void **ptr, size_t size, unsigned int flags) {
    ENTER("hipHostMalloc");
    (void)flags;
    if (!ptr) RETURN(hipErrorInvalidValue);
    if (size == 0) {
        *ptr = NULL;
        RETURN(hipSuccess);
    }
    void *p = alloc_aligned(size);
    if (!p || range_add(p, size, ALLOC_HOST)) {
        free(p);
        RETURN(hipErrorOutOfMemory);
    }
    memset(p, 0x5A, size);
    *ptr = p;
    RETURN(hipSuccess);
}

EXPORT hipError_t hipHostFree(void *ptr) {
    ENTER("hipHostFree");
    if (!ptr) RETURN(hipSuccess);
    long i = range_at(ptr, ALLOC_HOST);
    if (i < 0) RETURN(hipErrorInvalidValue);
    range_remove(i);
    free(ptr);
    RETURN(hipSuccess);
}

EXPORT hipError_t hipHostRegister(void *hostPtr, size_t sizeBytes, unsigned int flags) {
    ENTER("hipHostRegister");
    (void)flags;
    if (!hostPtr || sizeBytes == 0) RETURN(hipErrorInvalidValue);
    const unsigned char *a = hostPtr;
    for (size_t i = 0; i < g_nranges; i++) {
        const range_t *r = &g_ranges[i];
        if (r->kind == ALLOC_REGISTERED && a < r->p + r->len && r->p < a + sizeBytes)
            RETURN(hipErrorHostMemoryAlreadyRegistered);
    }
    if (range_add(hostPtr, sizeBytes, ALLOC_REGISTERED)) RETURN(hipErrorOutOfMemory);
    RETURN(hipSuccess);
}

EXPORT hipError_t hipHostUnregister(void *hostPtr) {
    ENTER("hipHostUnregister");
    long i = range_at(hostPtr, ALLOC_REGISTERED);
    if (!hostPtr || i < 0) RETURN(hipErrorHostMemoryNotRegistered);
    range_remove(i);
    RETURN(hipSuccess);
}

static unsigned long long g_copy_bytes[5];

EXPORT hipError_t hipMemcpyAsync(void *dst, const void *src, size_t sizeBytes, hipMemcpyKind kind,
                                 hipStream_t stream) {
    ENTER("hipMemcpyAsync");
    hipError_t e = check_stream(stream);
    if (e) RETURN(e);
    if ((unsigned)kind > hipMemcpyDefault) RETURN(hipErrorInvalidMemcpyDirection);
    if (sizeBytes == 0) RETURN(hipSuccess);
    if (!dst || !src) RETURN(hipErrorInvalidValue);
    int dst_dev = kind == hipMemcpyHostToDevice || kind == hipMemcpyDeviceToDevice;
    int src_dev = kind == hipMemcpyDeviceToHost || kind == hipMemcpyDeviceToDevice;
    if ((dst_dev && !device_accessible(dst, sizeBytes)) ||
        (src_dev && !device_accessible(src, sizeBytes)))
        RETURN(hipErrorInvalidValue);
    g_copy_bytes[kind] += sizeBytes;
    UNLOCK();
    memmove(dst, src, sizeBytes);
    LOCK();
    RETURN(hipSuccess);
}

EXPORT hipError_t hipMemsetAsync(void *dst, int value, size_t sizeBytes, hipStream_t stream) {
    ENTER("hipMemsetAsync");
    hipError_t e = check_stream(stream);
    if (e) RETURN(e);
    if (sizeBytes == 0) RETURN(hipSuccess);
    if (!dst || !device_accessible(dst, sizeBytes)) RETURN(hipErrorInvalidValue);
    UNLOCK();
    memset(dst, value, sizeBytes);
    LOCK();
    RETURN(hipSuccess);
}

/* ----- streams and events ------------------------------------------------ */

static unsigned g_next_stream_id = 1;

EXPORT hipError_t hipStreamCreateWithFlags(hipStream_t *stream, unsigned int flags) {
    ENTER("hipStreamCreateWithFlags");
    if (!stream || flags > 1) RETURN(hipErrorInvalidValue);
    if (g_devices == 0) RETURN(hipErrorNoDevice);
    hipStream_t s = calloc(1, sizeof *s);
    if (!s || vec_push(&g_streams, s)) {
        free(s);
        RETURN(hipErrorOutOfMemory);
    }
    s->magic = MAGIC_STREAM;
    s->live = 1;
    s->flags = flags;
    s->id = g_next_stream_id++;
    *stream = s;
    RETURN(hipSuccess);
}

EXPORT hipError_t hipStreamDestroy(hipStream_t stream) {
    ENTER("hipStreamDestroy");
    if (stream == NULL) RETURN(hipErrorInvalidHandle);
    hipError_t e = check_stream(stream);
    if (e) RETURN(e);
    stream->live = 0;
    RETURN(hipSuccess);
}

EXPORT hipError_t hipStreamSynchronize(hipStream_t stream) {
    ENTER("hipStreamSynchronize");
    RETURN(check_stream(stream));
}

EXPORT hipError_t hipStreamWaitEvent(hipStream_t stream, hipEvent_t event, unsigned int flags) {
    ENTER("hipStreamWaitEvent");
    hipError_t e = check_stream(stream);
    if (!e) e = check_event(event);
    if (!e && flags != 0) e = hipErrorInvalidValue;
    RETURN(e);
}

EXPORT hipError_t hipEventCreateWithFlags(hipEvent_t *event, unsigned flags) {
    ENTER("hipEventCreateWithFlags");
    if (!event) RETURN(hipErrorInvalidValue);
    hipEvent_t ev = calloc(1, sizeof *ev);
    if (!ev || vec_push(&g_events, ev)) {
        free(ev);
        RETURN(hipErrorOutOfMemory);
    }
    ev->magic = MAGIC_EVENT;
    ev->live = 1;
    ev->flags = flags;
    *event = ev;
    RETURN(hipSuccess);
}

EXPORT hipError_t hipEventCreate(hipEvent_t *event) { return hipEventCreateWithFlags(event, 0); }

EXPORT hipError_t hipEventDestroy(hipEvent_t event) {
    ENTER("hipEventDestroy");
    hipError_t e = check_event(event);
    if (e) RETURN(e);
    event->live = 0;
    RETURN(hipSuccess);
}

EXPORT hipError_t hipEventRecord(hipEvent_t event, hipStream_t stream) {
    ENTER("hipEventRecord");
    hipError_t e = check_event(event);
    if (!e) e = check_stream(stream);
    if (e) RETURN(e);
    event->recorded = 1;
    event->ns = now_ns();
    RETURN(hipSuccess);
}

EXPORT hipError_t hipEventSynchronize(hipEvent_t event) {
    ENTER("hipEventSynchronize");
    RETURN(check_event(event));
}

EXPORT hipError_t hipEventQuery(hipEvent_t event) {
    ENTER("hipEventQuery");
    RETURN(check_event(event));
}

#define hipEventDisableTiming 0x2u
EXPORT hipError_t hipEventElapsedTime(float *ms, hipEvent_t start, hipEvent_t stop) {
    ENTER("hipEventElapsedTime");
    if (!ms) RETURN(hipErrorInvalidValue);
    hipError_t e = check_event(start);
    if (!e) e = check_event(stop);
    if (e) RETURN(e);
    if ((start->flags | stop->flags) & hipEventDisableTiming) RETURN(hipErrorInvalidHandle);
    if (!start->recorded || !stop->recorded) RETURN(hipErrorInvalidHandle);
    *ms = (float)((double)(int64_t)(stop->ns - start->ns) / 1e6);
    RETURN(hipSuccess);
}

/* ----- modules ----------------------------------------------------------- */

static uint64_t rd64(const unsigned char *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}
static uint32_t rd32(const unsigned char *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}
static uint16_t rd16(const unsigned char *p) {
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}

#define BUNDLE_MAGIC "__CLANG_OFFLOAD_BUNDLE__"
#define EM_AMDGPU 224
/* A code object larger than this is taken as malformed. */
#define MAX_IMAGE ((uint64_t)1 << 30)

/* Length of an ELF image from its header: the end of its section headers
 * or of its last section, whichever is later (0 if malformed). */
static size_t elf_len(const unsigned char *e) {
    if (memcmp(e, "\x7f" "ELF", 4) != 0 || e[4] != 2 || e[5] != 1) return 0;
    if (rd16(e + 18) != EM_AMDGPU) return 0;
    uint64_t shoff = rd64(e + 0x28);
    uint16_t shentsize = rd16(e + 0x3a), shnum = rd16(e + 0x3c);
    if (shentsize < 64 || shoff > MAX_IMAGE) return 0;
    uint64_t end = shoff + (uint64_t)shentsize * shnum;
    for (unsigned i = 0; i < shnum; i++) {
        const unsigned char *sh = e + shoff + (uint64_t)i * shentsize;
        uint32_t type = rd32(sh + 4);
        uint64_t off = rd64(sh + 0x18), size = rd64(sh + 0x20);
        if (type == 8 /* SHT_NOBITS */) continue;
        if (off > MAX_IMAGE || size > MAX_IMAGE) return 0;
        if (off + size > end) end = off + size;
    }
    return end > MAX_IMAGE ? 0 : (size_t)end;
}

/* Whether a bundle entry id (hipv4-amdgcn-amd-amdhsa--gfx1151:xnack-) is
 * a code object for `arch`. */
static int entry_is_for(const char *id, size_t id_len, const char *arch) {
    const char *end = id + id_len;
    const char *t = NULL;
    for (const char *p = id; p + 1 < end; p++)
        if (p[0] == '-' && p[1] == '-') t = p + 2;
    if (!t || !memmem(id, id_len, "amdgcn", 6)) return 0;
    size_t n = strlen(arch);
    return (size_t)(end - t) >= n && memcmp(t, arch, n) == 0 &&
           (t + n == end || t[n] == ':');
}

EXPORT hipError_t hipModuleLoadData(hipModule_t *module, const void *image) {
    ENTER("hipModuleLoadData");
    if (!module || !image) RETURN(hipErrorInvalidValue);
    if (g_devices == 0) RETURN(hipErrorNoDevice);
    const unsigned char *b = image;
    size_t total = 0, elf_off = 0, elf_size = 0;
    if (memcmp(b, BUNDLE_MAGIC, 24) == 0) {
        uint64_t n = rd64(b + 24), at = 32;
        int found = 0;
        if (n > 4096) RETURN(hipErrorInvalidImage);
        for (uint64_t i = 0; i < n; i++) {
            uint64_t off = rd64(b + at), size = rd64(b + at + 8), id_len = rd64(b + at + 16);
            if (off > MAX_IMAGE || size > MAX_IMAGE || id_len > 4096) RETURN(hipErrorInvalidImage);
            if (off + size > total) total = (size_t)(off + size);
            if (!found && entry_is_for((const char *)b + at + 24, id_len, g_arch)) {
                elf_off = off;
                elf_size = size;
                found = 1;
            }
            at += 24 + id_len;
        }
        if (at > total) total = at;
        if (!found) RETURN(hipErrorNoBinaryForGpu);
        if (elf_len(b + elf_off) == 0) RETURN(hipErrorInvalidImage);
    } else {
        total = elf_len(b);
        if (total == 0) RETURN(hipErrorInvalidImage);
        elf_size = total;
    }
    hipModule_t m = calloc(1, sizeof *m);
    unsigned char *copy = malloc(total);
    if (!m || !copy || vec_push(&g_modules, m)) {
        free(m);
        free(copy);
        RETURN(hipErrorOutOfMemory);
    }
    memcpy(copy, b, total);
    m->magic = MAGIC_MODULE;
    m->live = 1;
    m->image = copy;
    m->image_len = total;
    m->elf = copy + elf_off;
    m->elf_len = elf_size;
    *module = m;
    RETURN(hipSuccess);
}

static hipError_t check_module(hipModule_t m) {
    if (!m || !vec_has(&g_modules, m)) return hipErrorInvalidHandle;
    return m->live ? hipSuccess : hipErrorContextIsDestroyed;
}

EXPORT hipError_t hipModuleUnload(hipModule_t module) {
    ENTER("hipModuleUnload");
    hipError_t e = check_module(module);
    if (e) RETURN(e);
    module->live = 0;
    RETURN(hipSuccess);
}

/* Whether the ELF's symbol table holds `sym`. */
static int elf_has_symbol(const unsigned char *e, size_t len, const char *sym) {
    uint64_t shoff = rd64(e + 0x28);
    uint16_t shentsize = rd16(e + 0x3a), shnum = rd16(e + 0x3c);
    for (unsigned i = 0; i < shnum; i++) {
        const unsigned char *sh = e + shoff + (uint64_t)i * shentsize;
        uint32_t type = rd32(sh + 4);
        if (type != 2 /* SHT_SYMTAB */ && type != 11 /* SHT_DYNSYM */) continue;
        uint32_t link = rd32(sh + 0x28);
        if (link >= shnum) continue;
        const unsigned char *str = e + shoff + (uint64_t)link * shentsize;
        uint64_t off = rd64(sh + 0x18), size = rd64(sh + 0x20);
        uint64_t soff = rd64(str + 0x18), ssize = rd64(str + 0x20);
        if (off + size > len || soff + ssize > len) continue;
        for (uint64_t s = 0; s + 24 <= size; s += 24) {
            uint32_t name = rd32(e + off + s);
            if (name >= ssize) continue;
            const char *n = (const char *)e + soff + name;
            if (strnlen(n, ssize - name) < ssize - name && strcmp(n, sym) == 0) return 1;
        }
    }
    return 0;
}

EXPORT hipError_t hipModuleGetFunction(hipFunction_t *function, hipModule_t module,
                                       const char *kname) {
    ENTER("hipModuleGetFunction");
    if (!function || !kname) RETURN(hipErrorInvalidValue);
    hipError_t e = check_module(module);
    if (e) RETURN(e);
    char kd[300];
    if (strlen(kname) >= 256) RETURN(hipErrorInvalidValue);
    snprintf(kd, sizeof kd, "%s.kd", kname);
    if (!elf_has_symbol(module->elf, module->elf_len, kd)) RETURN(hipErrorNotFound);
    hipFunction_t f = calloc(1, sizeof *f);
    if (!f || vec_push(&g_functions, f)) {
        free(f);
        RETURN(hipErrorOutOfMemory);
    }
    f->magic = MAGIC_FUNCTION;
    f->module = module;
    snprintf(f->name, sizeof f->name, "%s", kname);
    *function = f;
    RETURN(hipSuccess);
}

/* ----- launches ---------------------------------------------------------- */

#define MAX_ARGS 32
typedef struct {
    char name[256];
    unsigned count;
    size_t *sizes, *offsets;
    unsigned char pointer[MAX_ARGS]; /* argument i is a device address */
} layout_t;
static layout_t *g_layouts;
static size_t g_nlayouts;

typedef struct {
    char name[256];
    unsigned grid[3], block[3], shared;
    unsigned stream_id; /* 0: the null stream */
    int packed;         /* 1: kernelParams by a layout, 2: extra's buffer, 0: none */
    /* Per argument of a layout that is a device address: 1 null, 2 inside
     * memory the device can access at launch time, 3 anywhere else. */
    unsigned char pointer[MAX_ARGS];
    unsigned char *args;
    size_t args_len;
} launch_t;
static launch_t *g_launches;
static size_t g_nlaunches, g_caplaunches;

static const layout_t *layout_for(const char *name) {
    for (size_t i = 0; i < g_nlayouts; i++)
        if (strcmp(g_layouts[i].name, name) == 0) return &g_layouts[i];
    return NULL;
}

EXPORT hipError_t hipModuleLaunchKernel(hipFunction_t f, unsigned int gridDimX,
                                        unsigned int gridDimY, unsigned int gridDimZ,
                                        unsigned int blockDimX, unsigned int blockDimY,
                                        unsigned int blockDimZ, unsigned int sharedMemBytes,
                                        hipStream_t stream, void **kernelParams, void **extra) {
    ENTER("hipModuleLaunchKernel");
    if (!f || !vec_has(&g_functions, f)) RETURN(hipErrorInvalidHandle);
    if (!f->module->live) RETURN(hipErrorContextIsDestroyed);
    hipError_t e = check_stream(stream);
    if (e) RETURN(e);
    if (!gridDimX || !gridDimY || !gridDimZ || !blockDimX || !blockDimY || !blockDimZ)
        RETURN(hipErrorInvalidValue);
    if ((uint64_t)blockDimX * blockDimY * blockDimZ > 1024) RETURN(hipErrorInvalidValue);
    /* HIP's limit: at most 2^32 - 1 work-items per dimension. */
    if ((uint64_t)gridDimX * blockDimX > UINT32_MAX || (uint64_t)gridDimY * blockDimY > UINT32_MAX ||
        (uint64_t)gridDimZ * blockDimZ > UINT32_MAX)
        RETURN(hipErrorInvalidConfiguration);
    if (kernelParams && extra) RETURN(hipErrorInvalidValue);
    launch_t l;
    memset(&l, 0, sizeof l);
    snprintf(l.name, sizeof l.name, "%s", f->name);
    l.grid[0] = gridDimX, l.grid[1] = gridDimY, l.grid[2] = gridDimZ;
    l.block[0] = blockDimX, l.block[1] = blockDimY, l.block[2] = blockDimZ;
    l.shared = sharedMemBytes;
    l.stream_id = stream && stream != (hipStream_t)2 ? stream->id : 0;
    if (kernelParams) {
        const layout_t *lay = layout_for(f->name);
        if (lay) {
            size_t len = 0;
            for (unsigned i = 0; i < lay->count; i++)
                if (lay->offsets[i] + lay->sizes[i] > len) len = lay->offsets[i] + lay->sizes[i];
            l.args = calloc(1, len ? len : 1);
            if (!l.args) RETURN(hipErrorOutOfMemory);
            for (unsigned i = 0; i < lay->count; i++) {
                if (!kernelParams[i]) {
                    free(l.args);
                    RETURN(hipErrorInvalidValue);
                }
                memcpy(l.args + lay->offsets[i], kernelParams[i], lay->sizes[i]);
                if (lay->pointer[i] && lay->sizes[i] == 8) {
                    void *a;
                    memcpy(&a, kernelParams[i], 8);
                    l.pointer[i] = !a ? 1 : device_accessible(a, 1) ? 2 : 3;
                }
            }
            l.args_len = len;
            l.packed = 1;
        }
    } else if (extra) {
        void *buf = NULL;
        size_t *size = NULL;
        for (int i = 0; extra[i] != HIP_LAUNCH_PARAM_END; i += 2) {
            if (i > 8) RETURN(hipErrorInvalidValue);
            if (extra[i] == HIP_LAUNCH_PARAM_BUFFER_POINTER) buf = extra[i + 1];
            else if (extra[i] == HIP_LAUNCH_PARAM_BUFFER_SIZE) size = extra[i + 1];
            else RETURN(hipErrorInvalidValue);
        }
        if (!buf || !size) RETURN(hipErrorInvalidValue);
        l.args = malloc(*size ? *size : 1);
        if (!l.args) RETURN(hipErrorOutOfMemory);
        memcpy(l.args, buf, *size);
        l.args_len = *size;
        l.packed = 2;
    }
    if (g_nlaunches == g_caplaunches) {
        size_t cap = g_caplaunches ? g_caplaunches * 2 : 256;
        launch_t *v = realloc(g_launches, cap * sizeof *v);
        if (!v) {
            free(l.args);
            RETURN(hipErrorOutOfMemory);
        }
        g_launches = v;
        g_caplaunches = cap;
    }
    g_launches[g_nlaunches++] = l;
    RETURN(hipSuccess);
}

/* ===== control exports for tests ========================================= */

/* The HIP major this library was built as. */
EXPORT int standin_major(void) { return STANDIN_MAJOR; }

/* The device's gfx arch ("gfx1151"). */
EXPORT const char *standin_arch(void) {
    LOCK();
    config();
    UNLOCK();
    return g_arch;
}

/* Call number `nth` (1-based, counted over all of the function's calls,
 * past ones included) of `fn` returns `code`; with `every`, each call from
 * then on too. nth = 0 clears the function's fault. */
EXPORT int standin_fail_call(const char *fn, unsigned long nth, int code, int every) {
    LOCK();
    fnstat_t *s = fn_stat(fn);
    if (s) {
        s->fail_at = nth;
        s->fail_code = code;
        s->fail_every = every;
    }
    UNLOCK();
    return s ? 0 : -1;
}

/* How many times `fn` was called (injected failures included). */
EXPORT unsigned long standin_call_count(const char *fn) {
    LOCK();
    fnstat_t *s = fn_stat(fn);
    unsigned long n = s ? s->calls : 0;
    UNLOCK();
    return n;
}

/* The calling thread's pending last error, without clearing it. */
EXPORT int standin_thread_last_error(void) {
    LOCK();
    tls_err_t *t = tls_locked();
    int e = t ? t->err : 0;
    UNLOCK();
    return e;
}

/* Live threads holding a pending error: the first one's code (0 if none)
 * and, in *threads, how many. */
EXPORT int standin_pending_errors(int *threads) {
    LOCK();
    int first = 0, n = 0;
    for (tls_err_t *t = g_errs; t; t = t->next)
        if (t->err) {
            if (!first) first = t->err;
            n++;
        }
    UNLOCK();
    if (threads) *threads = n;
    return first;
}

/* Live resources: 0 device allocations, 1 device bytes, 2 pinned host
 * allocations, 3 registered ranges, 4 streams, 5 events, 6 modules. */
EXPORT unsigned long standin_live(int what) {
    unsigned long n = 0;
    LOCK();
    switch (what) {
    case 0:
    case 2:
    case 3:
        for (size_t i = 0; i < g_nranges; i++)
            n += g_ranges[i].kind == (what == 0 ? ALLOC_DEVICE : what == 2 ? ALLOC_HOST : ALLOC_REGISTERED);
        break;
    case 1: n = g_device_used; break;
    case 4:
        for (size_t i = 0; i < g_streams.n; i++) n += ((hipStream_t)g_streams.v[i])->live;
        break;
    case 5:
        for (size_t i = 0; i < g_events.n; i++) n += ((hipEvent_t)g_events.v[i])->live;
        break;
    case 6:
        for (size_t i = 0; i < g_modules.n; i++) n += ((hipModule_t)g_modules.v[i])->live;
        break;
    }
    UNLOCK();
    return n;
}

/* Bytes copied by hipMemcpyAsync with `kind`. */
EXPORT unsigned long long standin_copied_bytes(int kind) {
    LOCK();
    unsigned long long n = kind >= 0 && kind <= 4 ? g_copy_bytes[kind] : 0;
    UNLOCK();
    return n;
}

/* The image a live module was loaded from: the whole image and the code
 * object chosen for the device. Index over modules ever loaded. */
EXPORT int standin_module_image(size_t index, const unsigned char **image, size_t *image_len,
                                const unsigned char **elf, size_t *elf_len_out) {
    LOCK();
    int ok = index < g_modules.n;
    if (ok) {
        hipModule_t m = g_modules.v[index];
        *image = m->image;
        *image_len = m->image_len;
        *elf = m->elf;
        *elf_len_out = m->elf_len;
    }
    UNLOCK();
    return ok ? 0 : -1;
}

/* Registers how `name`'s explicit arguments are packed: argument i is
 * sizes[i] bytes at offsets[i] of the kernel's argument segment, and a
 * device address where pointer[i] is not 0 (pointer may be NULL). */
EXPORT int standin_set_kernel_layout(const char *name, unsigned count, const size_t *sizes,
                                     const size_t *offsets, const unsigned char *pointer) {
    if (!name || strlen(name) >= 256 || count > MAX_ARGS) return -1;
    LOCK();
    layout_t *l = (layout_t *)layout_for(name);
    if (!l) {
        layout_t *v = realloc(g_layouts, (g_nlayouts + 1) * sizeof *v);
        if (!v) {
            UNLOCK();
            return -1;
        }
        g_layouts = v;
        l = &g_layouts[g_nlayouts++];
        memset(l, 0, sizeof *l);
        snprintf(l->name, sizeof l->name, "%s", name);
    }
    free(l->sizes);
    free(l->offsets);
    l->count = count;
    l->sizes = calloc(count ? count : 1, sizeof(size_t));
    l->offsets = calloc(count ? count : 1, sizeof(size_t));
    if (!l->sizes || !l->offsets) {
        UNLOCK();
        return -1;
    }
    memcpy(l->sizes, sizes, count * sizeof(size_t));
    memcpy(l->offsets, offsets, count * sizeof(size_t));
    memset(l->pointer, 0, sizeof l->pointer);
    if (pointer) memcpy(l->pointer, pointer, count);
    UNLOCK();
    return 0;
}

/* Number of launches recorded. */
EXPORT size_t standin_launch_count(void) {
    LOCK();
    size_t n = g_nlaunches;
    UNLOCK();
    return n;
}

/* Launch `i`: name, dims[0..7] = grid x y z, block x y z, shared bytes,
 * *stream_id (0: null stream), the packed argument bytes, how they were
 * packed (1 layout, 2 extra buffer, 0 none) and, in pointer[0..32], what
 * each address argument pointed to (see launch_t). The pointers stay valid
 * until the process ends. */
EXPORT int standin_launch(size_t i, const char **name, unsigned dims[7], unsigned *stream_id,
                          const unsigned char **args, size_t *args_len, int *packed,
                          unsigned char pointer[MAX_ARGS]) {
    LOCK();
    int ok = i < g_nlaunches;
    if (ok) {
        launch_t *l = &g_launches[i];
        *name = l->name;
        for (int k = 0; k < 3; k++) dims[k] = l->grid[k], dims[3 + k] = l->block[k];
        dims[6] = l->shared;
        *stream_id = l->stream_id;
        *args = l->args;
        *args_len = l->args_len;
        *packed = l->packed;
        memcpy(pointer, l->pointer, MAX_ARGS);
    }
    UNLOCK();
    return ok ? 0 : -1;
}

/* The id the stand-in gave a stream handle (0 for null or unknown). */
EXPORT unsigned standin_stream_id(hipStream_t s) {
    LOCK();
    unsigned id = s && vec_has(&g_streams, s) ? s->id : 0;
    UNLOCK();
    return id;
}
