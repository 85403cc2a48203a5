"""iris.device under Triton's interpreter in one process, on a fake two-rank heap (two halves of one
buffer): the errors that must come at interpretation time, the interpreter-only limits (fp16/bf16
atomics), and with ``IRIS_DEBUG=1`` the in-kernel checks. No MPI: the multi-rank behaviour is
``device_rank_worker.py``'s job. Without ``IRIS_DEBUG`` the default checks of every remote access
(ranks, addresses on the heap) run too (``off_heap``).

Run with ``TRITON_INTERPRET=1`` (``test_device_errors.py`` does it). Prints one JSON object as its
last line. ``--only errors,unsupported,fp16_cas,off_heap,debug`` picks sections.
"""

from __future__ import annotations

import argparse
import json
import os

assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1"

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from device_test_kernels import error_kernel, root_cause  # noqa: E402
from device_test_tables import ERROR_CASES  # noqa: E402

import iris.device as device  # noqa: E402
from iris.device import DeviceContext  # noqa: E402
from iris.device import _layout as layout  # noqa: E402

HEAP = 1 << 16  # bytes per fake rank
PAD = layout.SIGNAL_PAD_BYTES  # the runtime maps a signal pad after each heap
STRIDE = HEAP + PAD


class FakeHeap:
    """Two 'ranks' whose heaps are the two halves of one buffer; a context tensor per rank."""

    def __init__(self, world_size: int = 2):
        self.buffer = torch.zeros(world_size * STRIDE // 8, dtype=torch.int64)
        base = self.buffer.data_ptr()
        self.bases = [base + r * STRIDE for r in range(world_size)]
        self.contexts = []
        for rank in range(world_size):
            words = [0] * layout.context_length(world_size)
            words[layout.CUR_RANK] = rank
            words[layout.NUM_RANKS] = world_size
            words[layout.HEAP_BASES:layout.HEAP_BASES + world_size] = self.bases
            words[layout.HEAP_BASES + world_size + layout.HEAP_SIZE] = HEAP
            self.contexts.append(torch.tensor(words, dtype=torch.int64))

    def tensor(self, rank: int, offset: int, numel: int, dtype: torch.dtype) -> torch.Tensor:
        """A view of ``numel`` elements at byte ``offset`` of ``rank``'s heap."""
        start = rank * STRIDE + offset
        raw = self.buffer.view(torch.uint8)[start:start + numel * dtype.itemsize]
        return raw.view(dtype)

    def heap_bases(self, rank: int) -> torch.Tensor:
        return self.contexts[rank][layout.HEAP_BASES:layout.HEAP_BASES + len(self.bases)]


def outcome(fn) -> dict:
    try:
        fn()
    except Exception as exc:
        root = root_cause(exc)
        # "raised_as": what the caller of the launch catches (the launch takes an IrisError out of
        # the interpreter's wrapping)
        return {"raised": True, "type": type(root).__name__, "iris_error": isinstance(root, device.IrisError),
                "message": str(root), "raised_as": type(exc).__name__}
    return {"raised": False}


# ---------------------------------------------------------------------------------------------


def section_errors(heap: FakeHeap) -> dict:
    ptrs = [heap.tensor(0, 0, 8, dt) for dt in (torch.float32, torch.int32, torch.float16, torch.bfloat16,
                                                 torch.int8)]
    return {case: outcome(lambda case=case: error_kernel[(1,)](heap.contexts[0], *ptrs, 0, 1, case))
            for case in ERROR_CASES}


@triton.jit
def unsupported_kernel(context, heap_bases, p_f16, p_bf16, rank: tl.constexpr, world_size: tl.constexpr,
                       CASE: tl.constexpr):
    ctx = DeviceContext.initialize(context, rank, world_size)
    if CASE == "add_fp16":
        ctx.atomic_add(p_f16, 1.0, 1)
    elif CASE == "sub_fp16":
        ctx.atomic_sub(p_f16, 1.0, 1, sem="relaxed")
    elif CASE == "free_add_fp16":
        device.atomic_add(p_f16, 1.0, rank, 1, heap_bases, scope="sys")
    elif CASE == "add_bf16":
        ctx.atomic_add(p_bf16, 1.0, 0)
    elif CASE == "cas_bf16":
        ctx.atomic_cas(p_bf16, 0.0, 1.0, 1)
    else:
        tl.static_assert(CASE == "free_cas_bf16")
        device.atomic_cas(p_bf16, 0.0, 1.0, rank, 0, heap_bases)


UNSUPPORTED_CASES = ("add_fp16", "sub_fp16", "free_add_fp16", "add_bf16", "cas_bf16", "free_cas_bf16")


def section_unsupported(heap: FakeHeap) -> dict:
    f16 = heap.tensor(0, 0, 4, torch.float16)
    bf16 = heap.tensor(0, 64, 4, torch.bfloat16)
    return {case: outcome(lambda case=case: unsupported_kernel[(1,)](heap.contexts[0], heap.heap_bases(0), f16,
                                                                      bf16, 0, 2, case))
            for case in UNSUPPORTED_CASES}


@triton.jit
def cas16_kernel(context, p, olds, rank: tl.constexpr, world_size: tl.constexpr):
    ctx = DeviceContext.initialize(context, rank, world_size)
    lanes = tl.arange(0, 4)
    # Lanes 0 and 2 match, 1 and 3 do not; the neighbours must survive (a 4-byte CAS would not).
    cmp = tl.where(lanes % 2 == 0, 1.5, 9.0)
    old = ctx.atomic_cas(p + lanes * 2, cmp, 2.5 + lanes, 1, sem="acq_rel", scope="sys")
    tl.store(olds + lanes, old)


def section_fp16_cas(heap: FakeHeap) -> dict:
    target = heap.tensor(1, 256, 8, torch.float16)  # rank 1's heap, same offset as rank 0's pointer
    target.copy_(torch.tensor([1.5, -4.0] * 4, dtype=torch.float16))
    pointer = heap.tensor(0, 256, 8, torch.float16)
    olds = torch.full((4,), -1.0, dtype=torch.float16)
    cas16_kernel[(1,)](heap.contexts[0], pointer, olds, 0, 2)
    return {"target": target.float().tolist(), "olds": olds.float().tolist()}


# ---------------------------------------------------------------------------------------------
# IRIS_DEBUG=1


@triton.jit
def debug_kernel(context, heap_bases, x, shift, n, peer, rank: tl.constexpr, world_size: tl.constexpr,
                 OP: tl.constexpr, BLOCK: tl.constexpr):
    ctx = DeviceContext.initialize(context, rank, world_size)
    offs = tl.arange(0, BLOCK)
    m = offs < n
    p = x + shift + offs
    if OP == "load":
        v = ctx.load(p, peer, mask=m, other=0.0)
        tl.store(x + offs, v, mask=m)
    elif OP == "store":
        ctx.store(p, offs.to(tl.float32), peer, mask=m)
    elif OP == "get":
        ctx.get(p, x + offs, peer, mask=m)
    elif OP == "put":
        ctx.put(x + offs, p, peer, mask=m)
    elif OP == "copy":
        ctx.copy(p, x + offs, peer, rank, mask=m)
    elif OP == "atomic_add":
        ctx.atomic_add(p, 1.0, peer, mask=m)
    elif OP == "atomic_cas":
        ctx.atomic_cas(x + shift, 0.0, 1.0, peer)
    elif OP == "free_store":
        device.store(p, offs.to(tl.float32), rank, peer, heap_bases, mask=m)
    elif OP == "translate_lanes":  # a block of peers: even lanes `peer`, odd lanes this rank
        peers = tl.where(offs % 2 == 0, peer, rank)
        v = tl.load(device.translate(p, rank, peers, heap_bases), mask=m, other=0.0)
        tl.store(x + offs, v, mask=m)
    else:
        tl.static_assert(OP == "translate")
        tl.store(x, tl.load(device.translate(x + shift, rank, peer, heap_bases)))


def section_debug(heap: FakeHeap) -> dict:
    x = heap.tensor(0, 1024, 64, torch.float32)
    far = (HEAP + PAD - 1024) // 4 + 3  # 3 elements past the heap (and its pad), in elements of x

    def run(op, shift=0, n=16, peer=1, rank=0, world_size=2, pointer=x):
        return outcome(lambda: debug_kernel[(1,)](heap.contexts[0], heap.heap_bases(0), pointer, shift, n, peer,
                                                  rank, world_size, op, 16))

    outside = torch.zeros(64, dtype=torch.float32)  # not on any heap
    result = {
        "valid": {op: run(op) for op in ("load", "store", "get", "put", "copy", "atomic_add", "atomic_cas",
                                         "free_store", "translate", "translate_lanes")},
        "bad_peer": run("load", peer=77),
        "negative_peer": run("atomic_add", peer=-1),
        "free_bad_peer": run("free_store", peer=5),
        "outside_heap": run("store", pointer=outside),
        "past_heap_end": run("get", shift=far),
        "cas_past_heap_end": run("atomic_cas", shift=far),
        "translate_past_heap_end": run("translate", shift=far),
        "lanes_bad_peer": run("translate_lanes", peer=77),
        "lanes_past_heap_end": run("translate_lanes", shift=far),
        "masked_past_end_is_fine": run("load", shift=far - 11, n=8),
        "context_mismatch": run("load", rank=1),
        "first_bad_offset": 1024 + far * 4,
        "outside_offset": outside.data_ptr() - heap.bases[0],
    }
    return result


def section_off_heap(heap: FakeHeap) -> dict:
    """Without IRIS_DEBUG: the interpreter's default check of every remote access (ranks in range,
    addresses on the heap for another rank), and what it lets through."""
    x = heap.tensor(0, 1024, 64, torch.float32)
    far = (HEAP + PAD - 1024) // 4 + 3  # 3 elements past the heap (and its pad), in elements of x

    def run(op, shift=0, n=16, peer=1, pointer=x):
        return outcome(lambda: debug_kernel[(1,)](heap.contexts[0], heap.heap_bases(0), pointer, shift, n, peer,
                                                  0, 2, op, 16))

    outside = torch.zeros(64, dtype=torch.float32)  # not on any heap
    return {
        "valid": {op: run(op) for op in ("load", "store", "get", "put", "copy", "atomic_add", "atomic_cas",
                                         "free_store", "translate", "translate_lanes")},
        "plain_tensor_store": run("store", pointer=outside),
        "plain_tensor_atomic": run("atomic_add", pointer=outside),
        "plain_tensor_own_rank": run("store", pointer=outside, peer=0),  # not translated: allowed
        "past_heap_end": run("get", shift=far),
        "masked_past_end_is_fine": run("load", shift=far - 11, n=8),
        "bad_peer": run("load", peer=77),
        "negative_peer": run("free_store", peer=-1),
        "lanes_bad_peer": run("translate_lanes", peer=77),
        "lanes_past_heap_end": run("translate_lanes", shift=far),
        "first_bad_offset": 1024 + far * 4,
    }


SECTIONS = {"errors": section_errors, "unsupported": section_unsupported, "fp16_cas": section_fp16_cas,
            "debug": section_debug, "off_heap": section_off_heap}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="errors,unsupported,fp16_cas,off_heap")
    args = parser.parse_args()
    heap = FakeHeap()
    print(json.dumps({name: SECTIONS[name](heap) for name in args.only.split(",")}))


if __name__ == "__main__":
    main()
