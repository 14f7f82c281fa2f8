#!/usr/bin/env bash
# A real zbrl run on one GPU shared by the producer and the consumer (0.5 GPU each), with the
# weights handed over through the object store and then through CUDA IPC
# (transport.weight_sync.type=cuda_ipc), on a randomly initialised Llama-shaped model of about
# 0.39B parameters (24 layers, hidden 896, MLP 4864; the embedded character tokenizer) in bf16
# compute over fp32 masters, on the embedded task. Prints one line per path from summary.json:
# weight-sync latency (publish to loaded), seconds per step, overlap efficiency.
#
# On the lent GPU machine (carry .device), from the project root:
#   bash .device/setup.sh && export PYTHONPATH=/tmp/site:$PWD/src && bash bench/gpu_real_run.sh
# Options through the environment: STEPS (default 12), SIZE ("0.39b", or "tiny" for a CPU check).
set -uo pipefail
out=${OUT:-/tmp/gpu_real_run}; mkdir -p "$out"
py=${PYTHON:-python3}
steps=${STEPS:-12}; size=${SIZE:-0.39b}
export RAY_USAGE_STATS_ENABLED=0 PYTHONUNBUFFERED=1
model=/tmp/zbrl-gpu-model-$size
if [ "$size" = tiny ]; then arch="{}"; gpus=0; dtype=float32
else arch="dict(hidden_size=896, num_layers=24, num_heads=14, intermediate_size=4864)"; gpus=0.5; dtype=bfloat16; fi
[ -d "$model" ] || $py -c "from zbrl.embedded.tiny_model import create_embedded_model as c; c('$model', **$arch)"
for sync in object_store cuda_ipc; do
  run=$out/run-$sync; rm -rf "$run"
  timeout 300 $py -m zbrl.cli train recipes/demo.yaml model.path="$model" model.dtype=$dtype \
    data.allow_embedded_task_with_user_model=true eval.sets={} training.max_steps="$steps" \
    rollout.generation.max_new_tokens=128 rollout.inference_batch_size=16 \
    rollout.inference_microbatch_size=16 training.train_batch_size=16 training.train_microbatch_size=32 \
    launch.producer_num_gpus=$gpus launch.consumer_num_gpus=$gpus launch.torch_threads=4 \
    transport.weight_sync.type=$sync logging.run_dir="$run" logging.save_interval=0 >"$out/$sync.log" 2>&1
  echo "$sync: rc $?"; tail -3 "$out/$sync.log"
  [ -f "$run/summary.json" ] && cp "$run/summary.json" "$out/summary-$sync.json"
done
$py - "$out" <<'PY'
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
print("| weight sync | p50 s | p95 s | bytes/version | s/step (gen, train) | overlap |")
print("|---|---|---|---|---|---|")
for sync in ("object_store", "cuda_ipc"):
    f = out / f"summary-{sync}.json"
    if not f.exists():
        print(f"| {sync} | no summary | | | | |"); continue
    s = json.loads(f.read_text()); o = s["overlap"] or {}
    def f3(x): return "-" if x is None else f"{x:.3f}"
    print(f"| {sync} | {f3(s['weight_sync_latency_p50_s'])} | {f3(s['weight_sync_latency_p95_s'])} | "
          f"{s['weight_sync_bytes_per_version']} | {f3(o.get('generation_s_per_step'))}, "
          f"{f3(o.get('training_s_per_step'))} | {f3(s['overlap_efficiency'])} |")
PY
