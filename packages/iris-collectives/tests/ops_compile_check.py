"""Compile every fused op's kernel for an H200 (sm_90) without a GPU; report what the PTX shows.

Run with ``TRITON_INTERPRET`` unset and ``IRIS_BACKEND=cuda`` (``test_ops_compile.py`` does it).
Per kernel, dtype (bf16, fp32, and fp64 on the pointer path only) and load path (tensor descriptors
or pointers): whether it compiled, the error if not, and counts the test judges: TMA loads
(``cp.async.bulk.tensor``), tensor-core MMAs (``wgmma`` / ``mma``), device-side descriptor creation
(``tensormap``), system-scope acquire loads and release operations of the flags; and per kernel,
how it takes the rank (:func:`rank_parameters`). Prints one JSON object as its last line.
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

from iris.collectives.ops import _all_gather_matmul as AGM  # noqa: E402
from iris.collectives.ops import _all_reduce_rmsnorm as NORM  # noqa: E402
from iris.collectives.ops import _matmul as CORE  # noqa: E402
from iris.collectives.ops import _matmul_all_gather as MAG  # noqa: E402
from iris.collectives.ops import _matmul_all_reduce as MAR  # noqa: E402
from iris.collectives.ops import _matmul_reduce_scatter as MRS  # noqa: E402
from iris.collectives.ops import _rotated as ROT  # noqa: E402
from iris.device import testing  # noqa: E402

PTR = {"fp32": "*fp32", "fp16": "*fp16", "bf16": "*bf16", "fp64": "*fp64"}
TILES = dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, GROUP_M=8)


def signature(names: str, dt: str, ints: str) -> dict:
    sig = {"context": "*i64"}
    for n in names.split():
        # the partial products are fp32, fp64 for fp64 inputs
        sig[n] = "*i32" if n in ("locks", "flags") else (PTR["fp64" if dt == "fp64" else "fp32"] if n == "partial"
                                                          else PTR[dt])
    sig.update({n: "i32" for n in ints.split()})
    sig["call_fp"] = "i32"  # the agreed call's fingerprint (iris.device._calls), after the shapes
    sig["rank"] = "i32"  # a run-time value, not specialised on: one compiled kernel for every rank
    return sig


STRIDES = "M N K stride_am stride_ak stride_bk stride_bn stride_om stride_on"


def core_cases():
    """(name, kernel, signature, constexprs, aligned args, options) of the GEMM core alone
    (``ops._matmul``), bf16 through descriptors: plain (8 warps) and warp-specialised (4 warps per
    consumer group, 3 stages and the descriptor store that ``ops._matmul.matmul`` gives it)."""
    sig = {"a": "*bf16", "b": "*bf16", "bias": "*bf16", "out": "*bf16",
           **{n: "i32" for n in STRIDES.split()}}
    for ws in (False, True):
        constexprs = dict(HAS_BIAS=False, USE_TMA=1, PRECISION="ieee", BLOCK_M=128, BLOCK_N=256, BLOCK_K=64,
                          GROUP_M=8, FLATTEN=False, TMA_STORE=ws, WARP_SPECIALIZE=ws)
        yield (f"matmul_core{'_ws' if ws else ''}/bf16/tma", CORE._matmul_kernel, sig, constexprs,
               ("a", "b", "out", "M", "N", "K", "stride_am", "stride_bk", "stride_om"),
               {"num_warps": 4 if ws else 8, "num_stages": 3 if ws else 4})


RS = "M N K M_LOCAL stride_am stride_ak stride_bk stride_bn stride_om stride_on"  # per-rank shapes


def cases():
    """(name, kernel, signature, constexprs, aligned args, options) for each op, dtype and load
    path (options None: the ops' launch options)."""
    # USE_TMA: 0 pointer loads, 1 descriptors of a row-major B, 2 of a column-major B's transpose
    # (what fp32 always takes, and bf16 for weight.t())
    paths = {"bf16": (1, 0, 2), "fp32": (2, 0), "fp64": (0,)}  # fp64 takes the pointer path
    for dt in ("bf16", "fp32", "fp64"):
        precision = "tf32" if dt == "fp32" else "ieee"
        for tma in paths[dt]:
            if (dt, tma) == ("bf16", 2):  # the column-major B of the shared core and of all_gather_matmul's own
                common = dict(world_size=2, HAS_BIAS=True, PRECISION=precision, **TILES)
                yield ("matmul_all_reduce/bf16/tma_columns", MAR._matmul_all_reduce_kernel,
                       signature("a b bias partial out locks", dt, STRIDES), dict(common, TWO_SHOT=False, USE_TMA=2),
                       ("a", "b", "out", "partial"), None)
                yield ("all_gather_matmul/bf16/tma_columns", AGM._all_gather_matmul_kernel,
                       signature("a_shard staged b bias out flags", dt, RS), dict(common, USE_TMA=2),
                       ("a_shard", "staged", "b", "out"), None)
                continue
            common = dict(world_size=2, HAS_BIAS=True, PRECISION=precision, **TILES)
            path = {0: "ptr", 1: "tma", 2: "tma_columns"}[tma]
            yield (f"matmul_all_reduce/{dt}/{path}", MAR._matmul_all_reduce_kernel,
                   signature("a b bias partial out locks", dt, STRIDES), dict(common, TWO_SHOT=False, USE_TMA=tma),
                   ("a", "b", "out", "partial"), None)
            yield (f"matmul_all_reduce_two_shot/{dt}/{path}", MAR._matmul_all_reduce_kernel,
                   signature("a b bias partial out locks", dt, STRIDES), dict(common, TWO_SHOT=True, USE_TMA=tma),
                   ("a", "b", "out", "partial"), None)
            rs = RS
            yield (f"matmul_reduce_scatter/{dt}/{path}", MRS._matmul_reduce_scatter_kernel,
                   signature("a b bias partial out locks", dt, rs), dict(common, USE_TMA=tma),
                   ("a", "b", "out", "partial"), None)
            # strategy rotated: the reduce-scatter, and with GATHER the all-reduce (bf16 descriptors
            # at four ranks, where its loops over the peers run more than once)
            for name, gather in (("matmul_reduce_scatter_rotated", False), ("matmul_all_reduce_rotated", True)):
                world = 4 if (dt, tma) == ("bf16", 1) else 2
                yield (f"{name}/{dt}/{path}", ROT.rotated_kernel,
                       signature("a b bias partial gathered out flags", dt, rs),
                       dict(common, call=name, world_size=world, RECORD=ROT.record_words(world), GATHER=gather,
                            USE_TMA=tma), ("a", "b", "out", "partial", "gathered"), None)
            if (dt, tma) == ("bf16", 1):  # Config(partial_dtype="input"): the slots in bf16
                sig = dict(signature("a b bias partial gathered out flags", dt, rs), partial=PTR[dt])
                yield (f"matmul_reduce_scatter_rotated_input/{dt}/{path}", ROT.rotated_kernel, sig,
                       dict(common, call="input", world_size=4, RECORD=ROT.record_words(4), GATHER=False,
                            USE_TMA=tma), ("a", "b", "out", "partial", "gathered"), None)
            yield (f"matmul_all_gather/{dt}/{path}", MAG._matmul_all_gather_kernel,
                   signature("a b bias staging out flags", dt, rs), dict(common, USE_TMA=tma),
                   ("a", "b", "out", "staging"), None)
            yield (f"all_gather_matmul/{dt}/{path}", AGM._all_gather_matmul_kernel,
                   signature("a_shard staged b bias out flags", dt, rs), dict(common, USE_TMA=tma),
                   ("a_shard", "staged", "b", "out"), None)
            # bf16 through descriptors at four ranks: its loops over the peers then unroll to more
            # than one iteration (two ranks compiled what four did not: a constexpr assigned in an
            # unrolled loop). One such build is enough; each costs about twice a two-rank one.
            yield (f"all_gather_matmul_arrival/{dt}/{path}", AGM._arrival_kernel,
                   signature("a_shard staged b bias out flags", dt, rs),
                   dict(common, USE_TMA=tma, world_size=4 if (dt, tma) == ("bf16", 1) else 2),
                   ("a_shard", "staged", "b", "out"), None)
    # fp32 in full precision (torch's default fp32 matmul precision, which the ops follow): the
    # default strategy of the ops that reduce, B row-major through descriptors (no transposing copy:
    # only tf32's MMAs need B column-major). Its tl.dot must not touch the tensor cores.
    common = dict(world_size=2, HAS_BIAS=True, PRECISION="ieee", **TILES)
    yield ("matmul_all_reduce_rotated/fp32_ieee/tma", ROT.rotated_kernel,
           signature("a b bias partial gathered out flags", "fp32", RS),
           dict(common, call="matmul_all_reduce_rotated", RECORD=ROT.record_words(2), GATHER=True, USE_TMA=1),
           ("a", "b", "out", "partial", "gathered"), None)


#: What one program may hold in shared memory on an H100 or H200 (227 KiB, opted in); a launch
#: of a kernel that needs more fails with Triton's OutOfResources.
SHARED_LIMIT = 232448


def default_cases():
    """The ops' kernels with the tiles, warps and stages their table picks on the GPU for a large
    shape, in each input dtype (what a launch without ``config`` compiles; ``cases()`` fixes its
    own tiles): whether they fit in shared memory. The pointer path (ragged shards, fp64), and the
    descriptors for bf16 and fp32. Sizes are multiples of 16, as a launch specialises them."""
    from iris.collectives.ops._config import choose

    sizes = ("K", "N", "M_LOCAL", "stride_am", "stride_bk", "stride_om")
    for dt, itemsize, paths in (("bf16", 2, (0, 1)), ("fp32", 4, (0, 2)), ("fp64", 8, (0,))):
        cfg = choose("all_gather_matmul", 8192, 8192, 8192, 4, "cuda", None, itemsize)
        precision = cfg.input_precision if dt == "fp32" else "ieee"
        label = "fp32_ieee" if precision == "ieee" and dt == "fp32" else dt
        tiles = dict(BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m)
        common = dict(world_size=4, HAS_BIAS=True, PRECISION=precision, **tiles)
        options = {"num_warps": cfg.num_warps, "num_stages": cfg.num_stages}
        for tma in paths:
            path = {0: "ptr", 1: "tma", 2: "tma_columns"}[tma] + "_defaults"
            yield (f"all_gather_matmul/{label}/{path}", AGM._all_gather_matmul_kernel,
                   signature("a_shard staged b bias out flags", dt, RS), dict(common, USE_TMA=tma),
                   ("a_shard", "staged", "b", "out", *sizes), options)
            yield (f"matmul_all_reduce/{label}/{path}", MAR._matmul_all_reduce_kernel,
                   signature("a b bias partial out locks", dt, STRIDES), dict(common, TWO_SHOT=False, USE_TMA=tma),
                   ("a", "b", "out", "partial", *(n for n in sizes if n != "M_LOCAL")), options)
        yield (f"all_gather_matmul_arrival/{label}/ptr_defaults", AGM._arrival_kernel,
               signature("a_shard staged b bias out flags", dt, RS), dict(common, USE_TMA=0),
               ("a_shard", "staged", "b", "out", *sizes), options)


def counts(ptx: str) -> dict:
    return {
        "tma_loads": len(re.findall(r"cp\.async\.bulk\.tensor\.\dd\.shared", ptx)),
        "tma_stores": len(re.findall(r"cp\.async\.bulk\.tensor\.\dd\.global\.shared", ptx)),
        "tensormaps": len(re.findall(r"tensormap", ptx)),
        "wgmma": len(re.findall(r"wgmma\.mma_async", ptx)),
        "mma": len(re.findall(r"\bmma\.sync", ptx)),
        "acquire_sys_loads": len(re.findall(r"ld\.acquire\.sys", ptx)),
        "release_sys": len(re.findall(r"\.release\.sys|fence\.acq_rel\.sys", ptx)),
        "threads": int(re.search(r"\.reqntid (\d+)", ptx).group(1)),
        "setmaxnreg": len(re.findall(r"setmaxnreg", ptx)),
    }


def all_cases() -> list:
    return [*cases(), *core_cases(), *default_cases()]


def run_case(index: int) -> tuple[str, dict]:
    """Compile case ``index`` of :func:`all_cases` (in a worker process: the cases hold kernels,
    which do not pickle, so each worker builds the list and takes its own)."""
    name, fn, sig, constexprs, aligned, options = all_cases()[index]
    try:
        # options None: the GEMM's launch options of the H200 config (8 warps, 3 stages)
        kernel = testing.compile_for(fn, sig, constexprs, aligned, options or {"num_warps": 8, "num_stages": 3})
        return name, dict(ok=True, shared=kernel.metadata.shared, **counts(kernel.asm["ptx"]))
    except Exception as exc:  # reported to the test
        return name, dict(ok=False, error=f"{type(exc).__name__}: {exc}"[:2000], trace=traceback.format_exc()[-4000:])


def rank_parameters() -> dict:
    """:func:`ccl_compile_check.rank_parameters` of the fused ops' modules. The all-reduce-rmsnorm
    kernel, which ``ccl_compile_check.py`` compiles, is among them; the GEMM core has no rank."""
    import ccl_compile_check

    return ccl_compile_check.rank_parameters((MAR, MRS, ROT, MAG, AGM, NORM, CORE))


def main() -> int:
    only = set(sys.argv[1:])
    todo = [i for i, case in enumerate(all_cases()) if not only or case[0].split("/")[0] in only]
    # one compile per core: each is one process's work for seconds (LLVM and ptxas)
    with ProcessPoolExecutor(max(1, min(4, os.cpu_count() or 1))) as pool:
        results = dict(pool.map(run_case, todo))
    print(json.dumps({"triton": triton.__version__, "results": results, "rank_parameters": rank_parameters(),
                      "shared_limit": SHARED_LIMIT}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
