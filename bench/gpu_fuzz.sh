#!/usr/bin/env bash
# Fuzz backends on the lent GPUs, one process per backend spread over the visible GPUs, each stopped after SECONDS.
#   [RUN_OPTIONS="--isolate --case-timeout 120"] [FIRST_GPU=0] [CORPUS=corpus] [UNMARK="ENTRY ..."] bash bench/gpu_fuzz.sh OUTDIR SECONDS EXAMPLES BACKEND...
# Leaves OUTDIR/summary.txt, OUTDIR/triage.md, OUTDIR/runs.tgz (per-backend logs, JSON summaries, stderr, found corpus entries).
set -u
out=$1; secs=$2; n=$3; shift 3
work=$(mktemp -d)
mkdir -p "$out"; cp -r "${CORPUS:-corpus}" "$work/corpus"   # known bugs of the corpus let the search go past them
for name in ${UNMARK:-}; do   # entries whose known_bug is dropped from the copy, so the search finds them again
  python3 -c 'import json, sys; e = json.load(open(sys.argv[1])); e.pop("known_bug"); json.dump(e, open(sys.argv[1], "w"), indent=2)' \
    "$work/corpus/$name.json"
done
ngpu=$(python3 -c 'import torch; print(max(torch.cuda.device_count(), 1))')
i=0
for b in "$@"; do
  gpu=$(((i + ${FIRST_GPU:-0}) % ngpu)); i=$((i + 1))
  CUDA_VISIBLE_DEVICES=$gpu PYTHONUNBUFFERED=1 timeout -k 10 "$secs" python3 -m attnfuzz run --backend "$b" \
    --device cuda --profile ci --max-examples "$n" --corpus "$work/corpus" --log "$work/$b.jsonl" --json ${RUN_OPTIONS:-} \
    > "$work/$b.json" 2> "$work/$b.err" &
done
wait
python3 bench/summarize.py "$work"/*.jsonl | tee "$out/summary.txt"
python3 -m attnfuzz triage "$work" --corpus "$work/corpus" > "$out/triage.md"   # which known bug took which failures
tail -n 3 "$work"/*.err > "$out/stderr_tails.txt"
tar czf "$out/runs.tgz" -C "$work" .
