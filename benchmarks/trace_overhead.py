"""What device tracing costs: one copy kernel through ``ctx.load``/``ctx.store``, three builds.

    python benchmarks/trace_overhead.py                    # GPU: 256 MiB float32 copy, 1 rank
    mpirun -n 2 python -m mpi4py benchmarks/trace_overhead.py   # each rank copies into the next one's heap
    python benchmarks/trace_overhead.py --quick            # CPU smoke test (Triton's interpreter, tiny)

Variants of the same kernel (each program copies one BLOCK: a load from this rank, a store to
the next rank):

- ``off``: ``tracing=False``, i.e. compiled out. Its PTX is compared with a twin kernel that never
  mentions tracing: they must be identical (modulo the kernel name), so "off" costs nothing;
- ``idle``: ``tracing=True`` but the host has tracing disabled (a few loads and a branch per
  event, no slot claimed);
- ``on``: ``tracing=True`` and enabled: 2 events per program (load, store), each one a slot claim
  (atomic), a record store and two clock reads.

Prints the median time of each, its bandwidth and the slowdown against ``off``; with ``--out``
also writes a Markdown table. The PTX comparison runs in a child process with Triton's
interpreter off (it needs no GPU).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys

PTX_ONLY = "--ptx-only" in sys.argv
if not PTX_ONLY:
    import iris.runtime  # first: picks the backend and switches Triton's interpreter on for cpu

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from iris.device import DeviceContext  # noqa: E402

EVENTS_PER_PROGRAM = 2


@triton.jit
def copy_kernel(context, src, dst, n, rank: tl.constexpr, world_size: tl.constexpr, BLOCK: tl.constexpr,
                TRACE: tl.constexpr):
    """dst (at the next rank) = src (here), one BLOCK per program, through the device context."""
    ctx = DeviceContext.initialize(context, rank, world_size, tracing=TRACE)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    values = ctx.load(src + offs, from_rank=rank, mask=mask)
    ctx.store(dst + offs, values, to_rank=(rank + 1) % world_size, mask=mask)


@triton.jit
def copy_kernel_untraced(context, src, dst, n, rank: tl.constexpr, world_size: tl.constexpr, BLOCK: tl.constexpr,
                         TRACE: tl.constexpr):
    """The same copy written without any mention of tracing (the PTX reference)."""
    ctx = DeviceContext.initialize(context, rank, world_size)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    values = ctx.load(src + offs, from_rank=rank, mask=mask)
    ctx.store(dst + offs, values, to_rank=(rank + 1) % world_size, mask=mask)


def ptx_report(block: int) -> int:
    """Child-process mode: compile both kernels for sm_90 and compare (prints one line)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    def ptx(kernel, trace):
        signature = {"context": "*i64", "src": "*fp32", "dst": "*fp32", "n": "i32", "rank": "constexpr",
                     "world_size": "constexpr", "BLOCK": "constexpr", "TRACE": "constexpr"}
        source = ASTSource(fn=kernel, signature=signature,
                           constexprs={"rank": 0, "world_size": 2, "BLOCK": block, "TRACE": trace},
                           attrs={(i,): [["tt.divisibility", 16]] for i in range(3)})
        text = triton.compile(source, target=GPUTarget("cuda", 90, 32)).asm["ptx"]
        text = text.split("\n\t.section\t.debug", 1)[0]
        lines = [line.rstrip() for line in text.splitlines()
                 if not line.strip().startswith((".loc", ".file", "//"))
                 and not re.fullmatch(r"\$L__(tmp|func_begin|func_end)\d+:", line.strip())]
        return re.sub(rf"\b{kernel.__name__}(?=\b|_param)", "KERNEL", "\n".join(lines))

    off, plain, on = ptx(copy_kernel, False), ptx(copy_kernel_untraced, False), ptx(copy_kernel, True)
    same = off == plain
    print(f"PTX sm_90: tracing=False {'==' if same else '!='} untraced kernel ({len(off)} vs {len(plain)} chars); "
          f"tracing=True: {len(on)} chars, {on.count('%globaltimer')} clock reads, "
          f"{len(re.findall(r'atom[.]global[.]gpu[.]relaxed[.]add[.]u64', on))} slot claims")
    return 0 if same else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes, few repetitions (CPU smoke test)")
    parser.add_argument("--mib", type=int, default=256, help="MiB copied per launch")
    parser.add_argument("--block", type=int, default=4096, help="elements per program")
    parser.add_argument("--reps", type=int, default=50, help="timed launches per variant")
    parser.add_argument("--out", default=None, help="write a Markdown table here (rank 0)")
    parser.add_argument("--ptx-only", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.ptx_only:
        return ptx_report(args.block)

    import torch

    if args.quick:
        args.mib, args.block, args.reps = 0, 64, 2
    n = max(args.mib << 18, 4 * args.block)  # float32 elements
    with iris.runtime.iris(heap_size=2 * n * 4 + (64 << 20)) as ctx:
        rank, world = ctx.rank, ctx.world_size
        src = ctx.zeros(n, dtype=torch.float32)
        src.copy_(torch.arange(n, dtype=torch.float32, device=ctx.device) + rank)
        dst = ctx.zeros(n, dtype=torch.float32)
        grid = (triton.cdiv(n, args.block),)
        events = grid[0] * EVENTS_PER_PROGRAM
        context = ctx.get_device_context()
        on_gpu = ctx.device.type == "cuda"

        def run(trace: bool) -> float:
            """One launch; seconds it took (CUDA events on a GPU, wall clock on the CPU)."""
            if trace:
                ctx.tracing.reset()  # a fresh buffer each time, so every event is written (not timed)
            if on_gpu:
                begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                begin.record()
                copy_kernel[grid](context, src, dst, n, rank, world, args.block, trace)
                end.record()
                end.synchronize()
                return begin.elapsed_time(end) / 1e3
            import time

            start = time.perf_counter()
            copy_kernel[grid](context, src, dst, n, rank, world, args.block, trace)
            return time.perf_counter() - start

        def measure(name: str, trace: bool, enabled: bool) -> float:
            if enabled:
                ctx.tracing.enable(max_events=events)
            elif ctx.tracing.buffer is not None:
                ctx.tracing.disable()
            run(trace)  # warm-up / compile
            ctx.barrier()
            times = sorted(run(trace) for _ in range(args.reps))
            ctx.barrier()
            return times[len(times) // 2]

        results = {
            "off": measure("off", trace=False, enabled=True),
            "idle": measure("idle", trace=True, enabled=False),
            "on": measure("on", trace=True, enabled=True),
        }
        recorded, dropped = ctx.tracing.recorded()
        assert recorded.shape[0] == events and dropped == 0, (recorded.shape, dropped)
        prev = (rank - 1) % world
        assert torch.equal(dst, torch.arange(n, dtype=torch.float32, device=ctx.device) + prev), "copy is wrong"
        all_results = ctx.comm.gather(results, root=0)

        if rank == 0:
            # Compiled mode, explicitly: without a GPU, iris.device would otherwise pick the interpreter.
            env = {k: v for k, v in os.environ.items() if k != "IRIS_BACKEND"}
            env["TRITON_INTERPRET"] = "0"
            env["IRIS_DEBUG"] = "0"
            child = subprocess.run([sys.executable, os.path.abspath(__file__), "--ptx-only", "--block",
                                    str(args.block)], capture_output=True, text=True, env=env, timeout=600)
            ptx_line = child.stdout.strip() or f"PTX check failed: {child.stderr.strip()[-2000:]}"
            nbytes = 2 * n * 4  # read + write
            base = sorted(r["off"] for r in all_results)[world // 2]
            lines = [f"trace_overhead: {world} rank(s), backend {ctx.backend}, {n * 4 / 2**20:.3g} MiB per launch, "
                     f"BLOCK {args.block}, {grid[0]} programs, {EVENTS_PER_PROGRAM} events per program "
                     f"({events} per launch), median of {args.reps}",
                     "",
                     "| variant | time (us) | GB/s (read+write) | slowdown vs off |",
                     "| --- | ---: | ---: | ---: |"]
            for name in ("off", "idle", "on"):
                t = sorted(r[name] for r in all_results)[world // 2]  # median over ranks
                lines.append(f"| {name} | {t * 1e6:.1f} | {nbytes / t / 1e9:.1f} | {100 * (t / base - 1):+.1f}% |")
            lines += ["", ptx_line]
            text = "\n".join(lines)
            print(text)
            if args.out:
                with open(args.out, "w") as f:
                    f.write(text + "\n")
            ok = child.returncode == 0
        else:
            ok = True
        ok = ctx.broadcast(ok if rank == 0 else None)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
