#!/usr/bin/env bash
# A/B of matmul_reduce_scatter's tile order (#14: 0.84-0.88x of cuBLAS + ccl at 4 ranks on one H200,
# at parity at 2). The shipped kernel walks the chunks in the same order on every rank (chunk 0
# first), so the owner of the chunk in hand waits for every peer's partial while its programs hold
# their SMs. The copy "own_last" (tools/patched_tree.py) starts rank r at chunk r + 1 and ends with
# its own chunk, whose partials the peers handed over long before. Both run benchmarks/fused_ops.py
# in turn, in one job step. Usage (the GPU machine, environment as tools/gpu-bench.sh sets it):
#   FUSED_RANKS=4 bash tools/mrs-order-ab.sh [fused_ops.py args]   (default: --m 4096,16384 --reps 10)
# AB_CHECK=1: instead, run the ops' multi-rank tests on the copy (the cpu backend, this machine).
set -euo pipefail
cd "$(dirname "$0")/.."
copy=${AB_ROOT:-/tmp/iris-mrs-ab}/own_last
src=$(python3 tools/patched_tree.py "$copy" packages/iris-collectives/src/iris/collectives/ops/_matmul_reduce_scatter.py \
"    for t in range(tl.program_id(0), world_size * per_chunk, tl.num_programs(0)):
        owner = t // per_chunk
" \
"    for i in range(tl.program_id(0), world_size * per_chunk, tl.num_programs(0)):
        t = ((i // per_chunk + rank + 1) % world_size) * per_chunk + i % per_chunk  # own chunk last
        owner = t // per_chunk
")
# the copy's packages first: they shadow the repository's on PYTHONPATH
if [ -n "${AB_CHECK:-}" ]; then
  PYTHONPATH="$src:${PYTHONPATH:-}" python3 -m pytest -q -p no:cacheprovider --rootdir "$copy" \
    "$copy/packages/iris-collectives/tests/test_ops_multirank.py" -k scenarios
  exit
fi
[ $# -eq 0 ] && set -- --ops matmul_reduce_scatter --m 4096,16384 --reps 10 --warmup 2
# tools/gpu-bench.sh passes its mpirun (with the MPS and iris variables) in IRIS_MPIEXEC
MPI=${IRIS_MPIEXEC:-mpirun --allow-run-as-root --oversubscribe -x PYTHONPATH -x IRIS_BACKEND}
for name in shipped own_last; do
  path=${PYTHONPATH:-}; [ "$name" = own_last ] && path="$src:$path"
  echo "=== $name"
  PYTHONPATH="$path" $MPI -n "${FUSED_RANKS:-4}" python3 -m mpi4py benchmarks/fused_ops.py "$@" \
    --out "benchmarks/results/mrs_order_ab/$name"
done
