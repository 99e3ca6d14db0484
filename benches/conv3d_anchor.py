"""Anchors for benches/conv3d.rs, measured in the same device call:
PyTorch conv3d on the GPU (1x128x9x128x128, 128 out, k3 p1, bias) with
cuDNN (TF32 allowed, PyTorch's default, and not) and with cuDNN disabled
(PyTorch's own fallback), f32 and bf16; and on the CPU (1x64x8x64x64, 64
out, k3 p1, 16 threads). Medians; FLOPs = 2 * MACs.
"""
import time
import torch
import torch.nn.functional as F


def gpu_ms(fn, iters=20, warmup=3):
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
        times.append(a.elapsed_time(b))
    times.sort()
    return times[len(times) // 2]


def cpu_ms(fn, iters=20, warmup=3):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1e3)
    times.sort()
    return times[len(times) // 2]


def main():
    print("torch", torch.__version__, torch.cuda.get_device_name(0), "cudnn", torch.backends.cudnn.version())
    flops = 2 * 128 * 128 * 27 * 9 * 128 * 128
    x = torch.randn(1, 128, 9, 128, 128, device="cuda")
    w = torch.randn(128, 128, 3, 3, 3, device="cuda") * 0.05
    b = torch.randn(128, device="cuda")
    for name, dt in [("f32", torch.float32), ("bf16", torch.bfloat16)]:
        xx, ww, bb = x.to(dt), w.to(dt), b.to(dt)
        f = lambda: F.conv3d(xx, ww, bb, padding=1)
        torch.backends.cudnn.enabled = True
        torch.backends.cudnn.allow_tf32 = True
        t1 = gpu_ms(f)
        torch.backends.cudnn.allow_tf32 = False
        t2 = gpu_ms(f)
        torch.backends.cudnn.enabled = False
        t3 = gpu_ms(f, iters=10)
        torch.backends.cudnn.enabled = True
        torch.backends.cudnn.allow_tf32 = True
        for what, t in [("cudnn (tf32 allowed)", t1), ("cudnn (no tf32)", t2), ("fallback (cudnn disabled)", t3)]:
            print(f"anchor gpu {name} {what}: {t:.3f} ms, {flops / t / 1e9:.1f} TFLOP/s")
    torch.set_num_threads(16)
    xc = torch.randn(1, 64, 8, 64, 64)
    wc = torch.randn(64, 64, 3, 3, 3) * 0.05
    bc = torch.randn(64)
    t = cpu_ms(lambda: F.conv3d(xc, wc, bc, padding=1))
    cflops = 2 * 64 * 64 * 27 * 8 * 64 * 64
    print(f"anchor cpu f32 16 threads: {t:.3f} ms, {cflops / t / 1e6:.1f} GFLOP/s")


if __name__ == "__main__":
    main()
