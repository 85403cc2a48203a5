#!/usr/bin/env bash
# The GPU benchmarks and examples on one machine without network (see tools/gpu-tests.sh for the
# environment). Usage: bash tools/gpu-bench.sh [rma] [collectives] [trace] [examples]
# [ccl] [ccl_groups] [ccl_host] [call_check] [fused] [tp_mlp] [norm] [moe] [p2p] [torch_backend] (no argument: rma collectives trace examples; the
# others only when named). COLL_WORLDS, CCL_WORLDS, CHECK_WORLDS, EX_WORLDS, FUSED_WORLDS, MLP_WORLDS, NORM_WORLDS,
# MOE_WORLDS and TB_WORLDS (torch_backend) set the world sizes (p2p: 2 ranks; GROUP_SIZES the group sizes of ccl_groups, 8 ranks), EX_ONLY a subset of the examples ("02 03"), RMA_ARGS, COLL_ARGS,
# CCL_ARGS, CHECK_ARGS, FUSED_ARGS, MLP_ARGS, NORM_ARGS, MOE_ARGS, P2P_ARGS and TB_ARGS more arguments of each benchmark; ccl tunes and rewrites its selection table unless CCL_TUNE=0.
# call_check launches its own jobs (ccl.py with IRIS_CHECK_CALLS=1 and =0) through $MPI (IRIS_MPIEXEC), 20 min per world size at most.
# Results go to benchmarks/results/ and docs/tracing/, logs to $OUT if set. What each benchmark
# measures, and the commands behind the committed results: docs/performance.md.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD/packages/iris-device/src:$PWD/packages/iris-runtime/src:$PWD/packages/iris-collectives/src${PYTHONPATH:+:$PYTHONPATH}"
export IRIS_BACKEND=cuda IRIS_TIMEOUT_S=${IRIS_TIMEOUT_S:-120} NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 PYTHONUNBUFFERED=1
unset TRITON_INTERPRET
mkdir -p benchmarks/results
# MPS (tools/mps.sh). A job killed while its kernels spin leaves MPS refusing new clients ("device(s)
# is/are busy or unavailable"): restart_mps after a step that failed or timed out, so later steps run.
source tools/mps.sh
start_mps
MPI="mpirun --allow-run-as-root --oversubscribe -x PYTHONPATH -x IRIS_BACKEND -x CUDA_MPS_PIPE_DIRECTORY -x CUDA_MPS_LOG_DIRECTORY -x IRIS_TIMEOUT_S -x NCCL_NVLS_ENABLE -x TORCH_SYMM_MEM_DISABLE_MULTICAST -x PYTHONUNBUFFERED"
LOG=${OUT:-/tmp}
stages=${*:-rma collectives trace examples}
want() { [[ " ${EX_ONLY:-00 01 02 03 04 07} " == *" $1 "* ]]; }  # EX_ONLY="02 03": a subset of the examples
status=0
summary=()
# A step past STEP_TIMEOUT gets SIGTERM (mpirun passes it to the ranks), and SIGKILL 10 s later.
step() { local name=$1; shift; echo "=== $name: $*"; local t0=$SECONDS; timeout -k 10 "${STEP_TIMEOUT:-300}" "$@" 2>&1 | tee -a "$LOG/$name.log"; local rc=${PIPESTATUS[0]}; echo "=== $name rc=$rc $((SECONDS - t0)) s"; summary+=("$(printf '%-16s %4s %5s s' "$name" "$rc" "$((SECONDS - t0))")"); [ "$rc" = 0 ] || { status=1; restart_mps; }; }
for s in $stages; do
  case $s in
    rma) step rma $MPI -n 2 python3 -m mpi4py benchmarks/rma_bandwidth.py ${RMA_ARGS:-} ;;
    collectives) for w in ${COLL_WORLDS:-2 4 8}; do step "collectives_$w" $MPI -n "$w" python3 -m mpi4py benchmarks/tile_collectives.py ${COLL_ARGS:-}; done ;;
    trace) step trace_example $MPI -n 4 python3 -m mpi4py examples/05_tracing.py --out docs/tracing
           step trace_overhead python3 benchmarks/trace_overhead.py ;;
    examples) for w in ${EX_WORLDS:-2 4 8}; do
        want 00 && step "ex00_$w" $MPI -n "$w" python3 -m mpi4py examples/00_hello_heap.py --n 1048576
        want 01 && step "ex01_$w" $MPI -n "$w" python3 -m mpi4py examples/01_message_passing.py --n 1048576 --block 8192 --rounds 20
        want 02 && step "ex02_$w" $MPI -n "$w" python3 -m mpi4py examples/02_gemm_all_reduce.py --variant all --m 8192 --n 8192 --k-per-rank 1024 --block-m 128 --block-n 128 --block-k 64 --iters 5
        want 03 && step "ex03_$w" $MPI -n "$w" python3 -m mpi4py examples/03_gemm_all_gather.py --m 8192 --n 8192 --k 8192 --block-m 128 --block-n 128 --block-k 64 --iters 5
        want 04 && step "ex04_$w" $MPI -n "$w" python3 -m mpi4py examples/04_tp_mlp.py --m 8192 --hidden 8192 --intermediate 28672 --iters 10
        want 07 && step "ex07_$w" $MPI -n "$w" python3 -m mpi4py examples/07_moe.py --tokens 128 --hidden 7168 --ffn 2048 --experts 256 --top-k 8 --skew 0 --capacity-factor 2 --iters 20
      done ;;
    ccl) for w in ${CCL_WORLDS:-2}; do
        step "ccl_$w" $MPI -n "$w" python3 -m mpi4py benchmarks/ccl.py $([ "${CCL_TUNE:-1}" = 1 ] && echo --write-table) ${CCL_ARGS:-}
      done ;;
    ccl_groups) for g in ${GROUP_SIZES:-2 4}; do
        step "ccl_groups_8_g$g" $MPI -n 8 python3 -m mpi4py benchmarks/ccl.py --group-size "$g" ${CCL_ARGS:-}
      done ;;
    ccl_host) step ccl_host $MPI -n 2 python3 -m mpi4py benchmarks/ccl.py --host ;;
    call_check) for w in ${CHECK_WORLDS:-2 4}; do
        IRIS_MPIEXEC="$MPI" STEP_TIMEOUT=${STEP_TIMEOUT:-1200} step "call_check_$w" python3 benchmarks/call_check.py --ranks "$w" ${CHECK_ARGS:-}
      done ;;
    fused) for w in ${FUSED_WORLDS:-2 4}; do
        step "fused_$w" $MPI -n "$w" python3 -m mpi4py benchmarks/fused_ops.py ${FUSED_ARGS:-}
      done ;;
    tp_mlp) for w in ${MLP_WORLDS:-2 4}; do
        step "tp_mlp_$w" $MPI -n "$w" python3 -m mpi4py benchmarks/fused_ops.py --mlp ${MLP_ARGS:-}
      done ;;
    norm) for w in ${NORM_WORLDS:-2 4 8}; do
        step "norm_$w" $MPI -n "$w" python3 -m mpi4py benchmarks/fused_norm.py ${NORM_ARGS:-}
      done ;;
    moe) for w in ${MOE_WORLDS:-2 4 8}; do
        step "moe_$w" $MPI -n "$w" python3 -m mpi4py benchmarks/moe.py ${MOE_ARGS:-}
      done ;;
    p2p) step p2p_2 $MPI -n 2 python3 -m mpi4py benchmarks/p2p.py ${P2P_ARGS:-} ;;
    torch_backend) for w in ${TB_WORLDS:-2 4 8}; do
        step "torch_backend_$w" $MPI -n "$w" python3 -m mpi4py benchmarks/torch_backend.py ${TB_ARGS:-}
      done ;;
    *) echo "unknown stage $s"; status=2 ;;
  esac
done
echo; printf '%-16s %4s %7s\n' step rc time; printf '%s\n' "${summary[@]}"  # 124/137: timed out
# Pack every result the steps wrote or changed (and a rewritten selection table) into one archive
# under $OUT, to unpack at the repository root of the checkout the results belong to.
if [ -n "${OUT:-}" ] && git rev-parse --git-dir >/dev/null 2>&1; then
  git ls-files -m -o --exclude-standard benchmarks/results docs packages | tar czf "$OUT/results.tgz" -T - \
    && echo "packed $(tar tzf "$OUT/results.tgz" | wc -l) changed files into \$OUT/results.tgz"
fi
exit $status
