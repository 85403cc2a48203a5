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
#                   host thread next to the launching thread costs;
#   one_word        the report is one word, the waited flag's address with the call and flag ids in
#                   its top bits (the host would derive the rest): its sm_90 SASS is no_report's,
#                   instruction for instruction, plus two 20-instruction report blocks, and its
#                   reduction loop is scheduled as no_report's (shipped's is not). Not a working
#                   watchdog yet (the host does not decode it): what such a report would cost;
#   two_words       one_word plus the call counter's address (a second pointer live at the wait):
#                   its reduction loop is scheduled as shipped's, not as no_report's.
# (eleventh session: benchmarks/NOTES.md. The hypothesis: what costs is not the report's code
# but the values it keeps live across the wait, which change how ptxas schedules the hot loop.)
set -euo pipefail
cd "$(dirname "$0")/.."
root=${AB_ROOT:-/tmp/iris-watchdog-ab}
trees=()
# change NAME FILE OLD NEW [FILE OLD NEW ...]: a copy of the packages with each OLD replaced by its
# NEW in its FILE (exactly once)
change() { local name=$1; shift; python3 tools/patched_tree.py "$root/$name" "$@" >/dev/null; trees+=(--tree "$name=$root/$name"); }
change rare_clock packages/iris-device/src/iris/device/_watchdog.py \
  "tl.constexpr(4 if INTERPRETER else 1024)" "tl.constexpr(4 if INTERPRETER else 1 << 30)"
change no_report packages/iris-device/src/iris/device/_watchdog.py \
  "    _report(trailer, drain, state, call_id, flag_id, me, peer, index, seen, target, _now() - start, calls)" \
  "    pass  # watchdog-ab.sh no_report"
change no_host_thread packages/iris-runtime/src/iris/runtime/_watchdog.py "POLL_S = 0.05" "POLL_S = 3600.0"
sync=packages/iris-collectives/src/iris/collectives/_sync.py
device=packages/iris-device/src/iris/device/_watchdog.py
arguments="args = watchdog_arguments(call, what, peer, index, seen, target, calls)"
report="        _put(record + _CALL, call_id)
        _put(record + _FLAG, flag_id)
        _put(record + _RANK, rank)
        _put(record + _PEER, peer)
        _put(record + _INDEX, index)
        _put(record + _SEEN, seen)
        _put(record + _TARGET, target)
        _put(record + _WAITED, waited)
        _put(record + _CALLS, calls)
"
change one_word "$sync" "$arguments" "args = watchdog_arguments(call, what, peer, -1, seen, target, flag)" \
  "$device" "$report" "        _put(record + _CALLS, calls + (call_id << 56) + (flag_id << 48))
"
change two_words "$sync" "$arguments" \
  "args = watchdog_arguments(call, what, peer, index, flag.to(tl.int64, bitcast=True), target, calls)" \
  "$device" "$report" "        _put(record + _CALL, seen + (call_id << 56) + (flag_id << 48))
        _put(record + _CALLS, calls)
"
python3 benchmarks/watchdog_overhead.py --tag ab "${trees[@]}" "$@"
