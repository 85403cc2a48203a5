#!/usr/bin/env bash
# A/B builds of the watchdog (#16): where does its cost at 256 MiB go? Makes copies of the packages
# with one change each (tools/patched_tree.py) and times them next to "bounded" and "compiled out"
# in the same rounds (benchmarks/watchdog_overhead.py --tree). Usage: bash tools/watchdog-ab.sh
# [watchdog_overhead.py args] (the GPU machine: through tools/gpu-bench.sh watchdog_ab, which sets
# the environment). The copies:
#   rare_clock      the spinning wait never looks at the clock or the drain word (CHECK_POLLS 2^30):
#                   what the per-thread checks cost;
#   no_report       a stopped wait writes no report (not a working watchdog): what the report's code
#                   at every wait costs where it never runs (a larger one cost two-shot +91 us at
#                   256 MiB on an H200, benchmarks/NOTES.md, tenth session);
#   no_host_thread  the runtime's watchdog thread polls once an hour instead of every 50 ms: what the
#                   host thread next to the launching thread costs.
set -euo pipefail
cd "$(dirname "$0")/.."
root=${AB_ROOT:-/tmp/iris-watchdog-ab}
trees=()
# change NAME FILE OLD NEW: a copy of the packages with OLD replaced by NEW in FILE (exactly once)
change() { python3 tools/patched_tree.py "$root/$1" "$2" "$3" "$4" >/dev/null; trees+=(--tree "$1=$root/$1"); }
change rare_clock packages/iris-device/src/iris/device/_watchdog.py \
  "tl.constexpr(4 if INTERPRETER else 1024)" "tl.constexpr(4 if INTERPRETER else 1 << 30)"
change no_report packages/iris-device/src/iris/device/_watchdog.py \
  "    _report(trailer, drain, state, call_id, flag_id, me, peer, index, seen, target, _now() - start, calls)" \
  "    pass  # watchdog-ab.sh no_report"
change no_host_thread packages/iris-runtime/src/iris/runtime/_watchdog.py "POLL_S = 0.05" "POLL_S = 3600.0"
python3 benchmarks/watchdog_overhead.py --tag ab "${trees[@]}" "$@"
