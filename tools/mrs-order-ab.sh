#!/usr/bin/env bash
# A/B of matmul_reduce_scatter's tile order (#14: 0.84-0.88x of cuBLAS + ccl at 4 ranks on one H200,
# at parity at 2). The shipped kernel walks the chunks in the same order on every rank (chunk 0
# first), so the owner of the chunk in hand waits for every peer's partial while its programs hold
# their SMs. The copy "own_last" starts rank r at chunk r + 1 and ends with its own chunk, whose
# partials the peers handed over long before. Both trees run benchmarks/fused_ops.py in turn, in
# the same job step. Usage (the GPU machine, environment as tools/gpu-bench.sh sets it):
#   FUSED_RANKS=4 bash tools/mrs-order-ab.sh [fused_ops.py args]   (default: --m 4096,16384 --reps 10)
# AB_CHECK=1: instead, run the ops' multi-rank tests on the copy (the cpu backend, this machine).
set -euo pipefail
cd "$(dirname "$0")/.."
root=${AB_ROOT:-/tmp/iris-mrs-ab}
rm -rf "$root"; mkdir -p "$root/own_last"; cp -r packages "$root/own_last/"
python3 - "$root/own_last/packages/iris-collectives/src/iris/collectives/ops/_matmul_reduce_scatter.py" <<'PY'
import sys
path = sys.argv[1]
old = ("    for t in range(tl.program_id(0), world_size * per_chunk, tl.num_programs(0)):\n"
       "        owner = t // per_chunk\n")
new = ("    for i in range(tl.program_id(0), world_size * per_chunk, tl.num_programs(0)):\n"
       "        t = ((i // per_chunk + rank + 1) % world_size) * per_chunk + i % per_chunk  # own chunk last\n"
       "        owner = t // per_chunk\n")
text = open(path).read()
if text.count(old) != 1:
    sys.exit(f"mrs-order-ab.sh: {path}: the tile loop is not where this script expects it; update the script")
open(path, "w").write(text.replace(old, new))
PY
tree_path() { echo "$1/packages/iris-device/src:$1/packages/iris-runtime/src:$1/packages/iris-collectives/src"; }
rest=${PYTHONPATH:-}
rest=${rest//$PWD\/packages\/iris-device\/src/}; rest=${rest//$PWD\/packages\/iris-runtime\/src/}
rest=${rest//$PWD\/packages\/iris-collectives\/src/}
if [ -n "${AB_CHECK:-}" ]; then
  PYTHONPATH="$(tree_path "$root/own_last"):$rest" python3 -m pytest -q -p no:cacheprovider \
    --rootdir "$root/own_last" "$root/own_last/packages/iris-collectives/tests/test_ops_multirank.py" -k scenarios
  exit
fi
[ $# -eq 0 ] && set -- --ops matmul_reduce_scatter --m 4096,16384 --reps 10 --warmup 2
# tools/gpu-bench.sh passes its mpirun (with the MPS and iris variables) in IRIS_MPIEXEC
MPI=${IRIS_MPIEXEC:-mpirun --allow-run-as-root --oversubscribe -x PYTHONPATH -x IRIS_BACKEND}
for name in shipped own_last; do
  tree=$PWD; [ "$name" = own_last ] && tree=$root/own_last
  echo "=== $name"
  PYTHONPATH="$(tree_path "$tree"):$rest" $MPI -n "${FUSED_RANKS:-4}" python3 -m mpi4py benchmarks/fused_ops.py "$@" \
    --out "benchmarks/results/mrs_order_ab/$name"
done
