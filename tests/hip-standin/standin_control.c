/*
 * Part of the stand-in HIP runtime: the control exports for tests (standin_*).
 * Not compiled alone: standin.c includes it after the types, the global
 * state and the call bookkeeping it uses (one translation unit, so the
 * library's exports are standin.c's alone).
 */

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
