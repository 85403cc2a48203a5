"""GPU-path checks that need no GPU: every collective's test kernel compiled for an H200 (sm_90) in
a child process with Triton's interpreter off, with and without IRIS_DEBUG=1. They catch what the
interpreter never sees: compile errors of the GPU paths, flags that are not released and acquired
at system scope, data paths that lost their vector loads, debug code left in a normal build; and,
on kernels with one flag operation or one collective call each, the exact ordered CTA barriers,
fences, atomics and acquire loads that make up each publish and consume."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "collectives_compile_check.py")
LOCKING = ("all_reduce_spinlock", "all_reduce_one_shot", "all_reduce_two_shot", "all_reduce_ring", "reduce_scatter",
           "all_reduce_rmsnorm")


def compile_all(debug: bool, *args: str, **extra_env: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "IRIS_DEBUG", "TRITON_DEBUG")}
    env["IRIS_BACKEND"] = "cuda"  # compile for the GPU; nothing is launched
    if debug:
        env["IRIS_DEBUG"] = "1"
    env.update(extra_env)
    proc = subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True, timeout=900, env=env,
                          cwd=HERE)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def compiled():
    return compile_all(debug=False)


@pytest.fixture(scope="module")
def compiled_debug():
    return compile_all(debug=True)


def test_every_collective_compiles_for_sm90(compiled):
    assert not compiled["debug"]
    failed = {k: r["error"] + "\n" + r.get("trace", "") for k, r in compiled["results"].items() if not r["ok"]}
    assert not failed, "\n\n".join(f"{k}: {v}" for k, v in failed.items())
    names = {k.split("/")[0] for k in compiled["results"]}
    assert names == {*LOCKING, "all_reduce_atomic", "all_gather", "gather", "all_to_all"}


def test_flags_are_released_and_acquired_at_system_scope(compiled):
    for key, r in compiled["results"].items():
        name = key.split("/")[0]
        if name in LOCKING or name == "all_gather":  # all_gather's kernel adds a device barrier
            # released by a release atomic, or by one system-scope fence before relaxed adds
            assert r["release_sys"] + r["release_fences_sys"] > 0 and r["acquire_sys_loads"] > 0, (key, r)
        if name == "all_reduce_atomic":
            continue  # its atomics carry data (relaxed on purpose), not flags
        for atom in r["atomics"]:
            qualifiers = atom.split(".", 1)[1]  # the same for atom. and red. (no old value)
            if "u64" in qualifiers or qualifiers == "global.gpu.relaxed.add.u32":
                continue  # the trace buffer's slot counter; this rank's private call counters
            if qualifiers == "global.sys.relaxed.add.u32":
                assert r["release_fences_sys"] > 0, (key, "relaxed signal without a release fence", r)
                continue
            assert ".sys." in atom and ("release" in atom or "acquire" in atom), (key, atom)


def test_private_counters_are_updated_by_one_atomic(compiled):
    # A counter read by a scalar tl.load (every thread) and written by a scalar tl.store (one
    # thread) lets a late warp read the new value and wait for the next call's target forever: the
    # GPU hang of 0.1.0 with several tiles per program. Counters go through one atomic instead.
    for key, r in compiled["results"].items():
        if key.split("/")[0] in LOCKING:
            # the detector sees the one-thread predicate (the counters' and flags' atomics use it)
            assert r["single_thread_atomics"] > 0, (key, r)
        if "/trace/" in key:
            continue  # the trace buffer's end-time store is a single-thread store by design
        if key.startswith("all_reduce_rmsnorm/fp8/"):
            continue  # the rows' fp8 scales, a few values stored by the threads that hold them: data
        assert r["single_thread_stores"] == 0, (key, r)


def test_waits_poll_with_acquire_loads_in_every_thread(compiled):
    # One L2 round trip per poll and no thread-0 acquire + broadcast: every thread polls with
    # ld.acquire.sys (unpredicated), and no relaxed volatile poll is left.
    for key, r in compiled["results"].items():
        if key.split("/")[0] in LOCKING or key.startswith("all_gather"):
            assert r["acquire_polls_all_threads"] > 0 and r["volatile_loads"] == 0, (key, r)


def test_waits_are_bounded_by_the_watchdog(compiled):
    # Every kernel that waits carries the watchdog's check inline in its wait loops (its tagged
    # PTX blocks: clock, drain word, report), with no call anywhere (an out-of-line check cost 4-9 %
    # at 256 MiB on an H200), and reads no clock outside the check (the fast path is free).
    for key, r in compiled["results"].items():
        waits = key.split("/")[0] in LOCKING or key.startswith("all_gather")
        assert (r["watchdog_blocks"] > 0) == waits, (key, r)
        assert r["calls"] == 0, (key, r)
        if "/trace/" not in key:  # tracing reads the clock for its event times
            assert r["globaltimer_reads"] == 0, (key, r)


def test_data_paths_use_vector_loads(compiled):
    for key, r in compiled["results"].items():
        assert r["ld_v4"] > 0 and r["st_v4"] > 0, (key, r)


def test_atomic_variant_adds_with_system_scope_vector_atomics(compiled):
    r = compiled["results"]["all_reduce_atomic/fp32/bound/plain/4/1"]
    assert any(a.split(".", 1)[1].startswith("global.sys.relaxed.add") and "f32" in a for a in r["atomics"]), \
        r["atomics"]


def test_tracing_compiles_in_only_when_asked(compiled):
    for key, r in compiled["results"].items():
        traced = any("u64" in a for a in r["atomics"])
        assert traced == ("/trace/" in key), (key, r["atomics"])


def test_debug_checks_cost_nothing_when_off(compiled, compiled_debug):
    assert compiled_debug["debug"]
    failed = {k: r["error"] for k, r in compiled_debug["results"].items() if not r["ok"]}
    assert not failed, failed
    for key, r in compiled_debug["results"].items():
        plain = compiled["results"][key]
        if key.split("/")[0] in LOCKING:
            assert r["prints"] > plain["prints"], (key, r["prints"], plain["prints"])
    # without debug, only the ring's signal-pad capacity check prints (and traps)
    for key, r in compiled["results"].items():
        ring = key.startswith("all_reduce_ring")
        assert (r["prints"] > 0) == ring and (r["traps"] > 0) == ring, (key, r)


# ---------------------------------------------------------------------------------------------
# Exact memory order: one flag operation or one collective call per kernel (rank 1 of 4, one
# 32 x 64 fp32 tile per program; collectives_compile_check.py --order). Each expectation is the
# ordered list of CTA barriers, fences, atomics ("atom.<sem>.<scope>.<op>.<type>", red included)
# and acquire loads, with "loop{ ... }" around a loop's body (see memory_order there).

ORDER_WORLD = 4  # collectives_compile_check.ORDER_WORLD
TILE_ELEMENTS = 32 * 64
THREADS = 128  # 4 warps
BAR = "bar.sync"
FENCE_SYS = "fence.acq_rel.sys"
POLL = "ld.acquire.sys"
RELEASE_ADD = "atom.release.sys.add.u32"  # a flag count, released at system scope
RELAXED_ADD = "atom.relaxed.sys.add.u32"  # a flag count after one release fence
COUNTER_ADD = "atom.relaxed.gpu.add.u32"  # this rank's private call counter
LOCK_CAS = "atom.acquire.sys.cas.b32"
UNLOCK_XCHG = "atom.release.sys.exch.b32"

#: wait_at_least: every thread polls with an acquire load at system scope until the counter is
#: there (the first poll, then the loop's), then a CTA barrier: every thread's later loads come
#: after some thread's acquire.
WAIT = [POLL, "loop{", POLL, "}", BAR]
#: next_epoch (a private counter): thread 0 adds (relaxed, GPU scope); Triton hands the old value
#: to every thread through shared memory, behind a CTA barrier.
ADVANCE = [COUNTER_ADD, BAR]
#: Triton's CTA barrier before a second shared-memory hand-over reuses the first one's scratch,
#: where no other barrier came in between.
SCRATCH = [BAR]
#: The spinlock's lock: thread 0's compare-and-swap (acquire, system scope) and the hand-over of
#: its old value; the retry loop does the same after a barrier for the scratch; then the lock's own
#: CTA barrier, so every thread's accesses under the lock come after the acquire.
LOCK = [LOCK_CAS, BAR, "loop{", BAR, LOCK_CAS, BAR, "}", BAR]

SYNC_OPS = ("signal", "signal_all", "wait_at_least", "device_barrier", "device_barrier_epoch", "next_epoch", "lock",
            "unlock")
COLLECTIVE_OPS = ("all_reduce_atomic/fp32", "all_reduce_spinlock/fp32", "all_reduce_one_shot/fp32",
                  "all_reduce_two_shot/fp32", "all_reduce_ring/fp32", "all_reduce_ring/bf16", "reduce_scatter/fp32",
                  "all_gather/fp32", "gather/fp32", "all_to_all/fp32")


class Orders:
    """The expected sequences, built from the flag operations the collectives are made of.

    ``triton_release_barrier``: Triton 3.9 puts a CTA barrier before every atomic with release
    semantics on its own; 3.6 does not (read from a bare release atomic, see
    :func:`triton_release_barrier`). iris's own barriers are there either way, so on 3.9 a release
    after iris's barrier reads [bar, bar, atom]."""

    def __init__(self, triton_release_barrier: bool):
        self.triton = triton_release_barrier

    def release(self, atom: str) -> list[str]:
        """A release atomic, with Triton's own barrier before it where Triton adds one."""
        return [BAR] * self.triton + [atom]

    def signal(self) -> list[str]:
        """signal: a CTA barrier (every thread's earlier stores are then ordered before thread 0's
        release), then one release add at system scope."""
        return [BAR, *self.release(RELEASE_ADD)]

    @staticmethod
    def signal_all(peers: int) -> list[str]:
        """signal_all: a CTA barrier, one system-scope fence in thread 0 (the release of every add
        after it), then one relaxed system-scope add per peer."""
        return [BAR, FENCE_SYS, *[RELAXED_ADD] * peers]

    def unlock(self) -> list[str]:
        """The spinlock's unlock: a release exchange at system scope; the CTA barrier before it is
        the caller's (signal's, for the arrival it just counted)."""
        return self.release(UNLOCK_XCHG)

    def expected(self, case: str) -> list[str]:
        W = ORDER_WORLD
        signal = self.signal()
        sync = {
            "signal": signal,
            "signal_all": self.signal_all(W - 1),
            "wait_at_least": WAIT,
            "device_barrier": ADVANCE + self.signal_all(W) + WAIT,  # the generation from word 1, all ranks
            "device_barrier_epoch": self.signal_all(W) + WAIT,  # the caller's generation
            "next_epoch": ADVANCE,
            "lock": LOCK,
            "unlock": self.unlock(),
        }
        if case in sync:
            return sync[case]
        # The spinlock: publish this rank's call count (a CTA barrier, then a release add whose old
        # value every thread gets), then per rank: (wait until it entered,) lock, add into its
        # tile, count the arrival, unlock; then wait for every rank's arrival.
        spinlock = [BAR] + self.release(RELEASE_ADD) + [BAR] + SCRATCH + LOCK + signal + self.unlock()
        for _ in range(W - 1):
            spinlock += WAIT + LOCK + signal + self.unlock()
        spinlock += WAIT
        # one-shot and two-shot: count the call; "ready" to every peer, wait for theirs; read and
        # reduce; "done" to every peer, wait for theirs.
        shots = ADVANCE + self.signal_all(W - 1) + WAIT + self.signal_all(W - 1) + WAIT

        def ring(pieces: int) -> list[str]:
            # Both private totals (arrivals, credits); then, in the text order of the branches on
            # this rank's position: grant the left neighbour a credit and take each piece of the
            # partial sum (a credit between pieces); send each piece right after its credit; wait
            # for the result and pass it on (or, completing the sum, send it).
            seq = ADVANCE + SCRATCH + ADVANCE + signal
            for piece in range(pieces):
                seq += WAIT + (signal if piece + 1 < pieces else [])
            for _ in range(pieces):
                seq += WAIT + signal
            return seq + WAIT + signal + signal

        return {
            # relaxed system-scope vector adds of the data, 4 floats each, for every rank; no flags
            "all_reduce_atomic/fp32": ["atom.relaxed.sys.add.v4.f32"] * (W * TILE_ELEMENTS // (THREADS * 4)),
            "all_reduce_spinlock/fp32": spinlock,
            "all_reduce_one_shot/fp32": shots,
            "all_reduce_two_shot/fp32": shots,
            "all_reduce_ring/fp32": ring(1),
            "all_reduce_ring/bf16": ring(2),  # an fp32 partial sum travels as two 16-bit pieces
            # count the call; as the owner: wait for every peer's "ready", reduce, "done" to every
            # peer; otherwise: "ready" to the owner, wait for its "done"
            "reduce_scatter/fp32": ADVANCE + WAIT + self.signal_all(W - 1) + signal + WAIT,
            # no flags of their own (their docstrings: ordering is the caller's)
            "all_gather/fp32": [],
            "gather/fp32": [],
            "all_to_all/fp32": [],
        }[case]


@pytest.fixture(scope="module")
def order():
    # The watchdog's bound on waits (IRIS_TIMEOUT_S; compiled in by default) adds its slow path to
    # every wait loop and moves blocks around; switched off here, the kernels show the protocol alone.
    return compile_all(False, "--order", IRIS_TIMEOUT_S="0")


def triton_release_barrier(order) -> bool:
    """Whether this Triton puts a CTA barrier before a release atomic by itself: read from a bare
    ``tl.atomic_add(flag, 1, sem="release", scope="sys")``. A form other than 3.6's (the atom) and
    3.9's (a barrier, then the atom) fails here rather than in every sequence."""
    bare = order["results"]["bare_release"]
    assert bare["ok"], bare
    known = {(RELEASE_ADD,): False, (BAR, RELEASE_ADD): True}
    assert tuple(bare["order"]) in known, (f"Triton {order['triton']} lowers a bare release add to {bare['order']}, "
                                           f"a form these checks do not know")
    return known[tuple(bare["order"])]


def order_mismatch(case: str, got: list[str], want: list[str]) -> str:
    first = next((i for i, (g, w) in enumerate(zip(got, want)) if g != w), min(len(got), len(want)))
    return (f"{case}: memory order differs from instruction {first} on ({len(got)} vs {len(want)} instructions)\n"
            f"  got:  {got}\n  want: {want}")


def check_order(order, case: str):
    result = order["results"][case]
    assert result["ok"], result["error"] + "\n" + result.get("trace", "")
    want = Orders(triton_release_barrier(order)).expected(case)
    assert result["order"] == want, order_mismatch(case, result["order"], want)


def test_order_kernels_cover_every_flag_operation_and_collective(order):
    assert set(order["results"]) == {"bare_release", *SYNC_OPS, *COLLECTIVE_OPS}
    triton_release_barrier(order)


@pytest.mark.parametrize("case", SYNC_OPS)
def test_flag_operations_have_exact_memory_order(order, case):
    # signal = [bar, release add]; signal_all = [bar, fence, relaxed adds]; wait = [acquire polls,
    # bar]; lock = [acquire cas loop, bar]; unlock = [release exchange]: a lost barrier, a weaker
    # or narrower sem/scope, or a reordering fails here.
    check_order(order, case)


@pytest.mark.parametrize("case", COLLECTIVE_OPS)
def test_collectives_publish_and_consume_in_exact_order(order, case):
    check_order(order, case)


@pytest.fixture(scope="module")
def bounded():
    # A watchdog-bounded wait (the default build): what the kernel runs itself, and its callees.
    return compile_all(False, "--order", "--only", "bounded_wait", IRIS_TIMEOUT_S="300")


def test_a_bounded_wait_runs_the_unbounded_protocol(bounded):
    # Take the watchdog check's tagged blocks out of a bounded wait and what is left is the wait
    # compiled with IRIS_TIMEOUT_S=0, barrier for barrier: every thread polls on its own, the CTA
    # barrier comes after the loop, and nothing is called. A wait whose flag is set runs exactly
    # the code it runs with the watchdog compiled out.
    r = bounded["results"]["bounded_wait"]
    assert r["ok"], r.get("error", "") + "\n" + r.get("trace", "")
    assert r["watchdog_blocks"] > 0 and r["calls"] == 0, r
    # acquire polls (the first, the loop's; LLVM may lay the loop's poll out after the check's
    # block), then the one CTA barrier: the unbounded WAIT's instructions
    protocol = [op for op in r["order"] if op not in ("loop{", "}")]
    assert set(protocol[:-1]) == {POLL} and protocol[-1] == BAR, r["order"]
    assert r["order"][0] == POLL and "loop{" in r["order"], r["order"]
    # with the check's blocks in: still no barrier before the last, and the check's own
    # instructions (the drain word's relaxed loads, the report's claim and fence) sit before it,
    # inside the wait; no drain atomics (the host raises the drain words)
    with_check = r["check_order"]
    assert with_check.count(BAR) == 1 and with_check[-1] == BAR, with_check
    check = [op for op in with_check if op not in (POLL, BAR, "loop{", "}")]
    assert sorted(set(check)) == ["atom.relaxed.gpu.cas.b32", FENCE_SYS, "ld.relaxed.sys"], with_check
