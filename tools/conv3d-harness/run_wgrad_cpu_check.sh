#!/bin/sh
# The tiled weight-gradient kernels run on the CPU against a double
# reference (wgrad_cpu_check.cpp; no GPU needed). Prints `all ok` and exits
# 0, or names the bad cases and exits non-zero. Needs g++ with C++20.
cd "$(dirname "$0")" || exit 2
bin=${TMPDIR:-/tmp}/rs_wgrad_cpu_check.$$
g++ -std=c++20 -O1 -w -pthread -I../../kernels -o "$bin" wgrad_cpu_check.cpp || exit 2
"$bin" >"$bin.log" 2>&1
status=$?
grep -v " ok$" "$bin.log" || true
tail -n 1 "$bin.log"
rm -f "$bin" "$bin.log"
exit $status
