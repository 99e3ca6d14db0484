/*
 * Part of the stand-in HIP runtime: devices and versions, errors, memory, streams and events.
 * Not compiled alone: standin.c includes it after the types, the global
 * state and the call bookkeeping it uses (one translation unit, so the
 * library's exports are standin.c's alone).
 */

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
