#!/usr/bin/env bash
# The one-hour CPU campaign: every CPU backend plus four kernels that misbehave for real (segfault, abort, hang,
# raise) and one that is silently wrong, in two lanes. HOURS scales it (1 = the full hour); the report lands in DIR.
#   bash bench/campaign_cpu.sh DIR [HOURS]
set -eu
dir=$1; hours=${2:-1}
backends=sdpa-math,sdpa-flash,flex-eager,ring-allgather
backends=$backends,tests.misbehaving:segfault_when_causal,tests.misbehaving:aborts,tests.misbehaving:hangs
backends=$backends,tests.misbehaving:raises,tests.misbehaving:zero_when_causal
python3 -m attnfuzz campaign --dir "$dir" --backends "$backends" --hours "$hours" --workers 2 --case-timeout 60 \
  --round-examples 200 --round-seconds 60 || true   # exit 1 means findings, which the planted kernels guarantee
sed -n '/## Totals/,/## UNSUPPORTED/p' "$dir/report/report.md"
