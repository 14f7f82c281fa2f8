#!/usr/bin/env bash
# The same-GPU weight handoff (transport.weight_sync.type=cuda_ipc) on a GPU machine, in one go:
# the environment, the gpu tests of tests/gpu/test_cuda_ipc.py (two processes on one GPU: bit-exact
# versions, double buffering) and bench/weight_handoff.py (the 0.36B Qwen2 shape, CUDA IPC against
# the object store). About 1.5 minutes on one H100 after .device/setup.sh; without CUDA the tests
# skip and the bench says why (exit 0).
#
# On the lent GPU machine (carry .device, built by ../shared/gpu/prepare.sh), from the project root:
#   bash .device/setup.sh && export PYTHONPATH=/tmp/site:$PWD/src RAY_USAGE_STATS_ENABLED=0 \
#     PYTHONUNBUFFERED=1 && bash bench/gpu_handoff.sh
# Summaries go to $OUT (the device's output folder) or /tmp/gpu_handoff: env.txt, gpu_tests.txt,
# bench.txt, weight_handoff.json.
set -uo pipefail
out=${OUT:-/tmp/gpu_handoff}
mkdir -p "$out"
py=${PYTHON:-python3}
export RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 RAY_USAGE_STATS_ENABLED=0 PYTHONUNBUFFERED=1
status=0
{
  date -u
  nvidia-smi --query-gpu=name,uuid,memory.total,driver_version --format=csv,noheader 2>&1 || true
  $py -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())"
} 2>&1 | tee "$out/env.txt"
echo "== tests/gpu/test_cuda_ipc.py"
timeout 180 $py -m pytest -q -p no:cacheprovider -rA -s tests/gpu/test_cuda_ipc.py 2>&1 \
  | tee "$out/gpu_tests.txt"
status=$((status | PIPESTATUS[0]))
echo "== bench/weight_handoff.py"
timeout 180 $py bench/weight_handoff.py --repeats 5 --out "$out/weight_handoff" 2>&1 \
  | tee "$out/bench.txt"
status=$((status | PIPESTATUS[0]))
echo "== exit status $status (0: tests passed and the bench ran)"
exit $status
