#!/usr/bin/env bash
# Issue 60's first screening, de→en, 1,200 steps (R1), seed 1, one thread, one run after another:
# Adam (the default recipe: the paired baseline on this machine), Muon for the layers' matrices
# at three peak learning rates, and Adam with a moving average of the weights. With
# muon_adjust_lr match_rms_adamw a matrix's Muon update has Adam's typical size at the same
# rate, so the grid brackets the default's 2e-3 by a factor of two each way. The cheap arms
# come first, so that the moving average's answer does not wait behind Muon's slower steps.
#
# Run from the checkout whose code trains (PYTHONPATH points at it). Each arm starts afresh,
# or resumes from its last.safetensors, and a finished arm has nothing to do: the same command
# continues an interrupted sweep.
#
#   nohup bash experiments/configs/screen-muon-ema.sh /work/sweep-runs/screen \
#     >> /work/sweep-runs/screen.log 2>&1 &
#
# Records, once an arm is finished (names as the earlier screens'):
#   python -m experiments.records collect /work/sweep-runs/screen/deen-adam-1200-s1 \
#     screen-deen-adam-1200-s1 --recipe "..."
set -u
out=${1:?usage: screen-muon-ema.sh OUT_DIR}
repo=$(cd "$(dirname "$0")/../.." && pwd)
export PYTHONPATH=$repo
mkdir -p "$out"

arm() {  # NAME [--set KEY=VALUE ...]
  local name=$1 resume=()
  shift
  [ -f "$out/$name/last.safetensors" ] && resume=(--resume)
  echo "$(date -u +%FT%TZ) $name: begins ${resume[*]:-afresh} at $(git -C "$repo" rev-parse HEAD)"
  python -m seq2seq train --out "$out/$name" --no-progress --src de --tgt en \
    --max-steps 1200 --set train.seed=1 --set train.threads=1 "$@" "${resume[@]}"
  echo "$(date -u +%FT%TZ) $name: exit $?"
}

arm deen-adam-1200-s1
arm deen-muon2e3-1200-s1 --set train.optimizer=muon --set train.muon_lr=2e-3
arm deen-ema0.999-1200-s1 --set train.ema=0.999
arm deen-muon4e3-1200-s1 --set train.optimizer=muon --set train.muon_lr=4e-3
arm deen-muon1e3-1200-s1 --set train.optimizer=muon --set train.muon_lr=1e-3
