#!/usr/bin/env bash
# Runs tools/gpu-bench.sh stages round after round on one MPS daemon, the way the stalls of
# benchmarks/NOTES.md were seen, until a step hangs or fails (or ROUNDS rounds pass), and prints
# a table of every step of every round. A hung benchmark rank ends itself after --hang-seconds
# with its Python stacks and the flags it waited on (the benchmark's watchdog); what is still
# alive when a step hits STEP_TIMEOUT gets SIGUSR1 first (Python stacks) and is killed after.
#
#   ROUNDS=10 COLL_WORLDS="2 4 8" COLL_ARGS="--graph 20 ..." STEP_TIMEOUT=120 bash tools/hang-loop.sh
#
# ROUNDS (10), STOP_ON_FAIL (1: stop at the first failing step), DEADLINE_S (stop starting rounds
# after this many seconds), STAGES (collectives); logs go to $OUT/hang-loop (or /tmp/hang-loop).
set -uo pipefail
cd "$(dirname "$0")/.."
export CUDA_MPS_PIPE_DIRECTORY=${CUDA_MPS_PIPE_DIRECTORY:-/tmp/mps_pipe} CUDA_MPS_LOG_DIRECTORY=${CUDA_MPS_LOG_DIRECTORY:-/tmp/mps_log}
mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
# One daemon for every round (gpu-bench.sh reuses a running one): the stalls depended on what had
# run before on the same daemon.
nvidia-cuda-mps-control -d 2>/dev/null && trap 'echo quit | nvidia-cuda-mps-control' EXIT
logs=${OUT:-/tmp}/hang-loop
mkdir -p "$logs"
rounds=${ROUNDS:-10}
deadline=$((SECONDS + ${DEADLINE_S:-86400}))
table=()
failed=0
for round in $(seq 1 "$rounds"); do
  if [ "$SECONDS" -ge "$deadline" ]; then echo "=== DEADLINE_S reached: $((round - 1)) rounds run"; break; fi
  echo "=== round $round"
  OUT=$logs bash tools/gpu-bench.sh ${STAGES:-collectives} > "$logs/round.log" 2>&1
  rc=$?
  # gpu-bench.sh ends with its table of steps: "name rc seconds"
  while read -r name step_rc secs _; do
    table+=("$(printf '%5s %-16s %4s %5s' "$round" "$name" "$step_rc" "$secs")")
  done < <(sed -n '/^step  *rc  *time$/,$p' "$logs/round.log" | tail -n +2)
  cat "$logs/round.log" >> "$logs/all-rounds.log"
  if [ "$rc" != 0 ]; then
    failed=$((failed + 1))
    echo "=== round $round failed (gpu-bench.sh rc=$rc); its log: $logs/all-rounds.log"
    [ "${STOP_ON_FAIL:-1}" = 1 ] && break
  fi
done
echo
printf '%5s %-16s %4s %5s\n' round step rc seconds
printf '%s\n' "${table[@]}"
echo "rounds with a failing step: $failed"
[ "$failed" = 0 ]
