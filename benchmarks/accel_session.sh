#!/usr/bin/env bash
# One accelerator's checks in one call that ends by a deadline (a lent GPU's lease is short):
#   0. the MFU levers (PARTS levers, the default): benchmarks/train_step.py for AO-GPT Small and
#      GPT-2 Small (LEVER_CONFIGS), 16 x 1024 bf16, each lever on and off (LEVERS: the recipe
#      as it is, remat off, remat chosen by train.remat=auto, one microbatch), alone on the device,
#      the recipe's row with a profile; OUT/levers/*.json and a table in levers.log;
#   0b. task packing (PARTS pack, the default): benchmarks/task_packing.py on PACK_CONFIG (9x9
#      Sudoku, 8 x 256): puzzles per second by batch (256, 1024) and model.pack (1, 4);
#      OUT/packing.json and packing.log;
#   1. benchmarks/gpu_suite.sh --quick, alone on the device: AO-GPT Small's train step (MFU, memory,
#      a profile: where the step's time goes) and the sampler against the encoder MDM at n = 1024;
#   2. hard 9x9 Sudoku (PARTS hard, the default): benchmarks/hard_sudoku.py run --size=accel, the
#      8 x 256 AO-GPT and encoder MDM trained on a hard mixture (hard_frac 0.25) for RG_STEPS,
#      each solving graded held-out puzzles (HARD_PER_BUCKET per guess-count bucket 0 / 1-4 /
#      5-99) greedily and with the search: solved per bucket;
#   3. the reasoning gap at accelerator size (PARTS reasoning; benchmarks/reasoning_gap.py
#      --size=accel, the 8 x 256 model): 9x9 Sudoku (encoder MDM against AO-GPT with the query
#      block over the blanks) and the star graph (encoder MDM against AO-GPT blanks with 40%
#      right-to-left rows), the two tasks in two processes sharing the device, each stopped at
#      the deadline.
# Then packs what they wrote (benchmarks/results/gpu_suite, benchmarks/results/reasoning_gap_accel_*
# and the logs) into OUT/results.tgz (unpack it in the checkout to commit the JSONs), and the
# train step's jax.profiler trace into OUT/profile.tgz (for xprof / TensorBoard). A task still
# running at the deadline writes no result: run its reasoning_gap.py line again on the same warm
# machine (same --workdir and --steps): the trained models are reused and only solving is redone.
#
#   benchmarks/accel_session.sh                    # ~9 min on one H100 / H200
#   DEADLINE=300 RG_STEPS=2000 benchmarks/accel_session.sh
#
# Env: OUT (default ${TMPDIR:-/tmp}/aogpt_accel), DEADLINE (seconds for everything, default 555),
# RG_STEPS (training steps of every reasoning-gap model, default 2500; the configs' own are
# 20,000), RG_PUZZLES (held-out puzzles per task, default 200), SUITE_ARGS (gpu_suite.sh's
# arguments, default --quick; --dry-run proves the plumbing on a CPU), PARTS (default
# levers,pack,suite,hard; reasoning adds the reasoning gap; posttrain adds benchmarks/post_training.py
# $PT_ARGS, default --size=accel; each after the suite, beside each other), HARD_PER_BUCKET
# (default 100), HARD_ARGS (more arguments of hard_sudoku.py run, e.g. --size=cpu on a CPU),
# LEVER_CONFIGS (default configs/aogpt_small.py,configs/gpt2_small.py), LEVER_ARGS (more
# --config.* for every lever run, e.g. the tiny sizes on a CPU), LEVER_STEPS (default 10),
# PACK_CONFIG (default configs/sudoku.py), PACK_ARGS (more task_packing.py arguments, e.g.
# --batches=64 --packs=1,4 on a CPU).
set -uo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
  -h|--help) sed -n "2,$(( $(grep -n '^set -uo' "$0" | cut -d: -f1) - 1 ))p" "$0"; exit 0 ;;
  "") ;;
  *) echo "accel_session.sh: unknown argument $1 (it takes none; see --help)" >&2; exit 2 ;;
esac
START=$SECONDS
DEADLINE=${DEADLINE:-555}
RG_STEPS=${RG_STEPS:-2500}
RG_PUZZLES=${RG_PUZZLES:-200}
SUITE_ARGS=${SUITE_ARGS:---quick}
PARTS=${PARTS:-levers,pack,suite,hard}
PACK_CONFIG=${PACK_CONFIG:-configs/sudoku.py}
PACK_ARGS=${PACK_ARGS:-}
LEVER_CONFIGS=${LEVER_CONFIGS:-configs/aogpt_small.py,configs/gpt2_small.py}
LEVER_ARGS=${LEVER_ARGS:---config.batch_size=16 --config.seq_len=1024}
LEVER_STEPS=${LEVER_STEPS:-10}
HARD_PER_BUCKET=${HARD_PER_BUCKET:-100}
HARD_ARGS=${HARD_ARGS:---size=accel}
PT_ARGS=${PT_ARGS:---size=accel}
OUT=${OUT:-${TMPDIR:-/tmp}/aogpt_accel}
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
left() { echo $(( DEADLINE - (SECONDS - START) )); }
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1
  python -c 'import jax, flax; print("jax", jax.__version__, "flax", flax.__version__, jax.devices())'
} > "$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt"

part() { [[ ",$PARTS," == *",$1,"* ]]; }
if part levers; then
  budget=$(( $(left) * 35 / 100 ))
  echo "[$((SECONDS - START)) s] MFU levers: $LEVER_CONFIGS (at most $budget s)"
  mkdir -p "$OUT/levers"
  lever_end=$(( SECONDS + budget ))
  declare -A LEVER=([recipe]="" [no_remat]="--config.model.remat=False"
                    [remat_auto]="--config.train.remat=auto" [one_microbatch]="--config.microbatches=1")
  for cfg in ${LEVER_CONFIGS//,/ }; do
    name=$(basename "${cfg%%:*}" .py)
    for lever in recipe no_remat remat_auto one_microbatch; do
      rest=$(( lever_end - SECONDS ))
      (( rest > 20 )) || { echo "levers: out of time before $name $lever"; break 2; }
      prof=(); [[ $lever == recipe ]] && prof=(--profile_dir="$OUT/levers/profile_$name")
      timeout -k 10 "$rest" python benchmarks/train_step.py --config="$cfg" $LEVER_ARGS \
        ${LEVER[$lever]} --steps="$LEVER_STEPS" --warmup=2 "${prof[@]}" \
        --out="$OUT/levers/${name}__${lever}.json" >> "$OUT/levers.log" 2>&1 ||
        echo "levers: $name $lever stopped or failed (levers.log)"
    done
  done
  python - "$OUT/levers" <<'PY' | tee -a "$OUT/levers.log"
import json, pathlib, sys
print("| config | lever | step ms | tokens/s | MFU | peak GiB (XLA) | remat |")
print("|---|---|---|---|---|---|---|")
for p in sorted(pathlib.Path(sys.argv[1]).glob("*.json")):
  r = json.loads(p.read_text())["results"]
  mfu = f"{100 * r['mfu']:.1f}%" if r.get("mfu") else "n/a"
  config, lever = p.stem.split("__")
  print(f"| {config} | {lever} | {1000 * r['step_s_median']:.1f} | "
        f"{r['tokens_per_s']:,.0f} | {mfu} | {r['xla_memory']['peak_bytes'] / 2**30:.2f} | "
        f"{r['model']['remat'] and r['model']['remat_policy']} |")
PY
fi
if part pack; then
  budget=$(( $(left) * 15 / 100 ))
  echo "[$((SECONDS - START)) s] task packing: $PACK_CONFIG, batch x model.pack (at most $budget s)"
  python benchmarks/task_packing.py --config="$PACK_CONFIG" $PACK_ARGS --deadline="$budget" \
    --workdir="$OUT/packing" --out="$OUT/packing.json" > "$OUT/packing.log" 2>&1 ||
    echo "task packing failed: see packing.log"
  tail -8 "$OUT/packing.log"
fi
if part suite; then
  budget=$(( $(left) * 45 / 100 ))
  echo "[$((SECONDS - START)) s] gpu_suite $SUITE_ARGS (at most $budget s)"
  OUT="$OUT/suite" timeout "$budget" bash benchmarks/gpu_suite.sh $SUITE_ARGS > "$OUT/suite.log" 2>&1 ||
    echo "gpu_suite stopped or failed: see suite.log"
fi

budget=$(( $(left) - 25 ))
export XLA_PYTHON_CLIENT_PREALLOCATE=false     # several processes on one device
if part reasoning; then
  echo "[$((SECONDS - START)) s] reasoning gap, 9x9 Sudoku and star graph together (at most $budget s)"
  common=(--size=accel --steps="$RG_STEPS" --puzzles="$RG_PUZZLES" --speed_repeats=0
          --reference_check=0 --workdir="${TMPDIR:-/tmp}/aogpt_accel_rg")
  timeout -k 20 "$budget" python benchmarks/reasoning_gap.py --tasks=sudoku9 --variants=mdm,blanks \
    "${common[@]}" > "$OUT/rg_sudoku9.log" 2>&1 &
  timeout -k 20 "$budget" python benchmarks/reasoning_gap.py --tasks=star_graph \
    --variants=mdm,blanks_r2l "${common[@]}" > "$OUT/rg_star_graph.log" 2>&1 &
fi
if part hard; then
  echo "[$((SECONDS - START)) s] hard 9x9 Sudoku per bucket, AO-GPT and the MDM (at most $budget s)"
  timeout -k 20 "$budget" python benchmarks/hard_sudoku.py run $HARD_ARGS --steps="$RG_STEPS" \
    --per_bucket="$HARD_PER_BUCKET" --workdir="${TMPDIR:-/tmp}/aogpt_accel_hard" \
    > "$OUT/hard_sudoku.log" 2>&1 &
fi
if part posttrain; then
  echo "[$((SECONDS - START)) s] post_training $PT_ARGS (at most $budget s)"
  timeout -k 20 "$budget" python benchmarks/post_training.py $PT_ARGS \
    --workdir="${TMPDIR:-/tmp}/aogpt_accel_pt" > "$OUT/post_training.log" 2>&1 &
fi
wait
echo "[$((SECONDS - START)) s] packing"
shopt -s nullglob
tar czf "$OUT/results.tgz" "$OUT"/levers/*.json "$OUT"/levers.log "$OUT"/packing.json "$OUT"/packing.log benchmarks/results/gpu_suite benchmarks/results/reasoning_gap_accel_* \
  benchmarks/results/hard_sudoku_* \
  benchmarks/results/post_training_accel* "$OUT"/*.log "$OUT"/machine.txt "$OUT"/suite/*.json \
  "$OUT"/suite/*.log 2>/dev/null
[[ -d "$OUT/suite/profile_small" ]] && tar czf "$OUT/profile.tgz" -C "$OUT/suite" profile_small
compgen -G "$OUT/levers/profile_*" > /dev/null && tar czf "$OUT/levers_profile.tgz" -C "$OUT/levers" \
  $(cd "$OUT/levers" && ls -d profile_*)
for f in "$OUT"/rg_*.log "$OUT"/post_training.log "$OUT"/hard_sudoku.log; do
  [[ -f "$f" ]] && tail -n 6 "$f"
done
[[ -f "$OUT/suite/gpu_suite.json" ]] && sed -n '/^| measurement/,$p' "$OUT/suite.log"
echo "[$((SECONDS - START)) s] done: $OUT/results.tgz"
