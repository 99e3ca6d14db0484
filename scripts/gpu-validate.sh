#!/usr/bin/env bash
# On the borrowed GPU machine (no Rust there): unpack the binaries that
# ../shared/tools/stage-gpu.sh --features cuda staged into .gpu.tgz, then
#   bash scripts/gpu-validate.sh tests   every test binary with the GPU tests, then the doctor
#   bash scripts/gpu-validate.sh bench   GPU benches with their anchors in the same call
#   bash scripts/gpu-validate.sh load    first load against later loads (five processes each
#                                        with the self-test before the loads and inside load 0,
#                                        one with ROCM_SAFE_PINNED=hostalloc), the Python
#                                        package's load, the anchors before and after
# Logs go to $OUT (the device tool brings them back) and to stdout.
set -u
cd "$(dirname "$0")/.." || exit 1
out=${OUT:-/tmp/out}; mkdir -p "$out"
[ -d .gpu ] || tar xzf .gpu.tgz
# cuDNN (the conv3d vendor tier) comes with PyTorch's wheels.
cudnn=$(python3 - <<'PY' 2>/dev/null
import os, glob, nvidia
print(":".join(sorted({os.path.dirname(p) for p in glob.glob(os.path.join(os.path.dirname(nvidia.__path__[0]), "nvidia", "*", "lib", "lib*.so*"))})))
PY
)
export LD_LIBRARY_PATH="${cudnn}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export RUST_BACKTRACE=1
case "${1:-tests}" in
tests)
  rc=0
  for t in .gpu/bin/*; do
    case "$t" in *bench-*) continue ;; esac
    "$t" --include-ignored > /tmp/one.log 2>&1
    r=$?
    echo "== $t: exit $r, $(grep -E '^test result' /tmp/one.log | tail -n 1)"
    if [ $r -ne 0 ]; then rc=1; grep -E -A12 "panicked|FAILED" /tmp/one.log | head -n 60; fi
  done > "$out/tests.log" 2>&1
  cat "$out/tests.log" | cut -c1-200 | head -n 80
  .gpu/examples/doctor > "$out/doctor.txt" 2>&1; echo "doctor exit $?"; tail -n 30 "$out/doctor.txt"
  exit $rc ;;
bench)
  b() { ls .gpu/bin/bench-"$1"-* 2>/dev/null | head -1; }
  {
    python3 benches/torch_anchor.py 23 28
    "$(b gpu_convert)" --bench --warm-up-time 1 --measurement-time 3
    python3 benches/torch_anchor.py 23 28
  } > "$out/gpu_convert.log" 2>&1
  {
    python3 benches/conv3d_anchor.py
    "$(b conv3d)" --bench cuda --warm-up-time 1 --measurement-time 3
    python3 benches/conv3d_anchor.py
  } > "$out/conv3d.log" 2>&1
  {
    python3 scripts/make-checkpoint.py /tmp/ck --gib 4.2 --shards 2 --largest-mib 256
    cat /tmp/ck/*.safetensors > /dev/null
    python3 benches/transfer_anchor.py /tmp/ck 2
    TRANSFER_CKPT=/tmp/ck/model.safetensors.index.json TRANSFER_REPEAT=4 "$(b transfer)" --bench
    python3 benches/transfer_anchor.py /tmp/ck 2
  } > "$out/transfer.log" 2>&1
  tail -n 5 "$out"/*.log ;;
load)
  t=$(ls .gpu/bin/bench-transfer-* | head -1)
  # An earlier build of the same bench (.gpu/old/bench-transfer, staged by
  # hand) alternates with this one, process by process, in the same call.
  old=.gpu/old/bench-transfer
  run() {  # one process, four loads: GB/s of each, then load 0 / mean of loads 1-3
    local bin=$1; shift
    echo "== $([ "$bin" = "$t" ] || echo "old ")$*"
    env "$@" TRANSFER_CKPT=/tmp/ck/model.safetensors.index.json TRANSFER_REPEAT=4 "$bin" --bench
  }
  {
    python3 scripts/make-checkpoint.py /tmp/ck --gib 4.2 --shards 2 --largest-mib 256
    sync
    cat /tmp/ck/*.safetensors > /dev/null
    python3 benches/transfer_anchor.py /tmp/ck 2
    # The anchor's process leaves gigabytes to reclaim: let the host settle
    # so the first process timed does not pay for it.
    sleep 5
    for k in 1 2 3 4 5; do
      for cold in 0 1; do
        # With an earlier build, which one goes first alternates by round.
        if [ -x "$old" ] && [ $((k % 2)) -eq 0 ]; then
          run "$old" TRANSFER_COLD=$cold; run "$t" TRANSFER_COLD=$cold
        else
          run "$t" TRANSFER_COLD=$cold
          if [ -x "$old" ]; then run "$old" TRANSFER_COLD=$cold; fi
        fi
      done
    done
    run "$t" ROCM_SAFE_PINNED=hostalloc
    if ls .gpu/wheels/*.whl >/dev/null 2>&1; then
      python3 -m pip install -q --force-reinstall --no-deps .gpu/wheels/*.whl
      for k in 1 2 3; do echo "== python $k"; python3 python/bench/load_bench.py /tmp/ck --repeat 5; done
    fi
    python3 benches/transfer_anchor.py /tmp/ck 2
  } > "$out/load.log" 2>&1
  python3 - "$out/load.log" <<'PY'
import re, sys, statistics
cur = None
ratios = {}
for line in open(sys.argv[1]):
    if line.startswith("== "):
        cur = [line[3:].strip(), [], []]
        continue
    m = re.match(r"load (\d+): .* in ([0-9.]+) s = ([0-9.]+) GB/s of file bytes; ring ([0-9.]+) s", line)
    if m and cur is not None:
        cur[1].append(float(m.group(3)))
        cur[2].append((float(m.group(2)) - float(m.group(4))) * 1e3)
        if len(cur[1]) == 4:
            g, pre = cur[1], cur[2]
            r = g[0] / (sum(g[1:]) / 3)
            key = "hostalloc" if "hostalloc" in cur[0] else "old" if cur[0].startswith("old") else "new"
            ratios.setdefault(key, []).append(r)
            print(f"{cur[0]:32s} " + " ".join(f"{x:5.2f}" for x in g) + f"  first/later {r:.2f}  before the ring {pre[0]:.1f} / {statistics.mean(pre[1:]):.1f} ms")
    elif re.match(r"(anchor .*\.float|safetensors |rocm_safe |speed-up)", line):
        print(line.rstrip())
for k, v in ratios.items():
    print(f"{k}: {len(v)} processes, first/later median {statistics.median(v):.2f}, min {min(v):.2f}, {sum(x >= 0.9 for x in v)} at 0.9 or more")
PY
  ;;
esac
