#!/usr/bin/env bash
# Does a fatal GPU fault in one process reach the others on the same GPU, with and without CUDA MPS?
#
#   bash bench/mps_containment.sh [address|assert]
#
# Four clients loop torch SDPA for 20 s; at about 6 s a fifth faults: `address` launches a Triton kernel that loads
# 2^40 elements past its buffer (an illegal address, as a broken attention kernel makes), `assert` indexes a tensor out
# of bounds (a device-side assert). Each client prints "ok N" (N calls made) or "DIED after N" with its error. The run
# is repeated under MPS (nvidia-cuda-mps-control -d, quit after), which needs the right to start the daemon.
set -u
fault=${1:-address}
busy=$(mktemp --suffix .py)
crash=$(mktemp --suffix .py)
trap 'rm -f "$busy" "$crash"' EXIT
cat > "$busy" <<'PY'
import sys, time, torch
x = torch.randn(64, 8, 256, 64, device="cuda"); n = 0; t = time.time()
try:
    while time.time() - t < 20:
        torch.nn.functional.scaled_dot_product_attention(x, x, x); torch.cuda.synchronize(); n += 1
    print(sys.argv[1], "ok", n)
except Exception as e:
    print(sys.argv[1], "DIED after", n, type(e).__name__, str(e)[:120])
PY
if [ "$fault" = assert ]; then
  cat > "$crash" <<'PY'
import time, torch
time.sleep(6); x = torch.zeros(10, device="cuda")
try:
    x[torch.tensor([100], device="cuda")] = 1; torch.cuda.synchronize(); print("fault: none raised")
except Exception as e:
    print("fault:", type(e).__name__, str(e)[:100])
PY
else
  cat > "$crash" <<'PY'
import time, torch, triton, triton.language as tl
@triton.jit
def bad(p, o):
    tl.store(o, tl.load(p + (1 << 40)))
x = torch.zeros(10, device="cuda"); time.sleep(6)
try:
    bad[(1,)](x + 0, x); torch.cuda.synchronize(); print("fault: none raised")
except Exception as e:
    print("fault:", type(e).__name__, str(e)[:100])
PY
fi
for mode in plain mps; do
  [ $mode = mps ] && { nvidia-cuda-mps-control -d || exit 1; sleep 1; }
  echo "== $mode ($fault)"
  for i in 1 2 3 4; do python3 "$busy" lane$i 2>&1 | grep -v Warn & done
  python3 "$crash" 2>&1 | grep -v Warn; wait
  [ $mode = mps ] && { echo quit | nvidia-cuda-mps-control; sleep 2; }
done
