"""Anchors for benches/gpu_convert.rs, measured in the same device call:
PyTorch bf16->f32 (`x.float()`) and a device-to-device copy, 6 B/element and
8 B/element (read + write) counted as in the Rust bench. Usage:
    python3 benches/torch_anchor.py [log2_elements ...]
"""
import sys
import torch

def bench(fn, iters=50, warmup=5):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / 1e3)
    times.sort()
    return times[len(times) // 2]

def main():
    sizes = [int(a) for a in sys.argv[1:]] or [20, 24, 28]
    dev = torch.device("cuda")
    print("torch", torch.__version__, torch.cuda.get_device_name(0))
    for lg in sizes:
        n = 1 << lg
        x = torch.randint(-32768, 32767, (n,), dtype=torch.int16, device=dev).view(torch.bfloat16)
        y = torch.empty(n, dtype=torch.float32, device=dev)
        t = bench(lambda: y.copy_(x))  # same as x.float() into a preallocated output
        t2 = bench(lambda: x.float())
        print(f"torch bf16->f32 copy_ 2^{lg}: {6 * n / t / 1e9:.1f} GB/s; x.float(): {6 * n / t2 / 1e9:.1f} GB/s")
        a = torch.empty(n, dtype=torch.float32, device=dev)
        b = torch.empty(n, dtype=torch.float32, device=dev)
        t = bench(lambda: b.copy_(a))
        print(f"torch dtod f32 copy 2^{lg} ({4 * n} bytes): {8 * n / t / 1e9:.1f} GB/s (read+write)")

if __name__ == "__main__":
    main()
