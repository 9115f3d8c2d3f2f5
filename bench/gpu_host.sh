#!/usr/bin/env bash
# The run on a one-GPU host that has its own CUDA torch and no package registry (issue 20). Here first:
#     make gpu-wheels        # .whl/: what rlpipe needs beyond that host's packages
# then, on the host, from the repository root (the wheels travel in .whl/):
#     bash bench/gpu_host.sh
# It installs those wheels over the host's torch (rlpipe itself runs from the checkout), runs
# `make gpu-check`, then a 300-iteration charlm run on 4 stage processes sharing the GPU with real device
# time, and its report. Everything it prints is also kept under $OUT (default gpu-out/), with the runs'
# files in $OUT/runs.tar.gz. The timeouts keep the whole script inside 8 minutes.
set -uo pipefail
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || { echo "gpu_host: could not install the wheels in .whl/ (run make gpu-wheels first)"; exit 1; }
export PYTHONPATH="/tmp/site:$PWD"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/host.txt"
python3 -c "import torch; print('torch', torch.__version__, 'CUDA', torch.version.cuda, '|', torch.cuda.device_count(), \
'GPU(s) |', len(__import__('os').sched_getaffinity(0)), 'cores')" | tee -a "$OUT/host.txt"

RUNS=$(mktemp -d)
if command -v make >/dev/null; then
    gpu_check=(make --no-print-directory gpu-check GPU_PYTHON=python3 GPU_CHECK_ARGS="--out $RUNS/check")
else  # the recipe make would run
    gpu_check=(python3 -m bench.gpu_check --out "$RUNS/check")
fi
timeout 330 "${gpu_check[@]}" 2>&1 | tee "$OUT/gpu-check.txt"
check=${PIPESTATUS[0]}

echo "charlm, 300 iterations, 4 stage processes on one GPU, real device time:"
timeout 150 python3 -m rlpipe.cli run --model charlm --stages 4 --iterations 300 --interval 20 --device-time real \
    --log "$RUNS/charlm.jsonl" 2>&1 | tail -n 25 | tee "$OUT/charlm.txt"
charlm=${PIPESTATUS[0]}
python3 -m rlpipe.cli report "$RUNS/charlm.jsonl" --output "$RUNS/charlm-report" >/dev/null 2>&1 \
    && tee "$OUT/charlm-summary.md" < "$RUNS/charlm-report/summary.md"
tar -czf "$OUT/runs.tar.gz" -C "$RUNS" . 2>/dev/null
echo "gpu_host: gpu-check exit $check, charlm run exit $charlm"
[ "$check" -eq 0 ] && [ "$charlm" -eq 0 ]
