#!/usr/bin/env bash
# The ci stream of each backend on a CUDA machine, then a summary of the logs.
#
#   bash bench/streams.sh OUT BACKEND...
#   bash bench/streams.sh out sdpa-math sdpa-flash sdpa-efficient sdpa-cudnn fa4 te-fused te-unfused
#
# Each backend runs `attnfuzz run --profile ci --max-examples 500 --isolate` (derandomized: the same cases as any other
# run of this commit) into OUT/BACKEND.jsonl, with its output in OUT/BACKEND.txt; a backend that fails or finds a bug
# does not stop the others. EXAMPLES=N and DEVICE=cuda:K override the defaults. Findings are saved under OUT/corpus.
set -u
if [ $# -lt 2 ]; then
  echo "usage: bash bench/streams.sh OUT BACKEND..." >&2
  exit 2
fi
out=$1; shift
mkdir -p "$out"
examples=${EXAMPLES:-500}
device=${DEVICE:-cuda}
attnfuzz=${ATTNFUZZ:-attnfuzz}
status=0
for backend in "$@"; do
  echo "== $backend ($examples examples on $device)"
  "$attnfuzz" run --backend "$backend" --device "$device" --profile ci --max-examples "$examples" --isolate \
    --log "$out/$backend.jsonl" --corpus "$out/corpus" > "$out/$backend.txt" 2>&1
  rc=$?
  echo "   exit $rc; $(tail -n 1 "$out/$backend.txt")"
  [ $rc -ne 0 ] && status=1
done
python3 "$(dirname "$0")/summarize.py" "$out"/*.jsonl | tee "$out/summary.txt"
exit $status
