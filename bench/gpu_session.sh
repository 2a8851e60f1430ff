#!/usr/bin/env bash
# One full GPU session on a 2-GPU runner (after the stack is unpacked): single-GPU fuzz, CP fuzz and corpus replay
# at once, then the throughput benchmarks alone. Results land in OUT as a few files.
#   bash bench/gpu_session.sh OUT SECONDS
set -u
out=$1; secs=$2
w=$(mktemp -d)
export PYTHONWARNINGS=ignore PYTHONUNBUFFERED=1
bash bench/gpu_fuzz.sh "$w/single" "$secs" 500 fa4 te-flash te-fused te-unfused sdpa-flash sdpa-efficient sdpa-cudnn \
  flex-compiled > /dev/null 2>&1 &
mkdir -p "$w/cp"; cp -r corpus "$w/cp/corpus"
for b in ring-allgather ring-alltoall te-cp-p2p-fused te-cp-p2p-flash te-cp-all_gather-fused te-cp-all_gather-flash \
         te-cp-a2a-fused te-cp-a2a-flash; do
  timeout -k 10 "$secs" python3 -m attnfuzz run --backend "$b" --device cuda --profile ci --max-examples 200 \
    --corpus "$w/cp/corpus" --log "$w/cp/$b.jsonl" > /dev/null 2> "$w/cp/$b.err" &
  sleep 1
done
timeout -k 10 "$secs" python3 -m pytest corpus -p attnfuzz.plugin --device cuda -q -p no:cacheprovider -rA \
  > "$w/corpus_replay.txt" 2>&1 &
wait
python3 bench/summarize.py "$w"/cp/*.jsonl > "$w/cp_summary.txt"
for b in sdpa-math sdpa-flash sdpa-cudnn te-unfused fa4; do
  timeout 100 python3 bench/throughput.py --backend "$b" --device cuda --examples 600 >> "$w/throughput.txt" 2>&1
done
cat "$w/single/summary.txt" "$w/cp_summary.txt" "$w/throughput.txt" > "$out/session_summary.txt"
tail -n 25 "$w/corpus_replay.txt" >> "$out/session_summary.txt"
tar czf "$out/session.tgz" -C "$w" .
cat "$out/session_summary.txt"
