#!/usr/bin/env bash
# One call on a 2-GPU runner, after the stack is unpacked: the CP flash backends (ci, 200 examples each), fa4 and
# te-flash (ci, 500 examples, isolated: their crashes poison a process) and the corpus replay, all at once.
#   bash bench/gpu_final.sh OUT SECONDS
set -u
out=$1; secs=$2
export PYTHONWARNINGS=ignore PYTHONUNBUFFERED=1 PYTHONPATH=.:${PYTHONPATH:-}
w=$(mktemp -d); cp -r corpus "$w/corpus"
for b in te-cp-all_gather-flash te-cp-p2p-flash; do
  timeout -k 10 "$secs" python3 -m attnfuzz run --backend "$b" --device cuda --profile ci --max-examples 200 \
    --corpus "$w/corpus" --log "$out/$b.jsonl" > /dev/null 2> "$out/$b.err" &
done
gpu=0
for b in fa4 te-flash; do
  CUDA_VISIBLE_DEVICES=$gpu timeout -k 10 "$secs" python3 -m attnfuzz run --backend "$b" --device cuda --profile ci \
    --max-examples 500 --isolate --case-timeout 120 --corpus "$w/corpus" --log "$out/$b.jsonl" > /dev/null \
    2> "$out/$b.err" &
  gpu=$((1 - gpu))
done
timeout -k 10 "$secs" python3 -m pytest corpus -p attnfuzz.plugin --device cuda --isolate -q -p no:cacheprovider -rfEX \
  > "$out/corpus_replay.txt" 2>&1 &
wait
python3 bench/summarize.py "$out"/*.jsonl > "$out/summary.txt" 2>&1
tar czf "$out/new_corpus.tgz" -C "$w" corpus
cat "$out/summary.txt"; tail -n 30 "$out/corpus_replay.txt"; tail -n 3 "$out"/*.err
