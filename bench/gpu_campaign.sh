#!/usr/bin/env bash
# The GPU campaigns on a 2-GPU runner, after the stack is unpacked: every single-GPU backend (2 lanes per GPU) and
# the context-parallel flash backends (one lane that sees both GPUs; CP_BACKENDS overrides which), at once. Run it
# again to resume both; each call stops after SECONDS (the campaigns resume where they were killed) and leaves
# reports and corpora in OUT.
#   [CP_BACKENDS=te-cp-p2p-flash] bash bench/gpu_campaign.sh OUT SECONDS HOURS
set -u
out=$1; secs=$2; hours=$3
export PYTHONWARNINGS=ignore PYTHONUNBUFFERED=1 PYTHONPATH=.:${PYTHONPATH:-}
single=sdpa-math,sdpa-flash,sdpa-efficient,sdpa-cudnn,flex-compiled,fa4,te-flash,te-fused,te-unfused
cp=${CP_BACKENDS:-te-cp-all_gather-flash,te-cp-p2p-flash}
timeout -k 5 "$secs" python3 -m attnfuzz campaign --dir /tmp/camp-gpu --backends "$single" --device cuda --gpus all \
  --skip-unavailable --workers 2 --hours "$hours" --round-examples 100 --round-seconds 120 --case-timeout 120 >> "$out/camp-gpu.out" 2>&1 &
timeout -k 5 "$secs" python3 -m attnfuzz campaign --dir /tmp/camp-cp --backends "$cp" --device cuda --gpus 1 \
  --skip-unavailable --hours "$hours" --round-examples 100 --case-timeout 180 >> "$out/camp-cp.out" 2>&1 &
wait
for c in camp-gpu camp-cp; do
  python3 -m attnfuzz report "/tmp/$c" > /dev/null 2>&1
  tar czf "$out/$c.tgz" -C /tmp --exclude "$c/db" "$c"
  echo "== $c"; tail -c 1500 "$out/$c.out"; sed -n '/## Totals/,/## UNSUPPORTED/p' "/tmp/$c/report/report.md"
done
