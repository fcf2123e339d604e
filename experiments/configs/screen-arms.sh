#!/usr/bin/env bash
# Issue 60's arms by name, one after another, in one lane: the seeds and the second direction
# of the screening that screen-muon-ema.sh began. A name says what the arm trains:
#
#   DIRECTION-ARM-STEPS-sSEED   deen | ende;  adam | muonXeY[nsN] (Muon's peak rate, and its
#                               Newton–Schulz steps where not 5) | emaD (decay)
#
# e.g. deen-muon4e3-1200-s2 is de→en, Muon at peak rate 4e-3, 1,200 steps, train.seed 2, and
# deen-muon4e3ns3-980-s1 the same with 3 Newton–Schulz steps, 980 steps, seed 1. Each
# arm trains at one thread, starts afresh or resumes from its last.safetensors, and a finished
# arm has nothing to do, so the same command continues an interrupted lane. Two lanes (two
# commands, each in the background) keep a 2-core machine's cores busy; the figures compared
# are validation BLEU at equal steps, which the lanes' sharing of the machine does not move.
#
#   nohup bash experiments/configs/screen-arms.sh /work/sweep-runs/screen \
#     deen-muon8e3-1200-s1 deen-adam-1200-s2 >> /work/sweep-runs/lane-a.log 2>&1 &
set -u
out=${1:?usage: screen-arms.sh OUT_DIR ARM...}
shift
repo=$(cd "$(dirname "$0")/../.." && pwd)
export PYTHONPATH=$repo
mkdir -p "$out"

for name in "$@"; do
  IFS=- read -r direction recipe steps seed <<<"$name"
  case $direction in
    deen) langs=(--src de --tgt en) ;;
    ende) langs=(--src en --tgt de) ;;
    *) echo "$name: direction $direction is not deen or ende" >&2; exit 2 ;;
  esac
  case $recipe in
    adam) sets=() ;;
    muon*)
      rate=${recipe#muon} ns=
      [[ $rate == *ns* ]] && ns=${rate#*ns} rate=${rate%%ns*}
      sets=(--set train.optimizer=muon --set "train.muon_lr=${rate/e/e-}")
      [ -n "$ns" ] && sets+=(--set "train.muon_ns_steps=$ns") ;;
    ema*) sets=(--set "train.ema=${recipe#ema}") ;;
    *) echo "$name: recipe $recipe is not adam, muonXeY[nsN] or emaD" >&2; exit 2 ;;
  esac
  resume=()
  [ -f "$out/$name/last.safetensors" ] && resume=(--resume)
  echo "$(date -u +%FT%TZ) $name: begins ${resume[*]:-afresh} at $(git -C "$repo" rev-parse HEAD)"
  python -m seq2seq train --out "$out/$name" --no-progress "${langs[@]}" \
    --max-steps "$steps" --set "train.seed=${seed#s}" --set train.threads=1 "${sets[@]}" "${resume[@]}"
  echo "$(date -u +%FT%TZ) $name: exit $?"
done
