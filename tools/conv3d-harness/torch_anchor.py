"""torch's conv3d on the shapes of wan_harness.cu (cuDNN on and off; f32 and
bf16): the anchor for the tiled kernels' times, run in the same call.
Median of 7 (CUDA events) after a warm-up. cuDNN's f32 uses TF32 unless
--no-tf32 (torch.backends.cudnn.allow_tf32 is True by default)."""
import sys
import torch
import torch.nn.functional as F

SHAPES = [  # name, C, D, H, W, K, time padding (k3, hw padding 1)
    ("96->96 11x480x832", 96, 13, 480, 832, 96, 0),
    ("192->192 11x240x416", 192, 13, 240, 416, 192, 0),
    ("384->384 5x120x208", 384, 7, 120, 208, 384, 0),
    ("384->384 3x60x104 p1", 384, 3, 60, 104, 384, 1),
    ("96->3 11x480x832", 96, 13, 480, 832, 3, 0),
]


def bench(fn):
    fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(7):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        fn()
        e1.record()
        e1.synchronize()
        ts.append(e0.elapsed_time(e1))
    return sorted(ts)[3]


def main():
    torch.backends.cudnn.allow_tf32 = "--no-tf32" not in sys.argv
    torch.backends.cudnn.benchmark = True
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}, cudnn.allow_tf32={torch.backends.cudnn.allow_tf32}")
    print(f"{'shape':22s} {'dtype':5s} {'cudnn on ms':>12s} {'cudnn off ms':>13s}")
    for name, c, d, h, w, k, pd in SHAPES:
        for dt in (torch.float32, torch.bfloat16):
            x = torch.randn(1, c, d, h, w, device="cuda", dtype=dt)
            wt = torch.randn(k, c, 3, 3, 3, device="cuda", dtype=dt) * 0.05
            b = torch.randn(k, device="cuda", dtype=dt)
            f = lambda: F.conv3d(x, wt, b, padding=(pd, 1, 1))
            torch.backends.cudnn.enabled = True
            on = bench(f)
            torch.backends.cudnn.enabled = False
            try:
                off = f"{bench(f):13.3f}"
            except torch.OutOfMemoryError:
                off = f"{'OOM':>13s}"
            torch.backends.cudnn.enabled = True
            print(f"{name:22s} {str(dt)[6:]:5s} {on:12.3f} {off}", flush=True)
            del x, wt, b
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
