"""Compile every kernel of iris.collectives.ccl, and of the op built on the same host path
(``ops.all_reduce_residual_rmsnorm``), for an H200 (sm_90) without a GPU; report what the PTX shows.

Run with ``TRITON_INTERPRET`` unset and ``IRIS_BACKEND=cuda`` (``test_ccl_compile.py`` does it).
Per kernel, variant, op and dtype: whether it compiled, the error if not, and counts the test
judges: system-scope acquire loads and release operations of the flags, vector loads
(``ld.global.v4`` / ``.v2``) of the data, and the fp8 conversions (``cvt.rn.satfinite`` to e4m3,
which the interpreter cannot check); and per kernel, how it takes the rank (:func:`rank_parameters`).
Prints one JSON object as its last line.
"""

from __future__ import annotations

import json
import os
import re
import sys
import traceback
from concurrent.futures import ProcessPoolExecutor

assert not os.environ.get("TRITON_INTERPRET"), "run with TRITON_INTERPRET unset"
os.environ.setdefault("IRIS_BACKEND", "cuda")

import triton  # noqa: E402

from iris.collectives.ccl import _exchange_kernels as X  # noqa: E402
from iris.collectives.ccl import _kernels as K  # noqa: E402
from iris.collectives.ccl import _p2p_kernels as P  # noqa: E402
from iris.collectives.ccl._exchange import COMBINE_OPTIONS  # noqa: E402
from iris.collectives.moe import _routing as ROUTING  # noqa: E402
from iris.collectives.ops import _all_reduce_rmsnorm as NORM  # noqa: E402
from iris.device.testing import compile_ptx  # noqa: E402

PTR = {"fp32": "*fp32", "fp16": "*fp16", "bf16": "*bf16", "int32": "*i32", "int64": "*i64", "fp8": "*fp8e4nv"}
TILE = dict(BLOCK_M=4, BLOCK_N=1024)
OPS = {"sum": 0, "avg": 1, "max": 2, "min": 3, "prod": 4}


def sig(names: str, dt: str, ints: str) -> dict:
    s = {"context": "*i64"}
    s.update({n: "*i32" if n in ("locks", "flags") else "*i64" if n.endswith("bases") else PTR[dt]
              for n in names.split()})
    s.update({n: "i32" for n in ints.split()})
    return s


def cases():
    """(name, kernel, signature, constexprs, aligned args). Sizes are marked 16-divisible, as Triton
    specialises them for the usual message sizes: the data's loads and stores are then vectors."""
    for dt, op in (("fp32", "sum"), ("bf16", "sum"), ("bf16", "avg"), ("fp16", "max"), ("int32", "min"),
                   ("int64", "prod")):
        for variant, two_shot, buffered in (("one_shot", False, False), ("two_shot", True, False),
                                            ("one_shot_buffered", False, True)):
            for stage, copy in ((True, two_shot),) if buffered else ((False, False), (True, two_shot)):
                yield (f"all_reduce/{variant}/{dt}/{op}/stage{int(stage)}", K.all_reduce_kernel,
                       sig("inp src dst out locks src_bases dst_bases", dt, "n chunk half call_fp rank"),
                       dict(world_size=2, OP=OPS[op], TWO_SHOT=two_shot, STAGE_IN=stage, COPY_OUT=copy,
                            BUFFERED=buffered, **TILE),
                       ("inp", "src", "dst", "out", "src_bases", "dst_bases", "n", "chunk", "half"))
    for dt in ("fp32", "bf16"):
        for variant, buffered in (("pull", False), ("pull_buffered", True)):
            yield (f"reduce_scatter/{variant}/{dt}", K.reduce_scatter_kernel,
                   sig("inp src out locks src_bases", dt, "m src_stride chunk half call_fp rank"),
                   dict(world_size=4, OP=0, STAGE_IN=True, BUFFERED=buffered, **TILE),
                   ("inp", "src", "out", "src_bases", "m", "src_stride", "chunk", "half"))
            for mode, name in ((0, "all_gather"), (1, "all_to_all"), (2, "broadcast")):
                yield (f"{name}/{variant}/{dt}", K.pull_kernel,
                       sig("inp src out locks src_bases", dt, "m src_stride chunk half call_fp rank root"),
                       dict(world_size=4, MODE=mode, STAGE_IN=True, BUFFERED=buffered, **TILE),
                       ("inp", "src", "out", "src_bases", "m", "src_stride", "chunk", "half"))
            for mode, name in ((3, "gather"), (4, "scatter")):
                if variant == "pull":
                    yield (f"{name}/{variant}/{dt}", K.pull_kernel,
                           sig("inp src out locks src_bases", dt, "m src_stride chunk half call_fp rank root"),
                           dict(world_size=4, MODE=mode, STAGE_IN=True, BUFFERED=False, **TILE),
                           ("inp", "src", "out", "src_bases", "m", "src_stride", "chunk", "half"))
    for dt, op in (("fp32", "sum"), ("bf16", "avg"), ("int64", "prod")):
        for stage in (False, True):
            yield (f"reduce/one_shot/{dt}/{op}/stage{int(stage)}", K.reduce_kernel,
                   sig("inp src out locks src_bases", dt, "n chunk call_fp rank root"),
                   dict(world_size=4, OP=OPS[op], STAGE_IN=stage, **TILE),
                   ("inp", "src", "out", "src_bases", "n", "chunk"))
    for dt in ("fp32", "bf16", "int64"):
        block = 4096 if dt == "bf16" else 2048
        for name, kernel, data, counted in (("send", P.send_kernel, "inp", "sent"),
                                            ("recv", P.recv_kernel, "out", "received")):
            signature = {"context": "*i64", data: PTR[dt], "inbox": PTR[dt], "headers": "*i64", "ready": "*i32",
                         "credit": "*i32", counted: "*i32"}
            if name == "recv":
                signature.update(requests="*i64", posted="*i32")
            signature.update(n="i32", header="i64")
            signature.update({k: "i32" for k in ("chunk", "slots", "programs", "first", "stop", "peer", "tag", "rank")})
            yield (f"{name}/{dt}", kernel, signature, dict(BLOCK=block), (data, "inbox", "n", "chunk"))
        # large messages: the rendezvous, then a push, a pull or the chunks (one kernel per side)
        for name, kernel, data, counted in (("send_large", P.send_large_kernel, "inp", "sent"),
                                            ("recv_large", P.recv_large_kernel, "out", "received")):
            signature = {"context": "*i64", data: PTR[dt], "inbox": PTR[dt], "headers": "*i64", "ready": "*i32",
                         "credit": "*i32", counted: "*i32", "requests": "*i64", "posted": "*i32", "mode": "*i32",
                         "n": "i32", "header": "i64", "units": "i32"}
            signature.update({k: "i32" for k in ("chunk", "slots", "programs", "first", "stop")})
            if name == "recv_large":
                signature["post"] = "i32"
            signature["src_offset" if name == "send_large" else "dst_offset"] = "i64"
            signature.update({k: "i32" for k in ("peer", "tag", "rank")})
            yield (f"{name}/{dt}", kernel, signature, dict(BLOCK=block), (data, "inbox", "n", "chunk"))
        # a large message's single copy (a push or a pull) and the signal after it
        for send in (True, False):
            side = "send" if send else "recv"
            signature = {"context": "*i64", "t": PTR[dt], "inbox": PTR[dt], "headers": "*i64", "requests": "*i64",
                         "counted": "*i32", "mode": "*i32", "registered": "*i64", "n": "i32", "slots": "i32",
                         "programs": "i32", "stop": "i32", "inbox_offset": "i64", "table_ranks": "i32", "peer": "i32",
                         "rank": "i32"}
            yield (f"direct_copy/{side}/{dt}", P.direct_copy_kernel, signature,
                   dict(SEND=send, DIRECT_BLOCK=block), ("t", "inbox", "n"))
            signature = {"context": "*i64", "ready": "*i32", "credit": "*i32", "counted": "*i32", "mode": "*i32",
                         "units": "i32", "first": "i32", "stop": "i32", "peer": "i32", "tag": "i32", "rank": "i32"}
            yield (f"direct_done/{side}/{dt}", P.direct_done_kernel, signature, dict(SEND=send), ())
    yield ("barrier", K.barrier_kernel, sig("flags", "fp32", "call_fp rank"), dict(world_size=2), ())
    yield from norm_cases()
    yield from exchange_cases()


def exchange_cases():
    """ccl.all_to_all_v and the MoE dispatch and combine (DeepSeek-V3-like: 8 ranks, 32 local experts,
    top-8, rows of 7168): the publish, pull and combine kernels, and the routing kernel. The combine
    is compiled as it is launched, without fused multiply-adds."""
    big = dict(world_size=8, GROUPS=32, ROW=7168, BLOCK_R=2, BLOCK=8192)
    small = dict(world_size=4, GROUPS=1, ROW=16, BLOCK_R=64, BLOCK=16)
    for name, dt, cx, routed, split in (("moe_dispatch", "bf16", big, True, "*i32"),
                                        ("moe_combine", "bf16", big, False, "*i32"),
                                        ("all_to_all_v", "fp32", small, False, "*i64")):
        signature = {"context": "*i64", "src": PTR[dt], "stage": PTR[dt], "n_rows": "i32", "counts": split,
                     "offsets": split, "peer_stride": "i32", "group_stride": "i32", "table": "*i32"}
        extra = {}
        if routed:
            signature.update(route="*i32", route_stage="*i32", weights="*fp32", weight_stage="*fp32")
        else:
            extra = dict.fromkeys(("route", "route_stage", "weights", "weight_stage"))
        signature.update(n_flat="i32", locks="*i32", programs="i32", rank="i32")
        stage = X.STAGE_ROWS.value if name == "moe_dispatch" else X.STAGE_SEGMENTS.value
        call = {"moe_dispatch": X.DISPATCH_CALL, "moe_combine": X.COMBINE_CALL}.get(name, X.ALL_TO_ALL_V_CALL).value
        yield (f"{name}/publish/{dt}", X.publish_kernel, {k: signature[k] for k in signature if k not in extra},
               dict(cx, STAGE=stage, PREFIX=name == "all_to_all_v", CHECK_ROWS=name == "all_to_all_v", CALL=call,
                    **extra), ("src", "stage"))
    pull = {"context": "*i64", "out": "*bf16", "stage": "*bf16", "n_src_rows": "i32", "table": "*i32",
            "route_stage": "*i32", "weight_stage": "*fp32", "row_weights": "*fp32", "recv_counts": "*i32",
            "recv_offsets": "*i32", "group_counts": "*i32", "group_offsets": "*i32", "capacity": "i32",
            "expert_capacity": "i32", "locks": "*i32", "programs": "i32", "rank": "i32"}
    for padded in (False, True):
        yield (f"moe_dispatch/pull/bf16/padded{int(padded)}", X.pull_kernel, pull,
               dict(big, TOPK=8, PADDED=padded, WRITE_LAYOUT=True, CALL=X.DISPATCH_CALL.value), ("out", "stage"))
    again = {k: v for k, v in pull.items() if k not in ("row_weights", "group_counts", "group_offsets")}
    yield ("moe_dispatch/redispatch/bf16", X.pull_kernel, again,
           dict(big, TOPK=8, PADDED=True, WRITE_LAYOUT=False, CALL=X.DISPATCH_CALL.value, row_weights=None,
                group_counts=None, group_offsets=None), ("out", "stage"))
    a2av = {k: v.replace("bf16", "fp32") for k, v in pull.items()
            if k not in ("route_stage", "weight_stage", "row_weights", "group_counts", "group_offsets")}
    a2av.update(recv_counts="*i64", recv_offsets="*i64")
    yield ("all_to_all_v/pull/fp32", X.pull_kernel, a2av,
           dict(small, TOPK=0, PADDED=False, WRITE_LAYOUT=True, CALL=X.ALL_TO_ALL_V_CALL.value, route_stage=None,
                weight_stage=None, row_weights=None, group_counts=None, group_offsets=None), ("out", "stage"))
    combine = {"context": "*i64", "out": "*bf16", "stage": "*bf16", "table": "*i32", "topk_idx": "*i64",
               "weights": "*fp32", "slots": "*i32", "send_offsets": "*i32", "scratch": "*i32", "n_tokens": "i32",
               "capacity": "i32", "expert_capacity": "i32", "locks": "*i32", "programs": "i32", "rank": "i32"}
    no_fma = COMBINE_OPTIONS  # as the combine is launched
    cx = {k: v for k, v in big.items() if k != "BLOCK_R"}
    for dt in ("bf16", "fp64"):
        sig_dt = {k: v.replace("bf16", dt) for k, v in combine.items()}
        yield (f"moe_combine/reduce/{dt}", X.combine_kernel, sig_dt,
               dict(cx, TOPK=8, REDUCE=True, PADDED=False, CALL=X.COMBINE_CALL.value), ("out", "stage"), no_fma)
    yield ("moe_combine/gather/fp32", X.combine_kernel,
           {k: v.replace("bf16", "fp32") for k, v in combine.items() if k != "weights"},
           dict(cx, TOPK=8, REDUCE=False, PADDED=True, CALL=X.COMBINE_CALL.value, weights=None), ("out", "stage"),
           no_fma)
    yield ("moe_routing", ROUTING.routing_kernel,
           {"sorted_keys": "*i64", "order": "*i64", "layout": "*i32", "n": "i32", "steps": "i32"},
           dict(NUM_EXPERTS=256, EXPERTS_P=256, BLOCK=1024), ("order", "layout"))


def norm_cases():
    """ops.all_reduce_residual_rmsnorm's kernel: every strategy in bf16, staged or read in place (and
    two-shot's outputs through heap buffers or in place), fp32 and fp16 once, and fp8 with row
    scales (two-shot, 3 ranks: ragged shares) and with a per-tensor scale (buffered)."""
    names = "partial src residual weight out out_dst res_out res_dst scale scale_dst locks"
    for dt, out, variant, world, stage, copy, quant in (
            ("bf16", "bf16", "one_shot", 4, False, False, 0), ("bf16", "bf16", "one_shot", 4, True, False, 0),
            ("bf16", "bf16", "one_shot_buffered", 4, True, False, 0), ("bf16", "bf16", "two_shot", 4, True, True, 0),
            ("bf16", "bf16", "two_shot", 4, False, False, 0), ("fp32", "fp32", "one_shot", 2, True, False, 0),
            ("fp16", "fp16", "two_shot", 2, True, True, 0), ("bf16", "fp8", "two_shot", 3, True, True, 1),
            ("bf16", "fp8", "one_shot_buffered", 2, True, False, 2)):
        signature = {"context": "*i64"}
        signature.update({n: "*i32" if n == "locks" else "*fp32" if n.startswith("scale") or n == "weight"
                          else PTR[out] if n.startswith("out") else PTR[dt] for n in names.split()})
        signature.update({n: "*i64" for n in ("src_bases", "out_bases", "res_bases", "scale_bases")})
        signature.update(M="i32", N="i32", eps="fp32", half="i32", call_fp="i32", rank="i32")
        two_shot = variant == "two_shot"
        yield (f"all_reduce_rmsnorm/{variant}/{dt}/{out}/stage{int(stage)}copy{int(copy)}/{world}ranks",
               NORM._all_reduce_rmsnorm_kernel, signature,
               dict(world_size=world, TWO_SHOT=two_shot, BUFFERED=variant == "one_shot_buffered",
                    STAGE_IN=stage, COPY_OUT=copy, HAS_RESIDUAL=True, WRITE_RESIDUAL=True, QUANT=quant,
                    BLOCK_M=4 if two_shot else 1, BLOCK_N=4096),
               ("partial", "src", "residual", "weight", "out", "out_dst", "res_out", "res_dst", "N", "half"))


def _peeks_before_its_reads(ptx: str) -> bool:
    # The call check's load of the peers' fingerprints (the one volatile 64-bit load) comes before
    # the kernel's last vector load of data: it overlaps the reads of the peers' data instead of
    # following them (iris.device._calls.call_peek).
    peek = ptx.find("ld.volatile.global.b64")
    vectors = [m.start() for m in re.finditer(r"ld\.global(?:\.\w+)*\.v[24]", ptx)]
    return peek >= 0 and bool(vectors) and peek < vectors[-1]


def counts(ptx: str) -> dict:
    return {
        # the call check counts a rank's calls with a plain load and store: no atomic, whose result
        # Triton shares through a CTA barrier that would wait for its round trip on entry
        "counter_atomics": len(re.findall(r"atom\.global\.gpu\.relaxed\.add\.u64", ptx)),
        "peeks_before_its_reads": _peeks_before_its_reads(ptx),
        "acquire_sys_loads": len(re.findall(r"ld\.acquire\.sys", ptx)),
        "release_sys": len(re.findall(r"\.release\.sys|fence\.acq_rel\.sys", ptx)),
        "vector_loads": len(re.findall(r"ld\.global(?:\.\w+)*\.v[24]", ptx)),
        "bar_sync": len(re.findall(r"bar\.sync|barrier\.sync", ptx)),
        "fp8_conversions": len(re.findall(r"cvt\.rn\.satfinite\.e4m3x2\.f32", ptx)),
        "fma": len(re.findall(r"\bfma\.rn\.f(?:32|64)", ptx)),
    }


def run_case(index: int) -> tuple[str, dict]:
    """Compile case ``index`` of :func:`cases` (in a worker process: the cases hold kernels, which do
    not pickle, so each worker builds the list and takes its own)."""
    name, fn, signature, constexprs, aligned, *options = list(cases())[index]
    try:
        ptx = compile_ptx(fn, signature, constexprs, aligned, options={"num_warps": 4, **(options or [{}])[0]})
        return name, dict(ok=True, **counts(ptx))
    except Exception as exc:  # reported to the test
        return name, dict(ok=False, error=f"{type(exc).__name__}: {exc}"[:2000], trace=traceback.format_exc()[-4000:])


def rank_parameters(modules=(K, P, X)) -> dict:
    """Per kernel of ``modules`` (default ccl's three kernel modules; ``module.name``, kernels defined
    there, not imported): whether its ``rank`` parameter is a compile-time constant and whether
    Triton specialises on its value (ints equal to 1 or divisible by 16 get kernels of their own
    unless ``do_not_specialize`` names them). A rank that is neither gives every rank of a job the
    same compiled kernel."""
    out = {}
    for module in modules:
        for name, fn in vars(module).items():
            if (isinstance(fn, triton.runtime.jit.JITFunction) and name.endswith("_kernel")
                    and fn.fn.__module__ == module.__name__):
                for param in fn.params:
                    if param.name == "rank":
                        out[f"{module.__name__.rsplit('.', 1)[1]}.{name}"] = dict(
                            constexpr=bool(param.is_constexpr), specialised=not param.do_not_specialize)
    return out


def main() -> int:
    # one compile per core: each is one process's work for seconds (LLVM and ptxas)
    with ProcessPoolExecutor(max(1, min(4, os.cpu_count() or 1))) as pool:
        results = dict(pool.map(run_case, range(len(list(cases())))))
    print(json.dumps({"triton": triton.__version__, "results": results, "rank_parameters": rank_parameters()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
