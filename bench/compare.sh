#!/bin/bash
# Alternates two addons scenario by scenario, each run in a fresh process:
#   BEFORE=/path/to/old.node bash bench/compare.sh [REPS] [scenarios...]
# (build the old addon from a worktree of the older commit; `after` is this
# checkout's). One JSON line per run on stdout.
set -e
cd "$(dirname "$0")/.."
: "${BEFORE:?set BEFORE to the addon to compare against}"
reps=${1:-2}; shift || true
scenarios=${*:-pair q2k free ngram grammar par4 par8}
for r in $(seq 1 "$reps"); do
  for sc in $scenarios; do
    node bench/compare.mjs "$sc"
    LLAMA_ENGINE_ADDON="$BEFORE" node bench/compare.mjs "$sc"
  done
done
