#!/usr/bin/env bash
# Train on every worker of a Cloud TPU VM pod slice (one JAX process per TPU VM host).
#
#   launch/tpu_pod.sh TPU_NAME ZONE CONFIG WORKDIR [--config.x=y ...]
#   launch/tpu_pod.sh my-v5p-64 us-east5-a configs/aogpt_small.py /mnt/shared/aogpt_small
#
# WORKDIR must be one folder that every host sees (a Filestore/NFS mount or a gcsfuse-mounted
# bucket): all hosts write their shards of each checkpoint into it. The repository must already
# be at ~/aogpt_jax on every worker (see launch/README.md for the one-time set-up); rerunning the
# same command resumes from the newest checkpoint.
# Before the first step every process logs one line with the mesh and XLA's per-device memory
# estimate of the compiled train step; this script waits for worker 0's and prints it
# (AOGPT_WAIT_S, default 1800 s; 0 = do not wait).
set -euo pipefail
if [[ $# -lt 4 ]]; then
  sed -n '2,14p' "$0"; exit 2
fi
TPU_NAME=$1; ZONE=$2; CONFIG=$3; WORKDIR=$4; shift 4
EXTRA=""
for a in "$@"; do EXTRA+=" $(printf '%q' "$a")"; done
# AOGPT_DISTRIBUTED=1: jax.distributed.initialize() auto-detects the pod's coordinator.
# nohup + log per host, so a dropped ssh session does not kill training.
gcloud compute tpus tpu-vm ssh "$TPU_NAME" --zone "$ZONE" --worker=all --command "
  cd ~/aogpt_jax && . .venv/bin/activate &&
  AOGPT_DISTRIBUTED=1 nohup python -m aogpt_jax.main --config=$CONFIG --workdir=$WORKDIR $EXTRA \
    > ~/aogpt_train_\$(hostname).log 2>&1 &
  echo started on \$(hostname)"
WAIT=${AOGPT_WAIT_S:-1800}
if [[ $WAIT != 0 ]]; then
  echo "waiting for the mesh and memory estimate (compiling; Ctrl-C does not stop training)..."
  gcloud compute tpus tpu-vm ssh "$TPU_NAME" --zone "$ZONE" --worker=0 --command "
    timeout $WAIT bash -c 'until grep -h -m1 \"train step memory estimate\" ~/aogpt_train_*.log; do
      sleep 10; done'" || echo "no memory line yet: see ~/aogpt_train_<host>.log on worker 0"
fi
