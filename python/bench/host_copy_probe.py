"""The host's copy ceiling for loads on N GPUs of one host: N processes at
once, each ``preadv``s its 1/N of a file (page cache warm) into a
pre-faulted buffer on T threads; best of three rounds per process.

Usage: ``python3 python/bench/host_copy_probe.py FILE`` (prints one line
per configuration: 1 x 16, 2 x 16 and 2 x 8 processes x threads).

Every rank of ``load_distributed`` copies its share of the file from the
page cache into its pinned ring; the ranks of one host share its memory
bandwidth, and this probe measures that share without any GPU
(BENCHMARKS.md, "Loads on N GPUs").
"""
import os, sys, time, threading, multiprocessing as mp
def worker(path, rank, world, threads, q, bar):
    size = os.path.getsize(path); share = size // world; off0 = rank * share
    buf = bytearray(share); mv = memoryview(buf)
    for i in range(0, share, 4096): buf[i] = 1
    fd = os.open(path, os.O_RDONLY); chunk = 8 << 20
    def run(t):
        for o in range(t * chunk, share, threads * chunk):
            n = min(chunk, share - o); os.preadv(fd, [mv[o:o + n]], off0 + o)
    best = 1e9
    for r in range(3):
        bar.wait(); t0 = time.perf_counter()
        ts = [threading.Thread(target=run, args=(t,)) for t in range(threads)]
        [t.start() for t in ts]; [t.join() for t in ts]
        best = min(best, time.perf_counter() - t0)
    q.put((rank, share, best))
if __name__ == "__main__":
    path = sys.argv[1]
    with open(path, "rb") as f:
        while f.read(1 << 26): pass
    for world, threads in [(1, 16), (2, 16), (2, 8)]:
        q = mp.Queue(); bar = mp.Barrier(world)
        ps = [mp.Process(target=worker, args=(path, r, world, threads, q, bar)) for r in range(world)]
        [p.start() for p in ps]; res = [q.get() for _ in ps]; [p.join() for p in ps]
        tot = sum(s for _, s, _ in res); worst = max(b for _, _, b in res)
        print(f"processes {world} x {threads} threads: per process " + ", ".join(f"{s / b / 1e9:.1f}" for _, s, b in sorted(res)) + f" GB/s; aggregate {tot / worst / 1e9:.1f} GB/s", flush=True)
