"""Break a promise on purpose and check that a test notices.

    python tools/mutations.py                 # every mutation, on the cpu backend (about 8 minutes)
    python tools/mutations.py --list          # the mutations and the checks that must fail
    python tools/mutations.py --check         # only that every mutation still applies (seconds)
    python tools/mutations.py --quick         # the QUICK subset (what ``nox -s mutations`` runs)
    python tools/mutations.py frame-strides   # some of them, by name
    python tools/mutations.py --baseline ...  # first run the same checks unmutated: they must pass

Each mutation copies ``packages/`` to a temporary folder, replaces one piece of the library's
source (the text must occur exactly as often as stated, so a mutation that no longer applies
fails loudly instead of testing nothing: every chosen mutation is checked before any test runs,
and the tool exits non-zero naming each one that is stale), and runs the checks that guard the
promise against that copy. A mutation is *caught* when every one of its checks fails, with the
mutation's ``expect`` text in its output where one is given (so that a check failing for another
reason, say a mutation that does not compile, is not taken for a catch). The repository itself
is never changed. Prints a table: mutation, promise, check, outcome.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

SHM = "/dev/shm"  # where MPICH keeps a job's shared-memory segment

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEVICE = "iris-device/src/iris/device"
COLL = "iris-collectives/src/iris/collectives"
RUNTIME = "iris-runtime/src/iris/runtime"


@dataclass
class Mutation:
    name: str
    promise: str
    edits: list[tuple[str, str, str, int]]  # (file under packages/, old, new, occurrences)
    # ("pytest", node...) or ("worker", nranks, [worker file under iris-collectives' tests/workers, default
    # collectives_worker.py, or a path under packages/ for another package's worker], scenario..., [ENV=VALUE...])
    checks: list[tuple[str, ...]]
    env: dict[str, str] = field(default_factory=dict)
    expect: str = ""  # a text every failing check's output must hold for a catch


MUTATIONS = [
    Mutation("sem-default-and-swap",
             "atomics: sem=None is acq_rel, acquire and release reach the instruction",
             [(f"{DEVICE}/_options.py", "            f\"pass e.g. sem='release' on the writer and sem='acquire' on the reader\"\n"
               "        )\n    return sem\n",
               "            f\"pass e.g. sem='release' on the writer and sem='acquire' on the reader\"\n"
               "        )\n    return {None: 'relaxed', 'acquire': 'release', 'release': 'acquire'}.get(sem, sem)\n", 1)],
             [("pytest", "packages/iris-device/tests/test_device_gpu_compile.py")]),
    Mutation("get-from-rank-only",
             "iris.device.get reads from whichever of its two ranks is not the calling rank (AMD Iris's order too)",
             [(f"{DEVICE}/_memory.py", "    source = tl.where(from_rank == cur_rank, to_rank, from_rank)\n",
               "    source = from_rank\n", 1)],
             [("pytest", "packages/iris-device/tests/test_device_multirank.py::test_every_primitive_every_peer")],
             env={"IRIS_TEST_WORLD_SIZES": "2"}, expect="get2 from"),
    Mutation("no-barrier-in-signal", "signal: a CTA barrier before the release",
             [(f"{COLL}/_sync.py", "    \"\"\"\n    tl.debug_barrier()\n    if DEBUG and CHECKED:", "    \"\"\"\n    if DEBUG and CHECKED:", 1)],
             [("pytest", "packages/iris-collectives/tests/test_collectives_compile.py")]),
    Mutation("no-barrier-after-wait", "wait_at_least: a CTA barrier after the acquire",
             [(f"{COLL}/_sync.py", "            seen = tl.atomic_add(flag, 0, sem=\"acquire\", scope=\"sys\")\n"
               "        tl.debug_barrier()\n",
               "            seen = tl.atomic_add(flag, 0, sem=\"acquire\", scope=\"sys\")\n", 1)],
             [("pytest", "packages/iris-collectives/tests/test_collectives_compile.py")]),
    Mutation("unlock-acquires", "the spinlock's unlock releases",
             [(f"{COLL}/_all_reduce.py", "tl.atomic_xchg(peer_flag(mutex, rank, peer, heap_bases), 0, sem=\"release\", scope=\"sys\")",
               "tl.atomic_xchg(peer_flag(mutex, rank, peer, heap_bases), 0, sem=\"acquire\", scope=\"sys\")", 1)],
             [("pytest", "packages/iris-collectives/tests/test_collectives_compile.py")]),
    Mutation("frame-strides", "TensorView works for any strides",
             [(f"{COLL}/_views.py", "        pointers = self.ptr + (rows[:, None] * self.stride_m + cols[None, :] * self.stride_n)",
               "        pointers = self.ptr + (rows[:, None] * self.N + cols[None, :])", 1)],
             [("worker", "2", "strided_views_all_reduce"), ("worker", "2", "tensor_view_helpers_any_strides")]),
    Mutation("no-trace-gather-family", "every collective records its trace event",
             [(f"{COLL}/_gather.py", "if ctx.tracing.enabled:", "if False:", 6)],
             [("worker", "2", "tracing_every_collective")]),
    Mutation("no-trace-barrier", "device_barrier records its trace event",
             [(f"{COLL}/_sync.py", "if ctx.tracing.enabled:", "if False:", 2)],
             [("worker", "2", "tracing_every_collective")]),
    Mutation("barrier-own-arrival", "device_barrier waits for every rank",
             [(f"{COLL}/_sync.py", "    signal_all(flags, ctx.rank, ctx.world_size, ctx.heap_bases, SELF=True)\n",
               "    signal(flags, ctx.rank, ctx.rank, ctx.heap_bases, CHECKED=False)\n", 1),
              (f"{COLL}/_sync.py", "wait_at_least(flags, generation * ctx.world_size,", "wait_at_least(flags, generation,", 2)],
             [("worker", "3", "device_barrier_waits_for_late_ranks"), ("worker", "3", "device_barrier_explicit_epochs")]),
    Mutation("debug-timeout-10x", "IRIS_DEBUG_TIMEOUT_S bounds a debug wait",
             [(f"{COLL}/_sync.py", "return float(os.environ.get(\"IRIS_DEBUG_TIMEOUT_S\", \"60\"))",
               "return 10 * float(os.environ.get(\"IRIS_DEBUG_TIMEOUT_S\", \"60\"))", 1)],
             [("worker", "2", "debug_wait_times_out", "IRIS_DEBUG=1", "IRIS_DEBUG_TIMEOUT_S=3", "MPIEXEC_TIMEOUT=120")]),
    Mutation("watchdog-never-stops", "the watchdog ends a wait whose peer never comes",
             [(f"{DEVICE}/_watchdog.py", "    stop = (limit > 0) & ((reason != 0) | (now - start > limit))",
               "    stop = (limit > 0) & (reason != 0)", 1)],
             [("pytest", "packages/iris-collectives/tests/test_collectives_faults.py", "-k", "says_why and skip and 2")]),
    # --- issue #37: promises that only random floats, 3+ ranks, foreign epochs or a lost race show ---------
    # (text of _all_reduce.py and _sync.py as of the TileRange collectives: re-target these when
    # those files change; a mutation whose text is gone stops the run, naming itself)
    Mutation("sum-own-first", "one-shot (tile, ccl, fused) sums in rank order: bit-identical on every rank",
             [(f"{COLL}/_all_reduce.py", "    for p in tl.static_range(ctx.world_size):\n"
               "        if rank_is_static(ctx.rank):\n",
               "    for i in tl.static_range(ctx.world_size):\n        p = (ctx.rank + i) % ctx.world_size\n"
               "        if rank_is_static(ctx.rank):\n", 1)],
             [("worker", "3", "promises_worker.py", "matmul_all_reduce"), ("worker", "3", "promises_worker.py",
              "ccl_all_reduce"), ("worker", "3", "promises_worker.py", "ccl_reduce_scatter")],
             expect="summed in rank order"),
    Mutation("two-shot-own-first", "two-shot (tile, ccl, fused) sums each share in rank order",
             [(f"{COLL}/_all_reduce.py", "    for p in tl.static_range(ctx.world_size):\n"
               "        if local_src is None:\n",
               "    for i in tl.static_range(ctx.world_size):\n        p = (ctx.rank + i) % ctx.world_size\n"
               "        if local_src is None:\n", 1)],
             [("worker", "3", "promises_worker.py", "matmul_all_reduce"),
              ("worker", "3", "promises_worker.py", "ccl_all_reduce")],
             expect="summed in rank order"),
    Mutation("owner-sums-own-first", "matmul_reduce_scatter: the owner sums the partials in rank order",
             [(f"{COLL}/ops/_matmul_reduce_scatter.py", "from iris.device import round_to\n",
               "from iris.device import load, round_to\n", 1),
              (f"{COLL}/ops/_matmul_reduce_scatter.py",
               "                total = _sum_in_rank_order(ctx, tile, partial_ptrs, mask, partial.dtype.element_ty)\n",
               "                total = acc\n                for i in tl.static_range(1, world_size):\n"
               "                    total += load(partial_ptrs, rank, (rank + i) % world_size, ctx.heap_bases, "
               "mask=mask, other=0)\n", 1)],
             [("worker", "3", "promises_worker.py", "matmul_reduce_scatter"),
              # what CI's lowest Triton line runs (its multi-rank suites at 2 ranks): the 3-rank launch
              ("pytest", "packages/iris-collectives/tests/test_promises_multirank.py::test_rank_order_at_three_ranks")],
             env={"IRIS_TEST_WORLD_SIZES": "2"}, expect="summed in rank order"),
    Mutation("owner-truncates", "matmul_reduce_scatter rounds once to nearest even (the interpreter's cast truncates)",
             [(f"{COLL}/ops/_matmul_reduce_scatter.py", "tl.store(out_ptrs, round_to(total, out.dtype.element_ty), "
               "mask=mask)", "tl.store(out_ptrs, total.to(out.dtype.element_ty), mask=mask)", 1)],
             [("worker", "3", "promises_worker.py", "matmul_reduce_scatter")], expect="rounded once to nearest even"),
    Mutation("matmul-all-gather-truncates", "matmul_all_gather rounds once to nearest even",
             [(f"{COLL}/ops/_matmul_all_gather.py", "result = round_to(add_bias(acc, bias, cols, N, HAS_BIAS), "
               "out.dtype.element_ty)", "result = add_bias(acc, bias, cols, N, HAS_BIAS).to(out.dtype.element_ty)", 1)],
             [("worker", "3", "promises_worker.py", "gather_ops_round_once")], expect="rounded once to nearest even"),
    Mutation("all-gather-matmul-truncates", "all_gather_matmul (pull and arrival) rounds once to nearest even",
             [(f"{COLL}/ops/_all_gather_matmul.py", "round_to(acc, out.dtype.element_ty)", "acc.to(out.dtype.element_ty)",
               2)],
             [("worker", "3", "promises_worker.py", "gather_ops_round_once")], expect="rounded once to nearest even"),
    Mutation("one-shot-truncates", "one-shot, per tile (matmul_all_reduce) and per range (ccl.all_reduce), rounds "
             "once to nearest even",
             [(f"{COLL}/_all_reduce.py", "tl.store(dst_ptrs, round_to(acc, dst_view.ptr.dtype.element_ty), mask=mask)",
               "tl.store(dst_ptrs, acc.to(dst_view.ptr.dtype.element_ty), mask=mask)", 1),
              (f"{COLL}/_all_reduce.py", "tl.store(dst_ptrs, round_to(acc, dst_ty), mask=mask)",
               "tl.store(dst_ptrs, acc.to(dst_ty), mask=mask)", 1)],
             [("worker", "3", "promises_worker.py", "matmul_all_reduce"),
              ("worker", "3", "promises_worker.py", "ccl_all_reduce")], expect="rounded once to nearest even"),
    Mutation("barrier-ignores-epoch", "device_barrier(epoch=) waits for the caller's generation, not its own count",
             [(f"{COLL}/_sync.py", "    else:\n        generation = epoch\n",
               "    else:\n        generation = next_epoch(flags + 1)\n", 1)],
             [("worker", "3", "promises_worker.py", "device_barrier_caller_epochs", "IRIS_TIMEOUT_S=15")],
             expect="iris.collectives.device_barrier"),
    Mutation("one-shot-no-final-wait", "one-shot (per tile) returns once no peer reads this rank's source tile",
             [(f"{COLL}/_all_reduce.py", "            signal_all(record + DONE, ctx.rank, ctx.world_size, ctx.heap_bases)\n"
               "            wait_at_least(record + DONE, epoch * (ctx.world_size - 1), call, \"done\", ctx.rank, -1, t,\n"
               "                          ctx.heap_bases, record + EPOCH)\n",
               "            signal_all(record + DONE, ctx.rank, ctx.world_size, ctx.heap_bases)\n", 1)],
             [("worker", "3", "promises_worker.py", "back_to_back_in_one_kernel")], expect="summed data of another call"),
    Mutation("one-shot-range-no-final-wait", "one-shot (per TileRange, as ccl runs it) returns once no peer reads "
             "this rank's source tiles",
             [(f"{COLL}/_all_reduce.py", "        if ctx.world_size > 1:\n"
               "            signal_and_wait_all(ctx, record, DONE, epoch, call, \"done\", slot)\n",
               "        if ctx.world_size > 1:\n"
               "            signal_all(record + DONE, ctx.rank, ctx.world_size, ctx.heap_bases)\n", 1)],
             [("worker", "3", "promises_worker.py", "back_to_back_in_one_kernel")], expect="summed data of another call"),
    Mutation("buffered-one-half", "one_shot_buffered stages each call into the other half of its staging buffer",
             [(f"{COLL}/ccl/_kernels.py", "    return slot, record, epoch, src + (epoch % 2) * half\n",
               "    return slot, record, epoch, src\n", 1)],
             [("worker", "2", "ccl_worker.py", "buffered_one_shot")], expect="buffered one-shot"),
    Mutation("buffered-waits-done", "one_shot_buffered makes one flag round trip per call, not two",
             [(f"{COLL}/ccl/_kernels.py", "ONE_SHOT_CALL, src_bases)\n    if DEBUG:\n",
               "ONE_SHOT_CALL, src_bases)\n    if True:\n", 1)],
             [("worker", "2", "ccl_worker.py", "buffered_one_shot")], expect="not one round trip per call"),
    Mutation("reach-never-agreed", "Config(register=True) agrees with the peers on how each tensor is reached",
             [(f"{COLL}/ccl/_launch.py", "    return tuple(ctx.reach(tensors))\n", "    return None\n", 1)],
             # caught by the call agreement since it compares where the peers reach each tensor
             [("worker", "2", "ccl_worker.py", "agreed_reach")], expect="the ranks made different collective calls"),
    Mutation("reach-no-recency", "the registration cache closes its least recently used registration",
             [(f"{RUNTIME}/_reach.py", "        self._entries.move_to_end(serial)", "        pass", 1)],
             [("worker", "2", "ccl_worker.py", "agreed_reach")], expect="used more recently"),
    Mutation("reach-status-stale", "what a rank remembers of a tensor goes when a registration changes",
             [(f"{RUNTIME}/_reach.py", " and memo[1] == generations:", ":", 1)],
             [("worker", "2", "ccl_worker.py", "agreed_reach")], expect="registered once each"),
    Mutation("reach-drops-plans", "registrations on the fly leave the context's launch plans cached",
             [(f"{RUNTIME}/_reach.py", "            self._by_key[key] = registration.serial\n        self.generation += 1\n",
               "            self._by_key[key] = registration.serial\n        self.generation += 1\n"
               "        ctx.registrations_generation += 1\n", 1)],
             [("worker", "2", "ccl_worker.py", "agreed_reach")], expect="dropped the plans"),
    Mutation("p2p-no-credit", "ccl.send waits for the receiver's credit before it reuses an inbox slot",
             [(f"{COLL}/ccl/_p2p_kernels.py", "    if c >= slots:  # the slot's previous chunk must have been taken out\n",
               "    if c < 0:\n", 1)],
             [("worker", "2", "ccl_worker.py", "p2p_order_and_tags")], expect="back to back past the inbox"),
    Mutation("p2p-size-unchecked", "ccl.recv compares the message's size and dtype with its own",
             [(f"{COLL}/ccl/_p2p_kernels.py", "            if sent == header:\n", "            if True:\n", 1),
              (f"{COLL}/ccl/_p2p_kernels.py", "            if sent != header:\n", "            if False:\n", 2)],
             [("worker", "2", "ccl_worker.py", "p2p_errors")], expect="IrisMessageSizeError"),
    Mutation("p2p-large-size-unchecked", "ccl.recv of a large message compares its size and dtype with the offer's",
             [(f"{COLL}/ccl/_p2p_kernels.py", "        how = tl.where(offered != header, REFUSED,",
               "        how = tl.where(offered != offered, REFUSED,", 1)],
             [("worker", "2", "ccl_worker.py", "p2p_single_copy", "IRIS_TIMEOUT_S=10", "MPIEXEC_TIMEOUT=120")],
             expect="IrisMessageSizeError"),
    Mutation("p2p-registered-misplaced", "a large message to or from a registered tensor is copied at its place in the "
             "registration", [(f"{COLL}/ccl/_p2p_kernels.py",
                               "            delta = (theirs - inbox_at) // _pointee_bytes(inbox.dtype) + offset",
                               "            delta = (theirs - inbox_at) // _pointee_bytes(inbox.dtype) + offset + 1", 1)],
             [("worker", "2", "ccl_worker.py", "p2p_registered")], expect="registered sender True"),
    Mutation("group-registration-world-order", "a group registers its members' tensors in group order",
             [(f"{RUNTIME}/_group.py", "        self.bases = [heap.bases[q] for q in ranks]\n",
               "        self.bases = list(heap.bases[:len(ranks)])\n", 1)],
             [("worker", "4", "ccl_worker.py", "group_agreed_reach")], expect="elements differ"),
    Mutation("p2p-recv-dead-code", "inside torch.compile an unused recv still takes its message",
             [(f"{COLL}/functional/_p2p_ops.py", "    torch.fx.node.has_side_effect(torch.ops.iris.recv.default)\n",
               "    pass\n", 1)],
             [("worker", "2", "torch_ops_worker.py", "p2p_compiles_fullgraph")], expect="received a message"),
    Mutation("combine-last-slot-first", "moe.combine sums a token's rows in slot order (the same bits everywhere)",
             [(f"{COLL}/ccl/_exchange_kernels.py", "            for k in tl.static_range(TOPK):\n",
               "            for j in tl.static_range(TOPK):\n                k: tl.constexpr = TOPK - 1 - j\n", 1)],
             [("worker", "2", "ccl_worker.py", "moe_dispatch_combine")], expect=": combine:"),
    Mutation("exchange-capacity-unchecked", "a variable-size exchange whose rows do not fit raises on the cpu "
             "backend (IrisCapacityError)",
             [(f"{COLL}/ccl/_all_to_all_v.py", "        if interpreted:  # the launches have run: what the GPU's kernels "
               "report, said here\n", "        if False:\n", 1)],
             [("worker", "2", "ccl_worker.py", "all_to_all_v")], expect="expected IrisCapacityError"),
    Mutation("training-regathers", "a training step's all_gather_matmul with strategy unfused keeps the rows it gathers: "
             "its backward gathers nothing again",
             [(f"{COLL}/functional/_fused_ops.py",
               "            return torch.ops.iris.all_gather_matmul_gathered(handle, a, b, bias, config, out_dtype)[0]\n",
               "            pass\n", 1)],
             [("worker", "2", "torch_ops_worker.py", "all_gather_matmul_keeps_its_rows")], expect="forward of unfused"),
    Mutation("gathered-rows-dropped", "ops.all_gather_matmul(gathered=) fills the caller's tensor with every rank's rows",
             [(f"{COLL}/ops/_unfused.py", "            gathered.copy_(rows_of_all)", "            pass", 1)],
             [("worker", "2", "torch_ops_worker.py", "all_gather_matmul_keeps_its_rows")], expect="b's gradient of ('unfused'"),
    Mutation("unfused-bias-early", "strategy unfused adds matmul_reduce_scatter's bias after the sum, as the owner does",
             [(f"{COLL}/ops/_unfused.py", "bias if ctx.rank == 0 and not scatter else None",
               "bias if ctx.rank == 0 else None", 1),
              (f"{COLL}/ops/_unfused.py", "    late_bias = bias if scatter else None\n", "    late_bias = None\n", 1)],
             [("worker", "3", "promises_worker.py", "matmul_reduce_scatter")], expect="matmul_reduce_scatter unfused"),
    Mutation("two-shot-no-final-wait", "two-shot (per tile) returns once no peer reads this rank's source tile",
             [(f"{COLL}/_all_reduce.py", "        _two_shot_tile(ctx, tile, t, src_view, dst_view, acc_ty, dst_ty, OP, None, None)\n"
               "        signal_all(record + DONE, ctx.rank, ctx.world_size, ctx.heap_bases)\n"
               "        wait_at_least(record + DONE, epoch * (ctx.world_size - 1), call, \"done\", ctx.rank, -1, t,\n"
               "                      ctx.heap_bases, record + EPOCH)\n",
               "        _two_shot_tile(ctx, tile, t, src_view, dst_view, acc_ty, dst_ty, OP, None, None)\n"
               "        signal_all(record + DONE, ctx.rank, ctx.world_size, ctx.heap_bases)\n", 1)],
             [("worker", "3", "promises_worker.py", "back_to_back_in_one_kernel")], expect="summed data of another call"),
    Mutation("two-shot-range-no-final-wait", "two-shot (per TileRange, as ccl runs it) returns once no peer reads "
             "this rank's source tiles",
             [(f"{COLL}/_all_reduce.py", "        if ctx.world_size > 1:\n"
               "            signal_and_wait_all(ctx, record, DONE, epoch, call, \"done\", slot)\n",
               "        if ctx.world_size > 1:\n"
               "            signal_all(record + DONE, ctx.rank, ctx.world_size, ctx.heap_bases)\n", 1)],
             [("worker", "3", "promises_worker.py", "back_to_back_in_one_kernel")], expect="summed data of another call"),
    Mutation("rotated-partials-truncate", "Config(partial_dtype='input'): each partial is rounded to the inputs' "
             "dtype to nearest even",
             [(f"{COLL}/ops/_rotated.py", "round_to(acc, partial.dtype.element_ty)", "acc.to(partial.dtype.element_ty)",
               2)],
             [("worker", "3", "promises_worker.py", "matmul_all_reduce_partials_in_input_dtype")],
             expect="rounded once to nearest even"),
    Mutation("rotated-partials-fp32", "Config(partial_dtype='input') stages the partials in the inputs' dtype",
             [(f"{COLL}/ops/_matmul_reduce_scatter.py",
               "staged = a.dtype if cfg.partial_dtype == \"input\" else accumulator_dtype(a.dtype)",
               "staged = accumulator_dtype(a.dtype)", 1)],
             [("worker", "2", "ops_worker.py", "partials_in_input_dtype")], expect="elements differ"),
    Mutation("fp32-inputs-stay-fused", "fp32 inputs take cuBLAS + ccl when they ask for torch's own precision",
             [(f"{COLL}/ops/_config.py", "        if picked is not None:\n            given[\"variant\"] = picked\n",
               "", 1)],
             [("pytest", "packages/iris-collectives/tests/test_ops_config.py::"
               "test_fp32_inputs_multiply_at_torchs_precision_through_cublas_and_ccl")],
             expect="AssertionError"),
    Mutation("table-never-borrowed", "a card without a table of its own gets a measured card's of its compute capability",
             [(f"{COLL}/ccl/_table.py", "if capability is not None and other.get(\"capability\") == capability:",
               "if False:", 1)],
             [("pytest", "packages/iris-collectives/tests/test_ccl_host.py::"
               "test_each_card_gets_its_own_table_else_one_of_its_compute_capability_else_the_fallback")],
             expect="AssertionError"),
    Mutation("sub-context-own-gpu", "a context of some of the job's ranks binds the GPU the process has in the job",
             [(f"{RUNTIME}/_heap_cuda.py", "local_rank, local_size = boot.node_slot()",
               "local_rank, local_size = boot.local_rank, boot.local_size", 1)],
             [("pytest", "packages/iris-runtime/tests/test_runtime_bootstrap_choice.py::"
               "test_a_context_of_some_ranks_takes_the_gpu_the_process_has_in_the_job")],
             expect="AssertionError"),
    Mutation("torch-sub-group-shares-world", "a torch group of some of the ranks runs on a context of its members",
             [(f"{COLL}/distributed/_backend.py", "members=ranks if some else None", "members=None", 1)],
             [("pytest", "packages/iris-collectives/tests/test_torch_backend.py::"
               "test_registered_once_and_groups_of_some_ranks_know_their_members")],
             expect="AssertionError"),
    Mutation("fp32-precision-always-tf32", "fp32 inputs multiply at torch's fp32 precision by default",
             [(f"{COLL}/ops/_config.py", 'fields.setdefault("input_precision", fp32 or "tf32")',
               'fields.setdefault("input_precision", "tf32")', 1)],
             [("pytest", "packages/iris-collectives/tests/test_ops_config.py::"
               "test_fp32_inputs_multiply_at_torchs_precision_through_cublas_and_ccl")],
             expect="AssertionError"),
    Mutation("unfused-bias-rounded-first", "strategy unfused adds a bias of another dtype before the one rounding",
             [(f"{COLL}/ops/_unfused.py", "    if narrow and (bias is None or bias.dtype == a.dtype):\n",
               "    if narrow:\n", 1),
              (f"{COLL}/ops/_unfused.py", "torch.addmm(bias, a, b, out=into)", "torch.addmm(bias.to(a.dtype), a, b, out=into)",
               1)],
             [("worker", "2", "ops_worker.py", "gather_ops_unfused")], expect="with an fp32 bias on bf16 inputs"),
    Mutation("all-gather-registers-by-input", "all_gather registers plain tensors on the fly by its message (the output)",
             [(f"{COLL}/ccl/_move.py", "_launch.agreed_reach(ctx, config, inp, message=out)",
               "_launch.agreed_reach(ctx, config, inp)", 1)],
             [("pytest", "packages/iris-collectives/tests/test_ccl_host.py::"
               "test_registration_on_the_fly_is_decided_by_the_message_all_gathers_being_its_output")]),
    Mutation("unfused-gather-no-copy-out", "strategy unfused of the gather ops writes any out, a transposed one too",
             [(f"{COLL}/ops/_unfused.py", "    if target is not out:\n        out.copy_(target)\n", "", 1)],
             [("worker", "2", "ops_worker.py", "gather_ops_unfused")], expect="unfused into a transposed"),
    # --- issue #54: checks that a wrong call fails loudly (an IrisError, not a wrong answer or a crash) ---
    Mutation("broadcast-negative-src", "ccl.broadcast refuses src=-1 (a negative rank), naming it",
             [(f"{COLL}/ccl/_move.py", "if src.__class__ is not int or not 0 <= src < ctx.world_size:",
               "if src.__class__ is not int or not src < ctx.world_size:", 1)],
             [("worker", "2", "ccl_worker.py", "argument_errors")], expect="outside [0, 2)"),
    Mutation("all-to-all-short-out", "ccl.all_to_all refuses an out of another shape than inp (a short one would be "
             "written past its end)",
             [(f"{COLL}/ccl/_move.py", "        if out.shape != inp.shape:\n            raise IrisUsageError(f\"{call}: "
               "out has shape", "        if False:\n            raise IrisUsageError(f\"{call}: out has shape", 1)],
             [("worker", "2", "ccl_worker.py", "argument_errors")], expect="an out of inp's shape"),
    Mutation("gather-rows-unchecked", "ccl.all_gather (and reduce_scatter) refuse the right number of elements in "
             "the wrong rows along dim 0",
             [(f"{COLL}/ccl/_checks.py", "rows_ok = big.dim() == 0 or small.dim() == 0 or big.shape[0] == W * "
               "small.shape[0]", "rows_ok = True", 1)],
             [("worker", "2", "ccl_worker.py", "argument_errors")], expect="x its rows along dim 0"),
    Mutation("call-key-ignores-inp-strides", "a cached plan is never run for a non-contiguous input of the same "
             "address and shape",
             [(f"{COLL}/ccl/_launch.py", "inp.dtype, inp.is_contiguous(), out.data_ptr()", "inp.dtype, out.data_ptr()",
               1)],
             [("pytest", "packages/iris-collectives/tests/test_ccl_host.py::test_the_call_key_is_what_the_caller_passed"),
              ("worker", "2", "ccl_worker.py", "argument_errors")], expect="not contiguous"),
    Mutation("reach-ignores-offsets", "ctx.reach stages views of one registered tensor at different offsets (or "
             "of different sizes) on different ranks",
             [(f"{RUNTIME}/_reach.py", "same = all(s[:4] == statuses[0][:4] for s in statuses)",
               "same = all(s[:2] == statuses[0][:2] for s in statuses)", 1)],
             [("worker", "2", "iris-runtime/tests/workers/runtime_worker.py", "registered_tensors")],
             expect="must be staged"),
    Mutation("strided-bias-read-flat", "the fused ops refuse a strided bias (their kernels read it as contiguous)",
             [(f"{COLL}/ops/_checks.py", "        if bias.stride(0) != 1:\n", "        if False:\n", 1)],
             [("worker", "2", "ops_worker.py", "argument_errors")], expect="bias must be contiguous"),
    Mutation("reduce-scatter-avg-grad-not-divided", "the gradient of reduce_scatter(op='avg') is the gathered "
             "gradient divided by the world size",
             [(f"{COLL}/functional/_collective_ops.py",
               "        grad = _divided(grad, _world(ctx.handle, \"reduce_scatter\"))\n", "        grad = grad\n", 1)],
             [("worker", "2", "torch_ops_worker.py", "gradcheck_collectives")], expect="Jacobian mismatch"),
    Mutation("watchdog-names-another-rank", "the watchdog's report names the rank that waited",
             [(f"{RUNTIME}/_watchdog.py", "                        rank=self.rank)\n",
               "                        rank=(self.rank + 1) % self.world_size)\n", 1)],
             [("pytest", "packages/iris-runtime/tests/test_runtime_local.py::"
               "test_watchdog_report_names_rank_call_flag_tile_values_and_peer"),
              ("pytest", "packages/iris-collectives/tests/test_collectives_faults.py", "-k", "skip and 2")]),
    Mutation("no-heap-check", "under the interpreter a remote access through a pointer off the heap (or a rank out "
             "of range) raises by default, naming the call, the rank, the tensor and ctx.zeros()",
             [(f"{DEVICE}/_translate.py", "    elif INTERPRETER:\n        _check_reach(", "    elif False:\n        _check_reach(",
               1)],
             [("pytest", "packages/iris-device/tests/test_device_errors.py", "-k", "default or plain_tensor or past_the_heap"),
              ("pytest", "packages/iris-collectives/tests/test_collectives_faults.py", "-k", "bad_pointer and 2")]),
    Mutation("kernel-errors-wrapped", "an IrisError raised in an interpreted kernel reaches the caller as itself, in "
             "one line",
             [(f"{DEVICE}/__init__.py", "    surface_iris_errors()  #", "    pass  #", 1)],
             [("pytest", "packages/iris-device/tests/test_device_errors.py", "-k", "plain_tensor"),
              ("pytest", "packages/iris-collectives/tests/test_collectives_faults.py", "-k", "bad_pointer and 2")]),
    Mutation("rmsnorm-of-rounded-residual", "all_reduce_residual_rmsnorm normalises the fp32 sum (rounded once)",
             [(f"{COLL}/_all_reduce_norm.py", "    y = rms_norm_rows(acc, weight, cols, N, eps)\n",
               "    y = rms_norm_rows(round_to(acc, out_ty).to(tl.float32), weight, cols, N, eps)\n", 1)],
             [("worker", "3", "ops_worker.py", "all_reduce_residual_rmsnorm")], expect="not of the rounded residual"),
    Mutation("rmsnorm-two-shot-stores-locally", "all_reduce_rmsnorm's two-shot writes every rank's share everywhere",
             [(f"{COLL}/_all_reduce_norm.py", "        if i == ctx.world_size - 1 and local_ptrs is not None:\n",
               "        if i != ctx.world_size - 1:\n            pass\n        elif local_ptrs is not None:\n", 1)],
             [("worker", "3", "ops_worker.py", "all_reduce_residual_rmsnorm"),
              ("worker", "3", "collectives_worker.py", "all_reduce_rmsnorm")], expect="elements differ"),
    Mutation("backend-max-is-min", "the torch.distributed backend reduces with the ReduceOp the caller names",
             [(f"{COLL}/distributed/_convert.py", 'dist.ReduceOp.MAX: "max", dist.ReduceOp.MIN: "min"',
               'dist.ReduceOp.MAX: "min", dist.ReduceOp.MIN: "max"', 1)],
             [("worker", "2", "torch_backend_worker.py", "iris", "all_reduce_ops")], expect="all_reduce RedOpType.M"),
    Mutation("backend-uneven-splits-alone", "a rank whose own all-to-all splits look equal takes the uneven path "
             "when another rank's are uneven (no wait in another collective)",
             [(f"{COLL}/distributed/_group.py", "            if any(u for u, _, _ in seen):", "            if uneven:", 1)],
             [("worker", "2", "torch_backend_worker.py", "iris", "all_to_all", "IRIS_TIMEOUT_S=20")],
             expect="all_to_all"),
    # --- issue #54: wrong calls fail loudly (the call agreement, deadlines on host waits) ------------------
    Mutation("agreement-ignores-dtype", "the call agreement compares dtypes: fp32 on one rank, fp64 on another raises",
             [(f"{COLL}/_agree.py", "        return (t.shape, t.dtype, strides, ", "        return (t.shape, "
               "torch.float32, strides, ", 1)],
             [("worker", "2", "ccl_worker.py", "calls_agree")], expect="float64[1024]"),
    Mutation("exchange-rows-agreed", "an exchange agrees on the rows past dim 0 (what sizes its heap buffers), not "
             "on each rank's own row count",
             [(f"{COLL}/_agree.py", '    rest = "".join(f", {d}" for d in t.shape[1:])\n',
               '    rest = ""\n', 1)],
             [("worker", "2", "ccl_worker.py", "calls_agree")], expect="out=float32[capacity, 8]"),
    Mutation("device-check-blind", "a cached call that differs between ranks is caught by its kernel",
             [(f"{DEVICE}/_calls.py", "            if peer < world_size:\n", "            if peer < 0:\n", 1)],
             [("pytest", "packages/iris-collectives/tests/test_collectives_faults.py", "-k", "calls_hit-2")],
             expect="CHECK result rank"),
    # Not in QUICK: the host silences stdout as soon as it reads the report, so without the hold a
    # result gets printed only when the call returns before that (most runs, not every one).
    Mutation("stopped-wait-returns", "a wait that gave up holds its kernel until the job ends: no rank prints a "
             "result",
             [(f"{DEVICE}/_watchdog.py", "            heap_bases)\n    _await_ack(trailer)\n", "            heap_bases)\n", 1)],
             [("pytest", "packages/iris-collectives/tests/test_collectives_faults.py", "-k", "calls_skip_warm and 2")],
             expect="printed the result of a call that went wrong"),
    Mutation("deadline-names-no-rank", "a host wait that runs out names the rank that did not come",
             [(f"{RUNTIME}/_host_waits.py", "            if p_seq < seq:\n", "            if False:\n", 1)],
             [("pytest", "packages/iris-collectives/tests/test_collectives_faults.py", "-k", "calls_late and 2")],
             expect="is past its host call"),
    Mutation("host-waits-unbounded", "every host collective of a context is bounded by the watchdog (here: a rank "
             "that skips a first call and closes)",
             [(f"{RUNTIME}/_iris.py", "self._boot = WatchedBootstrap(boot, self._host_waits)", "self._boot = boot", 1)],
             [("pytest", "packages/iris-collectives/tests/test_collectives_faults.py", "-k", "calls_skip_first and 2")]),
    Mutation("agreement-keeps-plans", "the plans built on signatures the agreement forgets go with them (else a "
             "rank whose plan is cached skips the agreement that a rank with a new tensor makes)",
             [(f"{COLL}/ccl/_launch.py", "_agreement.FORGET_HOOKS.append(forget)", "pass", 1)],
             [("worker", "2", "ccl_worker.py", "calls_agree", "IRIS_TIMEOUT_S=5", "MPIEXEC_TIMEOUT=120")],
             expect="the agreement on"),
    Mutation("reduce-plan-ignores-root", "each root of ccl.reduce has its own agreed call, which its kernel checks "
             "(cached calls whose roots differ between ranks raise)",
             [(f"{COLL}/ccl/_rooted.py", 'call_key(("reduce", op, root), ', 'call_key(("reduce", op), ', 1)],
             [("worker", "2", "ccl_worker.py", "calls_agree")], expect="found by its kernel"),
    Mutation("rmsnorm-kernel-unchecked", "all_reduce_residual_rmsnorm's kernel checks its agreed call against the "
             "peers' (cached calls that differ raise)",
             [(f"{COLL}/ops/_all_reduce_rmsnorm.py", "M, N, float(eps), half, fp, rank)", "M, N, float(eps), half, 1, rank)",
               1)],
             [("worker", "2", "ops_worker.py", "calls_agree")], expect="found by its kernel"),
    Mutation("board-ignores-other-calls", "ranks in different host calls at the same point end the job at once",
             [(f"{RUNTIME}/_host_waits.py", "            elif p_seq == seq and p_inside and p_kind != kind",
               "            elif False", 1)],
             [("pytest", "packages/iris-collectives/tests/test_collectives_faults.py", "-k", "calls_skip_first and 2")],
             expect="the job ended"),
    # --- issue #56: groups ------------------------------------------------------------------------------
    Mutation("group-shares-call-words", "a group counts and compares its calls in call words of its own, not the "
             "context's",
             [(f"{RUNTIME}/_group.py", "self.size + layout.CALL_WORDS_OFFSET] = self.ctx.offset_of(self._arena) + ",
               "self.size + layout.CALL_WORDS_OFFSET] += 0 * ", 1)],  # keeps the context's (the pad's)
             [("worker", "4", "ccl_worker.py", "groups")], expect="scenario 'groups' failed"),
    Mutation("operator-backward-on-context", "the gradient of an operator called on a group communicates on the "
             "same group",
             [(f"{COLL}/functional/_collective_ops.py",
               "torch.ops.iris.reduce_scatter(ctx.handle, grad.contiguous())",
               "torch.ops.iris.reduce_scatter(_whole(ctx.handle), grad.contiguous())", 1),
              (f"{COLL}/functional/_collective_ops.py", "def _world(handle: int, name: str) -> int:",
               "def _whole(handle):  # the handle of the context of a group's handle\n"
               "    from ._handles import handle_of\n\n    on = context_of(handle, 'mutation')\n"
               "    return handle_of(getattr(on, 'ctx', on))\n\n\ndef _world(handle: int, name: str) -> int:", 1)],
             [("worker", "4", "torch_ops_worker.py", "operators_on_groups")],
             expect="scenario 'operators_on_groups' failed"),
    Mutation("layer-splits-over-context", "a layer on a group splits over the group's size and rank",
             [(f"{COLL}/nn/_linear.py", "        on = ctx if group is None else group", "        on = ctx", 1)],
             [("worker", "4", "torch_ops_worker.py", "layers_on_groups")], expect="scenario 'layers_on_groups' failed"),
    Mutation("group-ring-in-signal-pad", "the ring all-reduce on a group keeps its flags in the group's workspace, "
             "not in the signal pad that every group of a rank shares",
             [(f"{COLL}/_ring.py", "            record = _group_record(ctx, t)", "            record = _pad_record(ctx, t)",
               1)],
             [("worker", "4", "collectives_worker.py", "groups_back_to_back")],
             expect="scenario 'groups_back_to_back' failed"),
    Mutation("group-ignored-in-kernel", "a tile collective called with group= runs among the group's members, in "
             "group ranks",
             [(f"{DEVICE}/_group.py", "    return DeviceContext(group.rank, group.size, group.heap_bases, ctx.tracing)",
               "    return ctx", 1)],
             [("worker", "4", "collectives_worker.py", "groups_tile_collectives", "IRIS_TIMEOUT_S=5",
               "MPIEXEC_TIMEOUT=120")]),
    Mutation("p2p-groups-share-mailboxes", "a send on a group pairs only with a recv on the same group: each group "
             "has mailboxes of its own",
             [(f"{COLL}/ccl/_p2p.py", "    ws = _workspace.lookup(ctx, MAILBOXES)\n    if ws is None and isinstance",
               "    ws = _workspace.lookup(getattr(ctx, 'ctx', ctx), MAILBOXES)\n    if ws is None and isinstance", 1)],
             [("worker", "4", "ccl_worker.py", "p2p_groups", "IRIS_TIMEOUT_S=5", "MPIEXEC_TIMEOUT=120")]),
    Mutation("p2p-group-init-context-wide", "init_p2p(group=) is collective over the group's members only: no host "
             "call of the whole context, which ranks outside the group never make",
             [(f"{COLL}/ccl/_p2p.py", "    ws = _workspace.workspace(ctx, MAILBOXES, make)",
               "    (ctx.ctx if group is not None else ctx).barrier()\n    ws = _workspace.workspace(ctx, MAILBOXES, make)",
               1)],
             [("worker", "3", "ccl_worker.py", "p2p_groups", "IRIS_TIMEOUT_S=5", "MPIEXEC_TIMEOUT=120")]),
    Mutation("moe-group-ignored", "a MoE dispatch on a group splits the experts over the group's members",
             [(f"{COLL}/moe/__init__.py", "        ctx = on_group(ctx, group, DISPATCH)", "        pass", 1)],
             [("worker", "4", "ccl_worker.py", "moe_groups", "IRIS_TIMEOUT_S=5", "MPIEXEC_TIMEOUT=120")]),
    Mutation("moe-layer-group-ignored", "nn.ExpertParallelMoE(group=) runs every call on the group",
             [(f"{COLL}/nn/_moe.py", "self.handle = call, handle_of(ctx, group, call)",
               "self.handle = call, handle_of(ctx)", 1)],
             [("worker", "4", "torch_ops_worker.py", "layers_on_groups", "IRIS_TIMEOUT_S=5", "MPIEXEC_TIMEOUT=300")]),
]

#: What ``--quick`` (and ``nox -s mutations``, which CI runs) takes: the promises of issue #37 and of
#: ``Config(partial_dtype="input")``, and the checks of issue #54 that take one short launch (a few
#: seconds each; not those that also run the fault test's jobs), seconds to a minute each on the
#: cpu backend. Every mutation's text is checked first in any case.
QUICK = ["sum-own-first", "two-shot-own-first", "owner-sums-own-first", "owner-truncates", "matmul-all-gather-truncates",
         "all-gather-matmul-truncates", "one-shot-truncates", "barrier-ignores-epoch", "one-shot-no-final-wait",
         "one-shot-range-no-final-wait", "two-shot-no-final-wait", "two-shot-range-no-final-wait",
         "rotated-partials-truncate", "rotated-partials-fp32", "buffered-one-half", "buffered-waits-done",
         "reach-never-agreed", "reach-no-recency", "reach-status-stale", "reach-drops-plans",
         "unfused-bias-early", "fp32-inputs-stay-fused", "fp32-precision-always-tf32",
         "unfused-gather-no-copy-out", "all-gather-registers-by-input",
         "unfused-bias-rounded-first", "broadcast-negative-src", "all-to-all-short-out", "gather-rows-unchecked",
         "call-key-ignores-inp-strides", "reach-ignores-offsets", "strided-bias-read-flat",
         "reduce-scatter-avg-grad-not-divided", "p2p-no-credit", "p2p-size-unchecked", "p2p-recv-dead-code",
         "rmsnorm-of-rounded-residual", "agreement-ignores-dtype", "exchange-rows-agreed", "device-check-blind",
         "deadline-names-no-rank"]


def copy_packages(root: str) -> None:
    shutil.copytree(os.path.join(REPO, "packages"), os.path.join(root, "packages"),
                    ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "build"))


def stale(mutation: Mutation) -> list[str]:
    """What no longer applies of ``mutation`` in the repository's packages: one line per edit whose
    text occurs another number of times than stated."""
    found = []
    for rel, old, _, count in mutation.edits:
        with open(os.path.join(REPO, "packages", rel)) as f:
            seen = f.read().count(old)
        if seen != count:
            first = old.strip().splitlines()[0]
            found.append(f"mutation {mutation.name}: packages/{rel} holds {seen} copies of the text to replace, "
                         f"expected {count} (it starts {first!r}): update the mutation to the current source")
    return found


def mutate(mutation: Mutation, root: str) -> None:
    copy_packages(root)
    problems = stale(mutation)
    if problems:
        raise SystemExit("\n".join(problems))
    for rel, old, new, _ in mutation.edits:
        path = os.path.join(root, "packages", rel)
        with open(path) as f:
            text = f.read()
        with open(path, "w") as f:
            f.write(text.replace(old, new))


def run_check(check: tuple[str, ...], root: str, env: dict[str, str]) -> tuple[bool, float, str]:
    """(passed, seconds, output) of one check against the copy at ``root``."""
    pkgs = os.path.join(root, "packages")
    full = dict(os.environ, PYTHONPATH=os.pathsep.join(
        os.path.join(pkgs, p, "src") for p in ("iris-device", "iris-runtime", "iris-collectives")), **env)
    full.pop("TRITON_INTERPRET", None)
    full.setdefault("IRIS_BACKEND", "cpu")
    if check[0] == "pytest":
        cmd = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
               *[os.path.join(root, a) if a.startswith("packages/") else a for a in check[1:]]]
    else:
        nranks, rest = check[1], list(check[2:])
        script = rest.pop(0) if rest and rest[0].endswith(".py") else "collectives_worker.py"
        scenarios = [a for a in rest if "=" not in a]
        full.setdefault("MPIEXEC_TIMEOUT", "600")  # a mutation that hangs a job ends it
        full.update(dict(a.split("=", 1) for a in rest if "=" in a))
        # the launcher of iris.runtime.testing, asked in a child (importing iris here would fix
        # Triton's mode in this process)
        code = "import shlex; from iris.runtime.testing import launcher; print(shlex.join(launcher()))"
        found = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=full, check=True)
        worker = os.path.join(pkgs, *(script.split("/") if "/" in script else
                                      ("iris-collectives", "tests", "workers", script)))
        cmd = shlex.split(found.stdout.strip().splitlines()[-1]) + ["-n", nranks, sys.executable, "-m", "mpi4py",
                                                                    worker, *scenarios]
    start = time.monotonic()
    shm_before = sorted(os.listdir(SHM)) if os.path.isdir(SHM) else []
    proc = subprocess.run(cmd, capture_output=True, text=True, env=full, cwd=root, timeout=1800)
    seconds = time.monotonic() - start
    if proc.returncode != 0 and check[0] != "pytest":  # (pytest's jobs go through run_ranks, which cleans up)
        # an aborted MPICH job leaves its /dev/shm segment; iris.runtime.testing removes the dead ones
        code = ("import json, sys; from iris.runtime.testing import remove_dead_mpich_segments; "
                "remove_dead_mpich_segments(set(json.load(sys.stdin)))")
        subprocess.run([sys.executable, "-c", code], input=json.dumps(shm_before), text=True, env=full,
                       capture_output=True, timeout=300)
    return proc.returncode == 0, seconds, proc.stdout + proc.stderr


def evidence(output: str, expect: str) -> str:
    """The first line of a failing check's output that holds ``expect`` (else its last line)."""
    lines = output.strip().splitlines() or [""]
    return next((line for line in lines if expect and expect in line), lines[-1]).strip()[:400]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("names", nargs="*", help="mutations to run (default: all)")
    p.add_argument("--list", action="store_true")
    p.add_argument("--check", action="store_true", help="only check that every mutation still applies")
    p.add_argument("--quick", action="store_true", help=f"run the quick subset: {', '.join(QUICK)}")
    p.add_argument("--baseline", action="store_true", help="run each check unmutated first; it must pass")
    args = p.parse_args()
    names = args.names + (QUICK if args.quick else [])
    chosen = [m for m in MUTATIONS if not names or m.name in names]
    unknown = set(names) - {m.name for m in MUTATIONS}
    if unknown:
        raise SystemExit(f"unknown mutation(s) {sorted(unknown)}; --list shows them")
    if args.list:
        for m in chosen:
            print(f"{m.name}{' (quick)' if m.name in QUICK else ''}: {m.promise}\n"
                  f"    checks: {[' '.join(c) for c in m.checks]}")
        return
    # Every mutation's text first, all of them with --check: a stale one ends the run before any test.
    problems = [line for m in (MUTATIONS if args.check else chosen) for line in stale(m)]
    if problems:
        raise SystemExit("\n".join(problems))
    if args.check:
        print(f"all {len(MUTATIONS)} mutations apply to the current source")
        return
    rows, missed = [], 0
    for m in chosen:
        if args.baseline:
            with tempfile.TemporaryDirectory(prefix="iris-baseline-") as root:
                copy_packages(root)
                for check in m.checks:
                    ok, seconds, output = run_check(check, root, m.env)
                    if not ok:
                        tail = "\n".join(output.strip().splitlines()[-3:])
                        raise SystemExit(f"baseline of {m.name}: {' '.join(check)} fails unmutated:\n{tail}")
        with tempfile.TemporaryDirectory(prefix=f"iris-mutant-{m.name}-") as root:
            mutate(m, root)
            for check in m.checks:
                ok, seconds, output = run_check(check, root, m.env)
                outcome = "MISSED" if ok else "caught" if m.expect in output else f"failed without {m.expect!r}"
                missed += outcome != "caught"
                rows.append((m.name, m.promise, " ".join(check), outcome, seconds))
                print(f"{m.name}: {' '.join(check)}: {outcome} ({seconds:.0f} s)", flush=True)
                if not ok:
                    print(f"    {evidence(output, m.expect)}", flush=True)
    print("\n| mutation | promise | check | outcome | s |\n| --- | --- | --- | --- | --- |")
    for name, promise, check, outcome, seconds in rows:
        print(f"| {name} | {promise} | `{check}` | {outcome} | {seconds:.0f} |")
    raise SystemExit(1 if missed else 0)


if __name__ == "__main__":
    main()
