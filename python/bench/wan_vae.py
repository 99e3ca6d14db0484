"""The Wan 2.1 video VAE's decode with every conv3d through a chosen path.

Usage (a CUDA machine with torch and diffusers)::

    python3 python/bench/wan_vae.py [--dtype float32 bfloat16] [--repeat 3]
        [--latent 1,16,3,60,104] [--paths cudnn nocudnn chain chain_vendor fallback verify]
        [--compile] [--json out.json]

diffusers' ``AutoencoderKLWan`` at its default (real) configuration with
random weights (seed 0), decoding a latent of ``--latent`` (the default is 9
frames of 480x832). Each path runs in a fresh subprocess: one untimed
decode (the process's first call, reported as ``first``), then ``--repeat``
timed decodes (median reported). Paths:

- ``cudnn``: torch's conv3d with cuDNN.
- ``nocudnn``: torch's conv3d with ``torch.backends.cudnn.enabled = False``
  (what an AMD user gets with MIOpen turned off).
- ``chain``: every conv3d through rocm-safe's chain with its vendor tier
  failing (``_inject_conv3d_failures(["vendor"])``, so the wheel is built
  with ``--features cuda,testing``): the tiled kernel serves,
  checks on.
- ``chain_vendor``: every conv3d through the chain, vendor tier on (inside
  this PyTorch process it must be cuDNN that serves).
- ``fallback``: torch's conv3d (cuDNN) with ``install_conv3d_fallback()``
  (the NaN/Inf check of each output).
- ``verify``: torch's conv3d (cuDNN) with ``install_conv3d_fallback(mode="verify")``.

``--compile``: every path decodes through ``torch.compile(vae.decode)``
(inductor, default mode), compiled after the path's setup (so the
fallback's operator is in the graph); the untimed first decode includes
the compile; the stats then also give Dynamo's graph and graph-break
counts of the decode (``torch._dynamo.utils.counters``).

For the chain paths, a profiled decode (torch.profiler, CUDA activity) also
gives the GPU time of the serving kernels, so the time outside them is
``wall - kernels``. Every path's output is compared with the ``cudnn``
path's (max abs difference, relative to its max abs value).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import statistics
import sys
import time


def _decode_once(vae, z, decode=None):
    import torch

    torch.cuda.synchronize()
    t0 = time.perf_counter()
    with torch.no_grad():
        out = (decode or vae.decode)(z, return_dict=False)[0]
    torch.cuda.synchronize()
    return time.perf_counter() - t0, out


def _run(path: str, dtype_name: str, latent, repeat: int, q, compiled: bool = False) -> None:
    try:
        import torch
        from diffusers import AutoencoderKLWan

        dtype = getattr(torch, dtype_name)
        torch.manual_seed(0)
        vae = AutoencoderKLWan().to("cuda", dtype).eval()
        g = torch.Generator(device="cuda").manual_seed(1)
        z = torch.randn(latent, device="cuda", dtype=dtype, generator=g)
        info = {"path": path, "dtype": dtype_name}
        if path == "nocudnn":
            torch.backends.cudnn.enabled = False
        if path in ("chain", "chain_vendor", "verify", "fallback"):
            import rocm_safe.torch as rst

            if path == "chain":
                rst._inject_conv3d_failures(["vendor"])
            if path in ("verify", "fallback"):
                rst.install_conv3d_fallback(mode=path)
            else:
                try:
                    rst.install_conv3d_fallback(mode="replace")
                except TypeError:  # an older package: route by hand
                    torch.nn.functional.conv3d = rst.conv3d
            rst.reset_conv3d_stats()
        decode = None
        if compiled:
            import torch._dynamo

            torch._dynamo.utils.counters.clear()
            decode = torch.compile(vae.decode)
        first, out = _decode_once(vae, z, decode)
        if compiled:
            c = torch._dynamo.utils.counters
            info["graph_breaks"] = sum(c["graph_break"].values())
            info["graphs"] = c["stats"]["unique_graphs"]
        info["first_s"] = first
        if path in ("chain", "chain_vendor", "verify", "fallback"):
            import rocm_safe

            # What the first decode's time went to: each kernel module's
            # load, compile included.
            info["kernel_loads"] = rocm_safe.kernel_loads()
        times = []
        for _ in range(repeat):
            t, out = _decode_once(vae, z, decode)
            times.append(t)
        info["median_s"] = statistics.median(times)
        info["times_s"] = times
        if path in ("chain", "chain_vendor", "verify", "fallback"):
            import rocm_safe.torch as rst

            info["stats"] = rst.conv3d_stats()
            if path in ("chain", "chain_vendor"):
                from torch.profiler import ProfilerActivity, profile

                with profile(activities=[ProfilerActivity.CUDA]) as prof:
                    t, _ = _decode_once(vae, z, decode)
                kernels = {}
                for e in prof.key_averages():
                    dev = getattr(e, "device_time_total", None)
                    if dev is None:
                        dev = getattr(e, "cuda_time_total", 0)
                    if "conv3d" in e.key or "cudnn" in e.key.lower() or "sm90" in e.key or "xmma" in e.key:
                        kernels[e.key] = dev / 1e6
                info["profiled_wall_s"] = t
                info["conv_kernels_s"] = sum(kernels.values())
                info["top_kernels"] = sorted(kernels.items(), key=lambda kv: -kv[1])[:8]
        # As numpy: a torch tensor would travel through shared memory that
        # this process takes away when it exits.
        info["out"] = out.float().cpu().numpy()
        maps = open("/proc/self/maps").read()
        info["libcudnn_files"] = sorted({l.split()[-1] for l in maps.splitlines() if "/libcudnn.so" in l})
        info["libnvrtc_files"] = sorted({l.split()[-1] for l in maps.splitlines() if "/libnvrtc.so" in l})
        q.put(info)
    except BaseException as e:  # noqa: BLE001 - reported to the parent
        import traceback

        q.put({"path": path, "dtype": dtype_name, "error": f"{e!r}\n{traceback.format_exc()}"})


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dtype", nargs="+", default=["float32", "bfloat16"])
    ap.add_argument("--paths", nargs="+", default=["cudnn", "nocudnn", "chain", "chain_vendor", "fallback", "verify"])
    ap.add_argument("--latent", default="1,16,3,60,104")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--compile", action="store_true", help="decode through torch.compile")
    ap.add_argument("--json")
    a = ap.parse_args()
    latent = [int(v) for v in a.latent.split(",")]
    ctx = mp.get_context("spawn")
    rows = []
    for dt in a.dtype:
        ref = None
        for path in a.paths:
            q = ctx.Queue()
            p = ctx.Process(target=_run, args=(path, dt, latent, a.repeat, q, a.compile))
            p.start()
            info = q.get()
            p.join()
            if "error" in info:
                print(f"{dt:9} {path:13} ERROR {info['error']}", flush=True)
                rows.append(info)
                continue
            out = info.pop("out")
            if path == "cudnn":
                ref = out
            if ref is not None:
                import numpy as np

                scale = float(np.abs(ref).max()) or 1.0
                info["max_rel_diff_vs_cudnn"] = float(np.abs(out - ref).max()) / scale
            extra = ""
            if "conv_kernels_s" in info:
                inside = info["conv_kernels_s"]
                outside = info["profiled_wall_s"] - inside
                extra = f" conv kernels {inside:.3f}s, rest of the decode {outside:.3f}s"
            if "stats" in info:
                st = info["stats"]
                served = {k: v["served"] for k, v in st["tiers"].items() if v["served"]}
                extra += (
                    f" served={served} calls={st.get('calls')} fell_back={st.get('fell_back')}"
                    f" guarded={st.get('guarded')} repaired={st.get('repaired')} verified={st.get('verified')}"
                )
            if "graph_breaks" in info:
                extra += f" graph_breaks={info['graph_breaks']} graphs={info['graphs']}"
            if info.get("kernel_loads"):
                loads = ", ".join(
                    f"{k['module']} {k['source']} {k['seconds']:.2f}s" for k in info["kernel_loads"]
                )
                extra += f" kernel loads: [{loads}]"
            print(
                f"{dt:9} {path:13} median {info['median_s']:.3f}s first {info['first_s']:.3f}s"
                f" diff {info.get('max_rel_diff_vs_cudnn', float('nan')):.2e}"
                f" cudnn libs {len(info['libcudnn_files'])} nvrtc libs {len(info['libnvrtc_files'])}{extra}",
                flush=True,
            )
            rows.append(info)
        base = {r["path"]: r for r in rows if r.get("dtype") == dt and "median_s" in r}
        for num, den in (("chain", "nocudnn"), ("chain", "cudnn"), ("chain_vendor", "cudnn"), ("fallback", "cudnn"), ("verify", "cudnn")):
            if num in base and den in base:
                ratio = base[den]["median_s"] / base[num]["median_s"]
                print(f"{dt:9} {num} is {ratio:.2f}x as fast as {den}", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
