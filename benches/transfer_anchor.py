"""Anchor for benches/transfer.rs, measured in the same device call:
safetensors `load_file(device="cuda")` of every shard (bf16 stays bf16), then
`.float()` on the GPU, with the peak RSS growth of the process. Usage:
    python3 benches/transfer_anchor.py DIR [repeat]
"""
import glob, os, resource, sys, time
import torch
from safetensors.torch import load_file

def rss_kib(key):
    with open("/proc/self/status") as f:
        for l in f:
            if l.startswith(key):
                return int(l.split()[1])
    return 0

d = sys.argv[1]
repeat = int(sys.argv[2]) if len(sys.argv) > 2 else 2
files = sorted(glob.glob(os.path.join(d, "*.safetensors")))
size = sum(os.path.getsize(f) for f in files)
torch.zeros(1, device="cuda")
for convert in (False, True):
    for r in range(repeat):
        try:
            open("/proc/self/clear_refs", "w").write("5")
        except OSError:
            pass
        rss0 = rss_kib("VmRSS:")
        t = time.perf_counter()
        n = 0
        for f in files:
            ts = load_file(f, device="cuda")
            if convert:
                ts = {k: v.float() for k, v in ts.items()}
            n += len(ts)
            del ts
        torch.cuda.synchronize()
        dt = time.perf_counter() - t
        hwm = rss_kib("VmHWM:")
        what = "load_file(cuda) + .float()" if convert else "load_file(cuda)"
        print(f"anchor {what} run {r}: {size / 2**30:.3f} GiB, {n} tensors in {dt:.3f} s = {size / dt / 1e9:.2f} GB/s; "
              f"peak RSS growth {(hwm - rss0) / 1024:.1f} MiB")
        torch.cuda.empty_cache()
