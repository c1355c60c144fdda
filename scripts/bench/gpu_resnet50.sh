#!/usr/bin/env bash
# ResNet-50 tuned for this machine's GPU, then timed against dlight, PyTorch eager and torch.compile in turn:
# the one prepared script of a lent GPU machine's call (docs/benchmarking.md, "ansor bench --target cuda").
#
#   OUT=/where/results/go MINUTES=5 bash scripts/bench/gpu_resnet50.sh
#
# Run from the project root with TVM, Ray and xgboost importable (on a lent machine: after sourcing
# ../shared/device/install-on-device.sh, as its README says). The tuning's own output goes to $OUT/tune.log;
# a watchdog stops it when its first 16 candidates or more all failed (it would spend the call measuring
# nothing), so the call still returns the tuner's first failure message. Then `ansor bench --target cuda
# --log` times the tuned build and writes the GPU section of docs/benchmarks.md, copied to $OUT with the log.
set -uo pipefail
OUT=${OUT:?set OUT to a results folder}
MINUTES=${MINUTES:-5}
ARCH=${ARCH:-}  # e.g. sm_90; empty: the arch of the GPU ansor finds
WORK=${WORK:-/tmp/ansor-gpu}
start=$(date +%s)
rm -rf "$WORK" && mkdir -p "$WORK" "$OUT"
log=$WORK/resnet-50-cuda.json

counts() {  # "<records> <ran>" of a tuning log, "0 0" while it has none
  python3 -c "
import sys
from ansor.log.records import load_records
try:
    r = load_records(sys.argv[1])
except Exception:
    r = []
print(len(r), sum(1 for x in r if x.result.ok))" "$1" 2>/dev/null || echo "0 0"
}

timeout $((MINUTES * 60 + 150)) python3 -m ansor tune --network resnet-50 --target "cuda${ARCH:+ -arch=$ARCH}" \
  --minutes "$MINUTES" --n-trials 100000 --repeat 3 --no-eval --log-file "$log" > "$OUT/tune.log" 2>&1 &
tuner=$!
for _ in $(seq 12); do  # the first two minutes
  sleep 10
  kill -0 "$tuner" 2>/dev/null || break
  read -r records ran <<< "$(counts "$log")"
  if [ "$records" -ge 16 ] && [ "$ran" -eq 0 ]; then
    echo "all $records candidates so far failed: tuning stopped"; kill "$tuner"; break
  fi
done
wait "$tuner" || tail -3 "$OUT/tune.log"
grep -E "^(tuning|time):|first .* failure" "$OUT/tune.log"
left=$((585 - ($(date +%s) - start)))
timeout "$left" python3 -m ansor bench --target cuda --models resnet-50 --log "$log" --minutes "$MINUTES" \
  --rounds 3 --pause 0.5 --work-dir "$WORK" --write-docs . 2>&1 | tee "$OUT/bench.log"
cp docs/benchmarks.md "$log" "$OUT/"
echo "done in $(($(date +%s) - start)) s"
