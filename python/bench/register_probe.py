"""Where a direct load's time goes (BENCHMARKS.md, "Direct path"): registration and unregistration of windows of a
page-cache mapping (cuMemHostRegister PORTABLE|READ_ONLY) from one thread and several, copies from the registered pages,
and both pipelined; ctypes on libcuda inside torch's context. Usage: python3 python/bench/register_probe.py FILE [WINDOW_MIB]"""
import ctypes, mmap, os, sys, time, threading
from concurrent.futures import ThreadPoolExecutor
import torch
cu = ctypes.CDLL("libcuda.so.1")
path = sys.argv[1]; size = os.path.getsize(path)
W = int(sys.argv[2]) << 20 if len(sys.argv) > 2 else 64 << 20
torch.cuda.init(); torch.zeros(1, device="cuda:0"); torch.cuda.synchronize()
fd = os.open(path, os.O_RDONLY)
libc = ctypes.CDLL(None); libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
addr = libc.mmap(None, size, 1, 1, fd, 0)
with open(path, "rb") as f:
    while f.read(1 << 26): pass
wins = [(addr + o, min(W, size - o)) for o in range(0, size, W)]
wins = [(a, (n + 4095) // 4096 * 4096) for a, n in wins]
def reg(w):
    torch.cuda.set_device(0)
    r = cu.cuMemHostRegister_v2(ctypes.c_void_p(w[0]), ctypes.c_size_t(w[1]), 9); assert r == 0, r
def unreg(w):
    torch.cuda.set_device(0)
    r = cu.cuMemHostUnregister(ctypes.c_void_p(w[0])); assert r == 0, r
dst = torch.empty(size, dtype=torch.uint8, device="cuda:0")
s = torch.cuda.Stream()
def copy_all(ws):
    for i, (a, n) in enumerate(ws):
        off = a - addr; m = min(n, size - off)
        r = cu.cuMemcpyHtoDAsync_v2(ctypes.c_uint64(dst.data_ptr() + off), ctypes.c_void_p(a), ctypes.c_size_t(m), ctypes.c_void_p(s.cuda_stream)); assert r == 0, r
gb = size / 1e9
print(f"file {gb:.2f} GB, {len(wins)} windows of {W >> 20} MiB", flush=True)
t = time.perf_counter(); [reg(w) for w in wins]; tr = time.perf_counter() - t
t = time.perf_counter(); copy_all(wins); s.synchronize(); tc = time.perf_counter() - t
t = time.perf_counter(); [unreg(w) for w in wins]; tu = time.perf_counter() - t
print(f"sequential: register {tr:.3f} s ({gb/tr:.1f} GB/s), copy {tc:.3f} s ({gb/tc:.1f} GB/s), unregister {tu:.3f} s ({gb/tu:.1f} GB/s)", flush=True)
for th in (4, 8, 16):
    with ThreadPoolExecutor(th) as ex:
        t = time.perf_counter(); list(ex.map(reg, wins)); tr = time.perf_counter() - t
        t = time.perf_counter(); list(ex.map(unreg, wins)); tu = time.perf_counter() - t
    print(f"{th} threads: register {tr:.3f} s ({gb/tr:.1f} GB/s), unregister {tu:.3f} s ({gb/tu:.1f} GB/s)", flush=True)
# pipeline: threads register ahead; main copies each window as soon as registered; unregister after all (A) or per window on threads (B)
for mode in ("A", "B"):
    with ThreadPoolExecutor(8) as ex:
        t = time.perf_counter()
        futs = [ex.submit(reg, w) for w in wins]
        evs = []
        for f, w in zip(futs, wins):
            f.result(); copy_all([w]); e = torch.cuda.Event(); e.record(s); evs.append(e)
        if mode == "B":
            ufs = []
            for e, w in zip(evs, wins):
                e.synchronize(); ufs.append(ex.submit(unreg, w))
            [u.result() for u in ufs]
            s.synchronize()
        else:
            s.synchronize(); list(ex.map(unreg, wins))
        tt = time.perf_counter() - t
    print(f"pipeline {mode} (8 threads register ahead, copies as ready, unregister {'at end' if mode=='A' else 'per window'}): {tt:.3f} s = {gb/tt:.1f} GB/s", flush=True)
t = time.perf_counter(); r = cu.cuMemHostRegister_v2(ctypes.c_void_p(addr), ctypes.c_size_t((size + 4095)//4096*4096), 9); tr = time.perf_counter() - t
t = time.perf_counter(); copy_all(wins); s.synchronize(); tc = time.perf_counter() - t
t = time.perf_counter(); cu.cuMemHostUnregister(ctypes.c_void_p(addr)); tu = time.perf_counter() - t
print(f"whole file at once: register {tr:.3f} s (rc {r}), copy {tc:.3f} s ({gb/tc:.1f} GB/s), unregister {tu:.3f} s", flush=True)
