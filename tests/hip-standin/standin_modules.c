/*
 * Part of the stand-in HIP runtime: modules (offload bundles, ELF code objects) and recorded kernel launches.
 * Not compiled alone: standin.c includes it after the types, the global
 * state and the call bookkeeping it uses (one translation unit, so the
 * library's exports are standin.c's alone).
 */

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
