#!/bin/bash
# Everything one GPU call runs (README.md): builds the harnesses (the
# current sources, and baseline/ when present), checks, times, then torch's
# anchor. Logs under $OUT (or ./out).
cd "$(dirname "$0")"
OUT=${OUT:-out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv,noheader
nvcc -O3 -arch=sm_90 -I../../kernels -o h conv3d_harness.cu &
nvcc -O3 -arch=sm_90 -I../../kernels -Xptxas -v -o wan wan_harness.cu -lnvrtc -lcuda 2>"$OUT/ptxas.log" &
if [ -d baseline ]; then nvcc -O3 -arch=sm_90 -Ibaseline -o wan_base wan_harness.cu -lnvrtc -lcuda & fi
for v in $VARIANTS; do nvcc -O3 -arch=sm_90 -I../../kernels -DRS_XP_$v -DRS_XP_FLAG=\"RS_XP_$v\" -o wan_$v wan_harness.cu -lnvrtc -lcuda & done
wait
./h > "$OUT/h.log" 2>&1; echo "conv3d_harness rc $?"; grep -c "NaN" "$OUT/h.log"
if [ -d baseline ]; then echo "== baseline"; ./wan_base baseline 2>&1 | tee "$OUT/base.log"; fi
echo "== new"; ./wan 2>&1 | tee "$OUT/new.log"
for v in $VARIANTS; do echo "== variant $v "; ./wan_$v 2>&1 | tee "$OUT/$v.log"; done
[ -n "$NO_TORCH" ] || { echo "== torch"; PYTHONUNBUFFERED=1 timeout 200 python3 torch_anchor.py 2>&1 | tee "$OUT/torch.log"; }
cat "$OUT/h.log" | grep -v "^  naive"
