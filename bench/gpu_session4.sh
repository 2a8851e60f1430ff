#!/usr/bin/env bash
# Session 4 on a 2-GPU runner, after the stack is unpacked: two calls, the second right after the first.
#   bash bench/gpu_session4.sh OUT campaign   # ~560 s: the 10-minute campaign's first part (every single-GPU backend,
#                                             # and te-cp-p2p-flash on both GPUs) beside isolated ci runs of the
#                                             # JIT-bound backends to 500 examples
#   bash bench/gpu_session4.sh OUT finish     # throughput alone (one process, then lanes), the GPU profile, cold
#                                             # starts, then the campaign's resume to its budget beside the corpus
#                                             # replay
set -u
out=$1; part=$2
export PYTHONWARNINGS=ignore PYTHONUNBUFFERED=1 PYTHONPATH=.:${PYTHONPATH:-} CP_BACKENDS=te-cp-p2p-flash
if [ "$part" = campaign ]; then
  bash bench/gpu_campaign.sh "$out" 555 0.175 > "$out/campaign_part1.txt" 2>&1 &
  RUN_OPTIONS="--isolate --case-timeout 120" bash bench/gpu_fuzz.sh "$out/ci" 550 500 fa4 te-flash te-fused \
    flex-compiled > /dev/null 2>&1 &
  wait
  cat "$out/campaign_part1.txt" "$out/ci/summary.txt"
else
  for b in sdpa-math sdpa-flash sdpa-efficient; do
    python3 bench/throughput.py --backend $b --device cuda --examples 800 2>&1 | tail -n 4
  done > "$out/throughput.txt"
  for n in 4 8; do
    python3 bench/throughput.py --backend sdpa-math --device cuda --examples 600 --lanes $n 2>&1 | tail -n 1
    python3 bench/throughput.py --backend sdpa-flash --device cuda --examples 600 --lanes $n 2>&1 | tail -n 1
  done >> "$out/throughput.txt"
  python3 bench/profile_loop.py --backend sdpa-math --device cuda --examples 400 > "$out/profile_math.txt" 2>&1
  python3 bench/first_verdict.py --device cuda --timeout 60 sdpa-math sdpa-flash sdpa-cudnn fa4 te-fused te-flash \
    flex-compiled > "$out/first_verdict.txt" 2>&1
  bash bench/gpu_campaign.sh "$out" 300 0.175 > "$out/campaign_part2.txt" 2>&1 &
  timeout -k 10 320 python3 -m pytest corpus -p attnfuzz.plugin --device cuda --isolate -q -p no:cacheprovider -rfEX \
    > "$out/corpus_replay.txt" 2>&1 &
  wait
  cat "$out/throughput.txt" "$out/first_verdict.txt"; head -n 60 "$out/profile_math.txt"; cat "$out/campaign_part2.txt"
  tail -n 40 "$out/corpus_replay.txt"
fi
