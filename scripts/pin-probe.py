#!/usr/bin/env python3
"""How fast this host pins memory for the GPU, by method (CUDA driver API).

    python3 scripts/pin-probe.py [MiB] [method ...]

PIN_ROUNDS (default 2) rounds over the methods. Methods (each in a process of its own, so every figure is a first pin of
that process, as in a trainer's first load):

  hostalloc   cuMemHostAlloc, the whole size at once
  hostalloc4  cuMemHostAlloc, four quarters
  reg         mmap (4 KiB pages), touched on one thread, cuMemHostRegister
  reg_thp     mmap with MADV_HUGEPAGE, touched on 8 threads, cuMemHostRegister
  reg_par     mmap (4 KiB pages), touched on 16 threads, cuMemHostRegister

Prints one line per method: milliseconds to usable pinned memory, GB/s of
pinning, and the host-to-device copy rate out of the pinned memory.
"""

import ctypes
import mmap
import os
import subprocess
import sys
import threading
import time

MIB = 1 << 20


def cuda():
    cu = ctypes.CDLL("libcuda.so.1")
    for name in ("cuMemHostAlloc", "cuMemcpyHtoD_v2", "cuMemAlloc_v2", "cuMemHostRegister_v2"):
        getattr(cu, name)
    def ck(r, what):
        if r != 0:
            raise RuntimeError(f"{what}: CUresult {r}")
    ck(cu.cuInit(0), "cuInit")
    dev = ctypes.c_int()
    ck(cu.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
    ctx = ctypes.c_void_p()
    ck(cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "retain")
    ck(cu.cuCtxSetCurrent(ctx), "set current")
    return cu, ck


def h2d_rate(cu, ck, ptr, size, reps=8):
    d = ctypes.c_uint64()
    ck(cu.cuMemAlloc_v2(ctypes.byref(d), ctypes.c_size_t(size)), "cuMemAlloc")
    cu.cuMemcpyHtoD_v2(d, ctypes.c_void_p(ptr), ctypes.c_size_t(size))
    t = time.perf_counter()
    for _ in range(reps):
        ck(cu.cuMemcpyHtoD_v2(d, ctypes.c_void_p(ptr), ctypes.c_size_t(size)), "copy")
    dt = time.perf_counter() - t
    cu.cuMemFree_v2(d)
    return reps * size / dt / 1e9


def anon(size, huge):
    m = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if huge:
        m.madvise(mmap.MADV_HUGEPAGE)
    ptr = ctypes.addressof(ctypes.c_char.from_buffer(m))
    return m, ptr


def touch(ptr, size, threads):
    step = size // threads
    ts = [threading.Thread(target=ctypes.memset, args=(ptr + i * step, 0, step)) for i in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()


def register(cu, ck, ptr, size):
    ck(cu.cuMemHostRegister_v2(ctypes.c_void_p(ptr), ctypes.c_size_t(size), 0), "cuMemHostRegister")


def method(name, size):
    cu, ck = cuda()
    keep = []
    t0 = time.perf_counter()
    if name in ("hostalloc", "hostalloc4"):
        parts = 4 if name == "hostalloc4" else 1
        ptrs = []
        for _ in range(parts):
            p = ctypes.c_void_p()
            ck(cu.cuMemHostAlloc(ctypes.byref(p), ctypes.c_size_t(size // parts), 0), "cuMemHostAlloc")
            ptrs.append(p.value)
        dt = time.perf_counter() - t0
        ptr = ptrs[0]
        rate_size = size // parts
    elif name in ("reg", "reg_thp", "reg_par"):
        huge = name == "reg_thp"
        m, ptr = anon(size, huge)
        keep.append(m)
        touch(ptr, size, {"reg": 1, "reg_thp": 8, "reg_par": 16}[name])
        t1 = time.perf_counter()
        register(cu, ck, ptr, size)
        t2 = time.perf_counter()
        dt = t2 - t0
        print(f"  {name}: touch {1e3 * (t1 - t0):.1f} ms, register {1e3 * (t2 - t1):.1f} ms")
        rate_size = size
    else:
        raise SystemExit(f"unknown method {name}")
    rate = h2d_rate(cu, ck, ptr, rate_size)
    print(f"{name}: {size // MIB} MiB usable in {1e3 * dt:.1f} ms = {size / dt / 1e9:.2f} GB/s pinning; "
          f"H2D from it {rate:.1f} GB/s")


def main():
    args = sys.argv[1:]
    if args and args[0] == "--one":
        method(args[1], int(args[2]) * MIB)
        return
    size = int(args[0]) if args else 128
    rounds = int(os.environ.get("PIN_ROUNDS", "2"))
    methods = args[1:] or ["hostalloc", "hostalloc4", "reg", "reg_thp", "reg_par"]
    for p in ("/sys/kernel/mm/transparent_hugepage/enabled", "/sys/kernel/mm/transparent_hugepage/defrag"):
        try:
            print(p, open(p).read().strip())
        except OSError as e:
            print(p, e)
    for _ in range(rounds):
        for name in methods:
            subprocess.run([sys.executable, __file__, "--one", name, str(size)], check=False)


if __name__ == "__main__":
    main()
