#!/usr/bin/env bash
# The ci stream of each backend on a CUDA machine, then a summary of the logs.
#
#   [JOBS=N] [TIMEOUT=S] bash bench/streams.sh OUT BACKEND...
#   JOBS=8 TIMEOUT=480 bash bench/streams.sh out sdpa-math sdpa-flash sdpa-efficient sdpa-cudnn fa4 te-fused te-unfused
#
# Each backend runs `attnfuzz run --profile ci --max-examples 500 --isolate` (derandomized: the same cases as any other
# run of this commit) into OUT/BACKEND.jsonl, with its output in OUT/BACKEND.txt; a backend that fails or finds a bug
# does not stop the others. EXAMPLES=N and DEVICE=cuda:K override the defaults; JOBS=N runs N backends at once (default
# 1); TIMEOUT=S interrupts a backend's run after S seconds (as Ctrl-C would: what it graded stays in its log, the
# summary says how many cases each got). ATTNFUZZ overrides the command (default: attnfuzz). Findings are saved
# under OUT/corpus.
set -u
if [ $# -lt 2 ]; then
  echo "usage: bash bench/streams.sh OUT BACKEND..." >&2
  exit 2
fi
out=$1; shift
mkdir -p "$out"
examples=${EXAMPLES:-500}
device=${DEVICE:-cuda}
read -r -a attnfuzz <<< "${ATTNFUZZ:-attnfuzz}"
limit=()
[ -n "${TIMEOUT:-}" ] && limit=(timeout -s INT -k 30 "$TIMEOUT")

stream() {
  local backend=$1 rc
  "${limit[@]}" "${attnfuzz[@]}" run --backend "$backend" --device "$device" --profile ci --max-examples "$examples" \
    --isolate --log "$out/$backend.jsonl" --corpus "$out/corpus" > "$out/$backend.txt" 2>&1
  rc=$?
  echo "== $backend ($examples examples on $device): exit $rc; $(tail -n 1 "$out/$backend.txt")"
  return $rc
}

status=0
running=0
for backend in "$@"; do
  if [ "$running" -ge "${JOBS:-1}" ]; then
    wait -n || status=1
    running=$((running - 1))
  fi
  stream "$backend" &
  running=$((running + 1))
done
while [ "$running" -gt 0 ]; do
  wait -n || status=1
  running=$((running - 1))
done
python3 "$(dirname "$0")/summarize.py" "$out"/*.jsonl | tee "$out/summary.txt"
exit $status
