"""The latent-caching flow of musubi-tuner-like video trainers, through
rocm-safe's verified moves: encode clips with the VAE on the GPU, bring
the latents back to the CPU as float32 (`to_cpu(..., dtype=)`: half the
bytes cross the bus, widened exactly on arrival), save them, and later
load them and send the training batch to the GPU (`to_device`).

    python python/examples/cache_latents.py [--device cuda:0] [--out DIR]

Each step is checked (see `rocm_safe.torch.last_move_report()`); the
script prints the reports and checks the cached latents against the
encoder's output bit for bit. With `--tiny` (the default) the VAE is a
small, randomly initialised diffusers `AutoencoderKLWan`, so that the
example runs anywhere in seconds; a trainer loads its real VAE instead.
"""

from __future__ import annotations

import argparse
import os
import tempfile

import torch

from rocm_safe import torch as rt


def tiny_wan_vae():
    import diffusers

    torch.manual_seed(0)
    return diffusers.AutoencoderKLWan(
        base_dim=8,
        z_dim=4,
        dim_mult=[1, 2],
        num_res_blocks=1,
        attn_scales=[],
        temperal_downsample=[True],
    )


def run(device: str, out_dir: str, clips: int = 2, verbose: bool = True) -> dict:
    """Encodes `clips` random clips on `device`, caches their latents in
    `out_dir`, reloads them and moves one training batch back to `device`.
    Returns what was checked."""
    vae = rt.module_to(tiny_wan_vae().eval(), device, torch.bfloat16)
    if verbose:
        print(rt.last_move_report())
    paths = []
    encoded = []
    with torch.no_grad():
        for i in range(clips):
            clip = torch.rand(1, 3, 5, 16, 16, dtype=torch.bfloat16) * 2 - 1
            clip = rt.to_device(clip, device)
            latents = vae.encode(clip).latent_dist.mode()  # bf16, on the device
            cached = rt.to_cpu(latents, dtype=torch.float32)
            if verbose:
                print(rt.last_move_report())
            path = os.path.join(out_dir, f"clip{i}_latents.safetensors")
            rt.save_file({"latents": cached}, path)
            paths.append(path)
            encoded.append(latents)
    # Later, in the training loop: load the cache, move the batch.
    batch = {
        "latents": torch.cat([rt.load_file(p)["latents"] for p in paths]),
        "timesteps": torch.tensor([500, 250]),
        "mask": torch.ones(clips, 16, dtype=torch.bool),
    }
    on_device = rt.to_device(batch, device, dtype=torch.bfloat16)
    if verbose:
        print(rt.last_move_report())
    want = torch.cat(encoded)
    exact = torch.equal(on_device["latents"], want)
    return {
        "latents_exact": exact,
        "latents_dtype": on_device["latents"].dtype,
        "timesteps_dtype": on_device["timesteps"].dtype,
        "mask_dtype": on_device["mask"].dtype,
        "report": rt.last_move_report(),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda:0" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--out", default=None)
    ap.add_argument("--clips", type=int, default=2)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        if a.device == "cpu":
            # No GPU: run the same verified path over rocm-safe's host backend.
            with rt._verified_cpu_moves():
                r = run(a.device, a.out or tmp, a.clips)
        else:
            r = run(a.device, a.out or tmp, a.clips)
    print("latents cached and reloaded bit for bit:", r["latents_exact"])
    if not r["latents_exact"]:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
