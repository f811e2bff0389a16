#!/usr/bin/env bash
# Every accelerator number this project promises, in one command, on the local devices:
#   1. train-step throughput and MFU, AO-GPT Small and Medium, cuDNN attention on and off
#      (benchmarks/train_step.py; also XLA's memory estimate and the measured peak per device);
#      the Small cuDNN step is profiled: accelerator time per step by kernel group, busy and
#      idle (benchmarks/profile/trace_summary.py; the trace stays in OUT/profile_small), and
#      timed again without rematerialisation (the configs' paper recipe remats every block)
#   2. sampler speed at n = 1024, batch 32: AO-GPT KV-cached sampler vs encoder MDM and AR
#      (benchmarks/sample_speed.py)
#   3. context-order ensemble cost at n = 1024 (benchmarks/eval_cost.py)
#   4. scale_sim's XLA:CPU memory estimate of the same train steps, next to 1.'s measured peak
#      (benchmarks/scale_sim.py on one fake CPU device)
# then writes OUT/gpu_suite.json and, unless --dry-run, benchmarks/results/gpu_suite/<machine>.json,
# and prints a README-ready Markdown table (benchmarks/gpu_suite_report.py).
#
#   benchmarks/gpu_suite.sh                  # on a GPU host (H100: ~20-40 min)
#   benchmarks/gpu_suite.sh --quick          # ~3 min: Small, cuDNN only, T = 1024 only,
#                                            # diffusion and encoder, no eval_cost or scale_sim
#   benchmarks/gpu_suite.sh --dry-run        # tiny shapes on CPU in ~2 min: proves the plumbing
#   OUT=/tmp/suite TRAIN_BATCH=8 benchmarks/gpu_suite.sh
#
# Env: OUT (each part's JSON and log; default ${TMPDIR:-/tmp}/aogpt_gpu_suite), TRAIN_BATCH
# (sequences per device, default 16: the published 16 x 1024), TRAIN_STEPS (default 20).
set -euo pipefail
cd "$(dirname "$0")/.."
DRY=0
QUICK=0
for a in "$@"; do
  case "$a" in
    --dry-run) DRY=1 ;;
    --quick) QUICK=1 ;;
    -h|--help) sed -n '2,25p' "$0"; exit 0 ;;
    *) echo "gpu_suite.sh: unknown argument $a (known: --dry-run, --quick)" >&2; exit 2 ;;
  esac
done
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
OUT=${OUT:-${TMPDIR:-/tmp}/aogpt_gpu_suite}
mkdir -p "$OUT"
NDEV=$(python -c 'import jax; print(jax.local_device_count())')
PER=${TRAIN_BATCH:-16}
STEPS=${TRAIN_STEPS:-20}
if [[ $DRY == 1 ]]; then
  export JAX_PLATFORMS=cpu
  NDEV=1; PER=2; STEPS=2
  SIZES="tiny"; SEQ=32; SAMPLE=(--preset=tiny --batch=2 --length=32 --steps=4,8 --repeats=1)
  EVAL=(--preset=tiny --n=32 --max_m=2 --rank_stride=8 --repeats=1)
  ATTN="xla"; DTYPE=float32
else
  SIZES="small medium"; SEQ=1024
  SAMPLE=(--preset=small --batch=32 --length=1024 --steps=64,256,1024 --repeats=3)
  EVAL=(--preset=small --n=1024 --max_m=8 --rank_stride=16 --repeats=1)
  ATTN="cudnn xla"; DTYPE=bfloat16
  if [[ $QUICK == 1 ]]; then
    SIZES="small"; ATTN="cudnn"; STEPS=${TRAIN_STEPS:-10}
    SAMPLE=(--preset=small --batch=32 --length=1024 --steps=1024 --repeats=1
            --methods=diffusion,encoder)
  fi
fi
echo "gpu_suite: $NDEV device(s), results in $OUT (dry run: $DRY, quick: $QUICK)"

for size in $SIZES; do
  for attn in $ATTN; do
    if [[ $size == tiny ]]; then
      cfg=(--config=configs/quickstart.py --config.model.n_layer=1 --config.data.tokenizer=byte)
    else
      cfg=(--config="configs/aogpt_${size}.py")
    fi
    prof=()   # the first size's first attention is profiled
    [[ $size == "${SIZES%% *}" && $attn == "${ATTN%% *}" ]] && prof=(--profile_dir="$OUT/profile_$size")
    python benchmarks/train_step.py "${cfg[@]}" --config.model.attention_impl="$attn" \
      --config.model.dtype=$DTYPE --config.seq_len=$SEQ --config.batch_size=$((PER * NDEV)) \
      --config.microbatches=1 --config.mesh.data=-1 --steps="$STEPS" --warmup=1 "${prof[@]}" \
      --out="$OUT/train_${size}_${attn}.json" > "$OUT/train_${size}_${attn}.log" 2>&1 ||
      echo "train $size $attn failed: see $OUT/train_${size}_${attn}.log"
  done
  if [[ $size == "${SIZES%% *}" ]]; then   # the first size's step without rematerialisation
    attn=${ATTN%% *}
    python benchmarks/train_step.py "${cfg[@]}" --config.model.attention_impl="$attn" \
      --config.model.remat=False --config.model.dtype=$DTYPE --config.seq_len=$SEQ \
      --config.batch_size=$((PER * NDEV)) --config.microbatches=1 --config.mesh.data=-1 \
      --steps="$STEPS" --warmup=1 --out="$OUT/train_${size}_${attn}-noremat.json" \
      > "$OUT/train_${size}_${attn}-noremat.log" 2>&1 ||
      echo "train $size $attn without remat failed: see $OUT/train_${size}_${attn}-noremat.log"
  fi
  [[ $QUICK == 1 ]] && continue
  python benchmarks/scale_sim.py --sizes="$size" --meshes=1:single --programs=train \
    --depth="$([[ $DRY == 1 ]] && echo full || echo extrapolate)" --per_device="$PER" \
    --seq_len=$SEQ --overrides='{"attention_impl": "xla"}' \
    --out="$OUT/scale_sim_${size}.json" > "$OUT/scale_sim_${size}.log" 2>&1 ||
    echo "scale_sim $size failed: see $OUT/scale_sim_${size}.log"
done
python benchmarks/sample_speed.py --methods=diffusion,ar,encoder "${SAMPLE[@]}" --dtype=$DTYPE \
  --out="$OUT/sample_speed.json" > "$OUT/sample_speed.log" 2>&1 ||
  echo "sample_speed failed: see $OUT/sample_speed.log"
[[ $QUICK == 1 ]] || python benchmarks/eval_cost.py "${EVAL[@]}" --dtype=$DTYPE \
  --out="$OUT/eval_cost.json" > "$OUT/eval_cost.log" 2>&1 || echo "eval_cost failed: see $OUT/eval_cost.log"
python benchmarks/gpu_suite_report.py "$OUT" $([[ $DRY == 1 ]] || echo --publish)
