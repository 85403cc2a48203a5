#!/usr/bin/env bash
# GPU test command for a machine without network where torch, triton, mpi4py, cuda-bindings and
# pytest are preinstalled (see FACTS.md): runs every package's multi-rank tests on the cuda
# backend, several ranks on one GPU under MPS. Usage: bash tools/gpu-tests.sh [pytest args]
#
# Side by side: with no IRIS_TEST_SHARD, the suite runs in IRIS_GPU_PARALLEL (default 6) pytest
# processes at once that share its tests out as they go (IRIS_TEST_CLAIMS, tools/pytest_shard.py:
# a process that is done takes the next test nobody took), their MPI jobs sharing the GPU; the residency
# rule then divides the SMs among every rank of every job (IRIS_GPU_RANKS, set here to the shards
# times the largest world size), so that waiting kernels of different jobs cannot starve each
# other. Most of a job's time is on the CPU (start-up, Triton and inductor compilation), which
# the machine's cores run side by side. IRIS_GPU_PARALLEL=1 runs one shard at a time.
# The tests marked gpu_fault (a job that ends on purpose: under MPS the fault can end every job on
# the GPU) run after the others, side by side again but without MPS.
# Each shard's output goes to $IRIS_GPU_LOGS (default a temporary folder); what failed and each
# shard's summary are printed at the end, then one line: card, commit, counts, seconds.
#
# GPU_TESTS_DEADLINE_S=540 ends each pytest with SIGINT once it has run that long: it kills the MPI
# job it is running (in a process group of its own) and prints the summary of what ran, so that a
# run under an outer time limit still reports. A plain `timeout` around this script ends the shell
# but not the job, whose ranks keep the output pipe open: nothing is reported until the job ends.
# For the same reason send the output to a file, not into a pipe (`| tail`).
# IRIS_TEST_SHARD=i/n runs one shard in this process (tools/pytest_shard.py; a test function's
# world sizes stay together), IRIS_TEST_RESUME_AT=<part of a node id> goes on with a shard from the
# test where a deadline stopped it. IRIS_TEST_TIMINGS=<folder> records where the time goes
# (tools/suite_timings.py prints it at the end). IRIS_GPU_CACHE=<folder> keeps Triton's and
# inductor's compiled kernels there (carry it to the next run for a warm start); unset, a fresh
# machine compiles everything (cold caches).
# Compiling: every process records the kernels it compiles (IRIS_KERNEL_RECORD, in $logs/kernel-records),
# merged at the end into $logs/kernels.json.gz, a manifest. IRIS_GPU_PRECOMPILE=1 starts the run by
# compiling the manifest kept in the tree (tools/gpu-kernels.json.gz, tools/gpu-kernels-eight.json.gz
# for --eight: a copy of an earlier run's kernels.json.gz) on every core beside the tests (python -m
# iris.runtime.precompile): a job then finds kernels compiled, or waits for one being compiled, instead
# of compiling them one by one. Off by default until a run has shown what it saves.
# `bash tools/gpu-tests.sh --faults [pytest args]`: the gpu_fault phase alone.
# `bash tools/gpu-tests.sh --eight [pytest args]`: the 8-rank scenarios of the collectives (every
# test function of the collectives, the ops, their torch operators and the device primitives that
# takes its world sizes from IRIS_TEST_WORLD_SIZES), 2 processes side by side.
set -uo pipefail
cd "$(dirname "$0")/.."
eight=""
faults_only=""
if [ "${1:-}" = "--faults" ]; then  # only the gpu_fault phase (without MPS)
  shift
  faults_only=1
fi
if [ "${1:-}" = "--eight" ]; then
  shift
  export IRIS_TEST_WORLD_SIZES=8 IRIS_GPU_PARALLEL=${IRIS_GPU_PARALLEL:-2}
  eight="test_ccl_scenarios or test_ccl_cuda_graph_replays or test_collectives_scenarios or test_range_scenarios"
  eight+=" or test_ops_scenarios or test_ops_cuda_graph_replays or test_promises or test_torch_ops_scenarios"
  eight+=" or test_every_primitive_every_peer or test_exchanges_in_cuda_graph"
  default_paths=(packages/iris-collectives/tests packages/iris-device/tests/test_device_multirank.py)
fi
export PYTHONPATH="$PWD/packages/iris-device/src:$PWD/packages/iris-runtime/src:$PWD/packages/iris-collectives/src${PYTHONPATH:+:$PYTHONPATH}"
export IRIS_BACKEND=cuda
# 1 rank: the cpu suite covers it (the same host code; one rank's kernels wait for no peer)
export IRIS_TEST_WORLD_SIZES="${IRIS_TEST_WORLD_SIZES:-2,4}"
# Product loops (dtypes x ops x strategies) run each case once, at one of the world sizes
# (iris.runtime.testing.spread): every case is a kernel that each rank compiles, and the cpu suite
# runs every case at every world size. IRIS_TEST_SPREAD_CASES=0 runs them all at each.
export IRIS_TEST_SPREAD_CASES="${IRIS_TEST_SPREAD_CASES:-1}"
# The workers with the most scenarios run as 3 jobs per world size (iris.runtime.testing.scenario_params),
# which the side-by-side processes take at once: one job of them all was the suite's longest (4 min).
export IRIS_TEST_SCENARIO_PARTS="${IRIS_TEST_SCENARIO_PARTS:-3}"
# The randomised stress: 24 cases per world size (each a kernel of its own; every collective is
# drawn), not CI's 100/60/40: what the GPU adds is kernels racing each other, not more shapes.
export IRIS_STRESS_CASES="${IRIS_STRESS_CASES:-24}"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
# every rank of every job compiles the same kernels: one compiles, the others load it from the cache
export IRIS_COMPILE_LOCK=1
# Open MPI's ranks poll while they wait (a barrier while a peer compiles): let them yield the core to
# the processes that compile.
export OMPI_MCA_mpi_yield_when_idle=1
unset TRITON_INTERPRET
if [ -n "${IRIS_GPU_CACHE:-}" ]; then
  mkdir -p "$IRIS_GPU_CACHE/triton" "$IRIS_GPU_CACHE/inductor"
  export TRITON_CACHE_DIR="$IRIS_GPU_CACHE/triton" TORCHINDUCTOR_CACHE_DIR="$IRIS_GPU_CACHE/inductor"
fi

# MPS: several ranks on one GPU (tools/mps.sh; IRIS_NO_MPS=1 runs without it).
source tools/mps.sh
[ -z "${IRIS_NO_MPS:-}" ] && start_mps

# The sm_90 compile/PTX checks run without a GPU and already run in CI: skip them here unless asked.
skip_compile=(--ignore-glob='*test_*compile*.py' -k "not sm90${eight:+ and ($eight)}")
[ -n "${IRIS_GPU_COMPILE_CHECKS:-}" ] && skip_compile=(${eight:+-k "$eight"})
# Without a test path among the arguments: every package's tests, the heaviest folders first
# (processes that share tests out as they go end together when the long tests are not left for last).
[ -z "$eight" ] && default_paths=(packages/iris-collectives/tests tests packages/iris-device/tests packages/iris-runtime/tests)
has_path=0
for arg in "$@"; do [ -e "${arg%%::*}" ] && has_path=1; done
[ "$has_path" = 0 ] && set -- "$@" "${default_paths[@]}"
deadline=()
[ -n "${GPU_TESTS_DEADLINE_S:-}" ] && deadline=(timeout -s INT -k 30 "$GPU_TESTS_DEADLINE_S")
export PYTHONPATH="$PWD/tools:$PYTHONPATH"
plugins=(-p pytest_shard -p pytest_suite_summary)

parallel=${IRIS_GPU_PARALLEL:-6}
if [ -n "${IRIS_TEST_SHARD:-}" ] || [ "$parallel" -le 1 ]; then
  # --durations=25: the summary lists the 25 slowest tests
  "${deadline[@]}" python3 -m pytest "${plugins[@]}" --durations=25 "${skip_compile[@]}" "$@"
  exit $?
fi

largest=$(tr ',' '\n' <<<"$IRIS_TEST_WORLD_SIZES" | sort -n | tail -1)
export IRIS_GPU_RANKS=$((parallel * largest))
logs=${IRIS_GPU_LOGS:-$(mktemp -d /tmp/iris-gpu-tests.XXXXXX)}
mkdir -p "$logs"
export IRIS_SUITE_RESULTS="$logs/results"
export IRIS_TEST_CLAIMS="$logs/claims"
rm -rf "$IRIS_SUITE_RESULTS" "$IRIS_TEST_CLAIMS"
echo "=== $parallel processes side by side, IRIS_GPU_RANKS=$IRIS_GPU_RANKS, logs in $logs"
start=$(date +%s)
# How busy the machine's cores are through the run (is the suite bound by its CPUs or by waits?):
# every 10 s, vmstat's user/system/idle/wait percentages and the run queue, into $logs/vmstat.log.
vmstat_pid=""
if command -v vmstat >/dev/null; then vmstat -n 10 >"$logs/vmstat.log" 2>&1 & vmstat_pid=$!; fi
export IRIS_KERNEL_RECORD="$logs/kernel-records"
rm -rf "$IRIS_KERNEL_RECORD"
manifest=tools/gpu-kernels${eight:+-eight}.json.gz
precompile_pid=""
if [ "${IRIS_GPU_PRECOMPILE:-0}" = 1 ] && [ -f "$manifest" ]; then
  # beside the tests: a kernel one of them needs meanwhile waits for its compile lock, not compiled twice
  IRIS_KERNEL_RECORD="" python3 -m iris.runtime.precompile "$manifest" --jobs "${IRIS_GPU_PRECOMPILE_JOBS:-$(nproc)}" \
    >"$logs/precompile.log" 2>&1 &
  precompile_pid=$!
fi
pids=()
# First every test but the gpu_fault ones, side by side.
for i in $( [ -z "$faults_only" ] && seq 1 "$parallel"); do
  IRIS_TEST_PROCESS="$i-of-$parallel" "${deadline[@]}" python3 -m pytest "${plugins[@]}" --durations=10 \
    -m "not gpu_fault" "${skip_compile[@]}" "$@" >"$logs/shard-$i.log" 2>&1 &
  pids+=($!)
done
status=0
for pid in "${pids[@]}"; do wait "$pid" || status=1; done
[ -n "$precompile_pid" ] && { wait "$precompile_pid"; tail -n 6 "$logs/precompile.log"; }
# Then the gpu_fault tests: each ends a job on purpose (a device assert, the watchdog, a crash), and
# a rank may end while a peer's kernel still reads its heap; under MPS the fault that follows ends
# every job sharing the GPU. So they run after the others, without MPS: each process has a context
# of its own, which a fault in another cannot touch (their kernels take turns on the GPU, which
# these tests, waiting on watchdogs rather than on bandwidth, do not mind). Side by side again.
# The deadline is the whole run's: this phase gets what the first left (at least 120 s).
fault_deadline=()
if [ -n "${GPU_TESTS_DEADLINE_S:-}" ]; then
  left=$(( GPU_TESTS_DEADLINE_S - ($(date +%s) - start) ))
  fault_deadline=(timeout -s INT -k 30 $(( left > 120 ? left : 120 )))
fi
[ -z "${IRIS_NO_MPS:-}" ] && { stop_mps; started_mps=0; echo "=== MPS stopped for the gpu_fault tests"; }
export IRIS_TEST_CLAIMS="$logs/claims-faults"
pids=()
for i in $(seq 1 "$parallel"); do
  IRIS_TEST_PROCESS="faults-$i" "${fault_deadline[@]}" python3 -m pytest "${plugins[@]}" --durations=10 \
    -m gpu_fault "${skip_compile[@]}" "$@" >"$logs/shard-faults-$i.log" 2>&1 &
  pids+=($!)
done
for pid in "${pids[@]}"; do
  wait "$pid"
  rc=$?
  [ "$rc" = 0 ] || [ "$rc" = 5 ] || status=1  # 5: none collected (--eight has none)
done
for i in $( [ -z "$faults_only" ] && seq 1 "$parallel") $(seq -f "faults-%g" 1 "$parallel"); do
  echo "=== process $i ($logs/shard-$i.log)"
  # pytest's short summary (failures, errors, skips with -rfEs) and its last lines
  sed -n '/short test summary info/,$p' "$logs/shard-$i.log" | tail -n 40
  grep -q "short test summary info" "$logs/shard-$i.log" || tail -n 15 "$logs/shard-$i.log"
done
[ -n "$vmstat_pid" ] && kill "$vmstat_pid" 2>/dev/null
if [ -s "$logs/vmstat.log" ]; then  # the mean of vmstat's columns us, sy, id, wa (percent of all cores)
  awk '$1 ~ /^[0-9]+$/ && NR > 3 {n++; us += $13; sy += $14; id += $15; wa += $16}
       END {if (n) printf "cores: %d%% user, %d%% system, %d%% idle, %d%% waiting on I/O (mean of %d samples, vmstat.log)\n",
            us / n, sy / n, id / n, wa / n, n}' "$logs/vmstat.log"
fi
[ -n "${IRIS_TEST_TIMINGS:-}" ] && python3 tools/suite_timings.py "$IRIS_TEST_TIMINGS"
[ -d "$IRIS_KERNEL_RECORD" ] && python3 -m iris.runtime.precompile --merge "$IRIS_KERNEL_RECORD" "$logs/kernels.json.gz"
python3 tools/pytest_suite_summary.py "$IRIS_SUITE_RESULTS" "$(( $(date +%s) - start ))"
exit $status
