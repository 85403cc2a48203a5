#!/usr/bin/env bash
# GPU test command for a machine without network where torch, triton, mpi4py, cuda-bindings and
# pytest are preinstalled (see FACTS.md): runs every package's multi-rank tests on the cuda
# backend, several ranks on one GPU under MPS. Usage: bash tools/gpu-tests.sh [pytest args]
# GPU_TESTS_DEADLINE_S=540 ends pytest with SIGINT once it has run that long: it kills the MPI job
# it is running (in a process group of its own) and prints the summary of what ran, so that a run
# under an outer time limit still reports. A plain `timeout` around this script ends the shell but
# not the job, whose ranks keep the output pipe open: nothing is reported until the job ends.
# For the same reason send the output to a file, not into a pipe (`| tail`): a job that outlives
# pytest (its SIGKILL, 30 s after the deadline) would hold the pipe, and what was printed with it.
# The whole suite at 2 and 4 ranks takes about 25 minutes on one H100 or H200 (2026-12-05):
# IRIS_TEST_SHARD=1/4 .. 4/4 run it in quarters of 4 to 9 minutes (tools/pytest_shard.py; a test
# function's world sizes stay together; shards 1/4 and 3/4 together are 1/2), and
# IRIS_TEST_RESUME_AT=<part of a node id> goes on with a shard from the test where a deadline
# stopped it. Pass -v to see which test runs; a job that the deadline interrupts prints the end of
# its output (iris.runtime.testing).
# Run one such command at a time on a GPU: the grid rule (iris.runtime._residency) counts the ranks
# of one job, so the waiting kernels of several jobs at once need not all fit. With four at once on
# one H100 (2026-12-05), test_torch_ops_scenarios[4] had not ended after 450 s; alone it took 50 s.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD/packages/iris-device/src:$PWD/packages/iris-runtime/src:$PWD/packages/iris-collectives/src${PYTHONPATH:+:$PYTHONPATH}"
export IRIS_BACKEND=cuda
export IRIS_TEST_WORLD_SIZES="${IRIS_TEST_WORLD_SIZES:-1,2,4}"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
unset TRITON_INTERPRET

# MPS: several ranks on one GPU (tools/mps.sh; IRIS_NO_MPS=1 runs without it).
source tools/mps.sh
[ -z "${IRIS_NO_MPS:-}" ] && start_mps

# The sm_90 compile/PTX checks run without a GPU and already run in CI: skip them here unless asked.
skip_compile=(--ignore-glob='*test_*compile*.py' -k 'not sm90')
[ -n "${IRIS_GPU_COMPILE_CHECKS:-}" ] && skip_compile=()
if [ $# -eq 0 ]; then set -- packages/iris-runtime/tests packages/iris-device/tests packages/iris-collectives/tests tests; fi
deadline=()
[ -n "${GPU_TESTS_DEADLINE_S:-}" ] && deadline=(timeout -s INT -k 30 "$GPU_TESTS_DEADLINE_S")
# --durations=25: the summary lists the 25 slowest tests (the whole suite at 2 and 4 ranks runs
# for over 10 minutes on one H200).
PYTHONPATH="$PWD/tools:$PYTHONPATH" "${deadline[@]}" python3 -m pytest -p pytest_shard -p pytest_suite_summary --durations=25 "${skip_compile[@]}" "$@"
