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
#                   its top bits (the host would derive the rest; not a working watchdog yet);
#   two_words       one_word plus the call counter's address;
#   no_location     the report keeps the call and flag ids, seen, target and the time waited, and
#                   nothing that says where (no tile, peer, counter or flag address).
#   placebo         timed with the watchdog compiled out (--tree-off): a store after each spinning
#                   wait under a condition that never holds (a counter below -2^30). Not the
#                   watchdog, the same kind of change: how far code that never runs moves the times
#                   by itself, the compiler's share of any difference above.
# The eleventh session read the SASS of one_word as no_report's and two_words' as shipped's and
# guessed that values kept live across a wait perturb the hot loop's schedule. Compiled as the JIT
# specialises a launch (tools/sass_schedule.py, twelfth session) it is the other way round at the
# benchmark's shape (8x4, fp32), and over 16 shapes, dtypes, ranks and world sizes every build,
# no_report included, mostly gets a schedule of its own: the schedule is a lottery that any change
# enters. Time these copies at several shapes (WATCHDOG_ARGS="--shapes 8x4,16x4,32x8 --dtypes
# fp32,bf16") before reading a cost into one of them. AB_COPIES="no_report one_word" makes only
# those copies (default: all).
set -euo pipefail
cd "$(dirname "$0")/.."
root=${AB_ROOT:-/tmp/iris-watchdog-ab}
trees=()
# change NAME FILE OLD NEW [FILE OLD NEW ...]: a copy of the packages with each OLD replaced by its
# NEW in its FILE (exactly once)
copies=" ${AB_COPIES:-rare_clock no_report no_host_thread one_word two_words no_location placebo} "
off=" placebo "  # copies timed with the watchdog compiled out
change() {
  local name=$1; shift
  [[ $copies == *" $name "* ]] || return 0
  python3 tools/patched_tree.py "$root/$name" "$@" >/dev/null
  if [[ $off == *" $name "* ]]; then trees+=(--tree-off "$name=$root/$name"); else trees+=(--tree "$name=$root/$name"); fi
}
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
change no_location "$device" "$report" "        _put(record + _CALL, call_id)
        _put(record + _FLAG, flag_id)
        _put(record + _SEEN, seen)
        _put(record + _TARGET, target)
        _put(record + _WAITED, waited)
"
change placebo "$sync" "        if INTERPRETER:
            # The interpreter polls with volatile loads: confirm with one acquire read." \
  "        if seen < -1073741824:  # watchdog-ab.sh placebo: never true, the counters only grow from 0
            tl.store(flag, seen)
        if INTERPRETER:
            # The interpreter polls with volatile loads: confirm with one acquire read."
python3 benchmarks/watchdog_overhead.py --tag ab "${trees[@]}" "$@"
