#!/usr/bin/env python3
"""Writes a synthetic safetensors checkpoint for measurements (no dependencies).

usage: make-checkpoint.py OUT_DIR --gib 1.0 [--shards 2] [--largest-mib 64] [--dtype BF16]

Used by the benches (BENCHMARKS.md, "Verified load" and "Reader"),
scripts/gpu-validate.sh and python/bench/load_bench.py; CI runs it once.

Writes OUT_DIR/model-0000i-of-0000n.safetensors and, with more than one shard,
OUT_DIR/model.safetensors.index.json. Tensor sizes cycle through a mix (the
largest is --largest-mib MiB); data is pseudo-random but finite floats, so a
conversion has real work to do. Offsets are deliberately not aligned.
"""
import argparse, json, os, random, struct

SIZES = [1.0, 0.25, 0.5, 0.01, 1.0, 0.125, 0.003]  # fractions of the largest tensor

def finite_block(dtype, n, rnd):
    # one random block repeated: fast to write, every element finite and nonzero
    if dtype == "BF16" or dtype == "F16":
        pats = [rnd.randrange(0x3000, 0x4800) | (rnd.randrange(2) << 15) for _ in range(4096)]
        blk = struct.pack("<4096H", *pats)
    else:
        blk = struct.pack("<4096f", *[rnd.uniform(-4, 4) for _ in range(4096)])
    size = {"BF16": 2, "F16": 2, "F32": 4}[dtype]
    total = n * size
    return (blk * (total // len(blk) + 1))[:total]

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 epilog=__doc__.split("\n\n", 3)[3])
    ap.add_argument("out", metavar="OUT_DIR", help="folder to write (created if missing)")
    ap.add_argument("--gib", type=float, default=1.0, help="total tensor bytes, GiB (default 1.0)")
    ap.add_argument("--shards", type=int, default=2,
                    help="number of files; more than 1 also writes the index (default 2)")
    ap.add_argument("--largest-mib", type=float, default=64,
                    help="size of the largest tensor, MiB (default 64)")
    ap.add_argument("--dtype", default="BF16", choices=["BF16", "F16", "F32"],
                    help="dtype of every tensor (default BF16)")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    size = {"BF16": 2, "F16": 2, "F32": 4}[a.dtype]
    rnd = random.Random(1)
    target = int(a.gib * (1 << 30))
    tensors, total, i = [], 0, 0
    while total < target:
        frac = SIZES[i % len(SIZES)]
        rows = max(1, int(a.largest_mib * (1 << 20) * frac) // (size * 1023))
        tensors.append((f"layers.{i}.weight", [rows, 1023]))
        total += rows * 1023 * size
        i += 1
    per = (len(tensors) + a.shards - 1) // a.shards
    weight_map = {}
    for s in range(a.shards):
        part = tensors[s * per:(s + 1) * per]
        if not part:
            continue
        name = f"model-{s + 1:05d}-of-{a.shards:05d}.safetensors" if a.shards > 1 else "model.safetensors"
        header, off = {"__metadata__": {"format": "pt"}}, 0
        for t, shape in part:
            nbytes = shape[0] * shape[1] * size
            header[t] = {"dtype": a.dtype, "shape": shape, "data_offsets": [off, off + nbytes]}
            off += nbytes
            weight_map[t] = name
        hb = json.dumps(header, separators=(",", ":")).encode()
        hb += b" " * (-len(hb) % 8)
        with open(os.path.join(a.out, name), "wb") as f:
            f.write(struct.pack("<Q", len(hb)))
            f.write(hb)
            for t, shape in part:
                f.write(finite_block(a.dtype, shape[0] * shape[1], rnd))
    if a.shards > 1:
        with open(os.path.join(a.out, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=1)
    print(f"wrote {len(tensors)} tensors, {total / (1 << 30):.2f} GiB in {a.shards} shard(s) to {a.out}")

if __name__ == "__main__":
    main()
