"""Which host calls of one process wait for another process's kernel when both share a GPU.

A collective's kernel on one rank spins until its peers' kernels arrive. If a peer, before it
launches its part, makes a host call that waits for *every* kernel on the GPU (not only its own),
the two wait for each other forever: a deadlock with no kernel at fault. This probe measures,
for each candidate call, how long it blocks while a kernel of another process keeps spinning.

    mpirun -n 2 python -m mpi4py benchmarks/mps_host_blocking.py [--spin 2.0] [--out benchmarks/results]

Rank 1 launches a kernel that spins for ``--spin`` seconds (it waits for nobody, so it always
ends), of 1 program, one per SM, or enough to fill the GPU (``--spinner-programs``); rank 0 then
times one host call, or a host call followed by its next GPU work. A call that returns in
milliseconds does not wait for the other process; one that takes about the spin time does. Run it
under MPS (several ranks on one GPU, as ``tools/gpu-bench.sh`` does) and without. Writes
``mps_host_blocking[_nomps].{json,md}`` and, where matplotlib is installed, a ``.png``
(``--plot results.json`` draws it later from the JSON, on any machine).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch
import triton
import triton.language as tl

import iris.runtime  # noqa: F401  (chooses the backend before the kernels below are defined)
from iris.collectives._sync import load_acquire_sys
from iris.device import device_clock_ns


@triton.jit
def spin_kernel(flag, nanoseconds):
    """Spins for ``nanoseconds`` of the GPU's global timer, then writes 1 to ``flag``."""
    start = device_clock_ns()
    now = start
    while now - start < nanoseconds:
        now = device_clock_ns()
    tl.store(flag, 1)


@triton.jit
def spin_polling_kernel(flag, nanoseconds):
    """Spins like ``spin_kernel``, polling ``flag[1]`` (never set) with system-scope acquire loads
    in every thread between two reads of the timer, as a collective's wait does."""
    start = device_clock_ns()
    now = start
    seen = load_acquire_sys(flag + 1)
    while (now - start < nanoseconds) & (seen == 0):
        seen = load_acquire_sys(flag + 1)
        now = device_clock_ns()
    tl.store(flag, 1 + seen)


@triton.jit
def add_one(x, K: tl.constexpr = 1):
    tl.store(x, tl.load(x) + K)


def probes(device):
    """Named host calls, each a function that makes the call once on ``device``."""
    from cuda.bindings import runtime as cudart

    def cuda_malloc_free():
        err, ptr = cudart.cudaMalloc(64 << 20)
        assert err == cudart.cudaError_t.cudaSuccess, err
        (err,) = cudart.cudaFree(ptr)
        assert err == cudart.cudaError_t.cudaSuccess, err

    def cuda_malloc():
        err, ptr = cudart.cudaMalloc(64 << 20)
        assert err == cudart.cudaError_t.cudaSuccess, err
        state["ptr"] = ptr

    def cuda_free():
        (err,) = cudart.cudaFree(state.pop("ptr"))
        assert err == cudart.cudaError_t.cudaSuccess, err

    def empty_cache_with_cached_block():
        block = torch.empty(64 << 20, dtype=torch.uint8, device=device)
        del block  # back to torch's cache: empty_cache hands it to cudaFree
        torch.cuda.empty_cache()

    # compiled here, loaded (cuModuleLoadData) at its first launch, which the probe times
    unloaded = torch.zeros(16, device=device)
    add_one.warmup(unloaded, K=7, grid=(1,))

    def new_kernel_first_launch():
        add_one[(1,)](unloaded, K=7)

    def graph_capture():
        x = torch.zeros(16, device=device)
        add_one[(1,)](x)
        torch.cuda.synchronize(device)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):  # enters with synchronize() and empty_cache()
            add_one[(1,)](x)
        state["graph"] = graph

    def graph_replay_and_sync():
        state["graph"].replay()
        torch.cuda.synchronize(device)

    def own_synchronize():
        torch.cuda.synchronize(device)

    def then_kernel(first):
        """``first``, then this process's next GPU work: a one-program kernel, waited for."""

        def call():
            first()
            add_one[(1,)](unloaded)
            torch.cuda.synchronize(device)

        return call

    def cuda_malloc_new():
        err, ptr = cudart.cudaMalloc(64 << 20)
        assert err == cudart.cudaError_t.cudaSuccess, err
        state["ptr"] = ptr

    earlier = torch.zeros(16, device=device)
    add_one[(1,)](earlier)
    earlier_graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(earlier_graph):  # captured (and uploaded) while the GPU is idle
        add_one[(1,)](earlier)
    torch.cuda.synchronize(device)

    def replay_earlier_graph():
        earlier_graph.replay()
        torch.cuda.synchronize(device)

    def item_copy():
        torch.ones(1, device=device).item()

    def pinned_alloc():
        torch.empty(1 << 20, dtype=torch.uint8, pin_memory=True)

    state: dict = {}
    return [
        ("torch.cuda.synchronize() (own work only)", own_synchronize),
        ("tensor.item() (copy to host)", item_copy),
        ("cudaMalloc 64 MiB", cuda_malloc),
        ("cudaFree 64 MiB", cuda_free),
        ("cudaMalloc + cudaFree", cuda_malloc_free),
        ("torch.cuda.empty_cache() with a cached block", empty_cache_with_cached_block),
        ("Triton: first launch of a compiled kernel (module load)", new_kernel_first_launch),
        ("torch.cuda.graph() capture", graph_capture),
        ("CUDA graph replay + own sync", graph_replay_and_sync),
        ("pinned host allocation (1 MiB)", pinned_alloc),
        # The calls above return at once; does the work this process enqueues next wait?
        ("a kernel + own sync (nothing before it)", then_kernel(lambda: None)),
        ("cudaMalloc 64 MiB, then a kernel + own sync", then_kernel(cuda_malloc_new)),
        ("cudaFree 64 MiB, then a kernel + own sync", then_kernel(cuda_free)),
        ("empty_cache() with a cached block, then a kernel + own sync", then_kernel(empty_cache_with_cached_block)),
        ("torch.cuda.graph() capture, then its replay + own sync",
         then_kernel(lambda: (graph_capture(), state["graph"].replay()))),
        ("replay of a graph captured before the spin + own sync", replay_earlier_graph),
    ]


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--spin", type=float, default=2.0, help="seconds the other process's kernel spins")
    p.add_argument("--spinner-programs", type=lambda s: [int(x) for x in s.split(",")], default=[1, 132, 2112],
                   help="programs of the spinning kernel (4 warps each), comma-separated: 1 leaves the GPU almost "
                        "idle, one per SM puts a block on every SM, 16 per SM fills an H200")
    p.add_argument("--poll", action="store_true",
                   help="the spinning kernel polls a flag with ld.acquire.sys (as a collective's wait does) "
                        "instead of only reading the timer; results get the suffix _poll")
    p.add_argument("--only", default=None, help="comma-separated substrings: run only the host calls that match")
    p.add_argument("--out", default="benchmarks/results", help="folder for the results files")
    p.add_argument("--plot", metavar="JSON", help="only draw the plot of a results file written earlier")
    args = p.parse_args(argv)
    if args.plot:
        with open(args.plot) as f:
            plot(json.load(f), args.plot.removesuffix(".json") + ".png")
        return

    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    if comm.size != 2:
        sys.exit(f"mps_host_blocking.py: run with 2 ranks (mpirun -n 2 ...), not {comm.size}")
    if not torch.cuda.is_available():
        sys.exit("mps_host_blocking.py: needs a CUDA GPU (it measures how processes share one)")
    device = torch.device("cuda", 0)  # both on the same GPU: that is what is measured
    torch.cuda.set_device(device)
    flag = torch.zeros(2, dtype=torch.int32, device=device)
    spin_ns = int(args.spin * 1e9)
    spinner = spin_polling_kernel if args.poll else spin_kernel
    spinner[(1,)](flag, 1000)  # compiled and loaded before anything is timed
    torch.cuda.synchronize(device)
    rows = []
    for programs in args.spinner_programs:
        for name, call in probes(device):
            if args.only and not any(part in name for part in args.only.split(",")):
                continue
            comm.Barrier()
            if comm.rank == 1:
                flag.zero_()
                spinner[(programs,)](flag, spin_ns)
                time.sleep(0.05)  # the kernel is on the GPU before the other process starts its call
                comm.send(True, dest=0)
                torch.cuda.synchronize(device)
                comm.send(True, dest=0)
            else:
                comm.recv(source=1)
                t0 = time.perf_counter()
                call()
                seconds = time.perf_counter() - t0
                comm.recv(source=1)  # the spin is over (the rows are only written after it)
                rows.append({"call": name, "spinner_programs": programs, "seconds": seconds,
                             "waited_for_other_process": seconds > 0.5 * args.spin})
            comm.Barrier()
    if comm.rank != 0:
        return
    mps = _mps_active()
    result = {"device": torch.cuda.get_device_name(device), "mps": mps, "spin_seconds": args.spin, "poll": args.poll,
              "torch": torch.__version__, "triton": triton.__version__, "rows": rows}
    stem = os.path.join(args.out, "mps_host_blocking" + ("" if mps else "_nomps") + ("_poll" if args.poll else ""))
    os.makedirs(args.out, exist_ok=True)
    sizes = args.spinner_programs
    lines = [f"# Seconds a host call of one process takes while another's kernel spins {args.spin:.1f} s "
             f"({result['device']}, {'MPS' if mps else 'no MPS'}"
             f"{', the spinner polls with ld.acquire.sys' if args.poll else ''}); '(waits)': it waited for that kernel",
             "",
             "| host call | " + " | ".join(f"spinner of {n} programs" for n in sizes) + " |",
             "| --- |" + " --- |" * len(sizes)]
    for name in dict.fromkeys(r["call"] for r in rows):
        cells = [next(r for r in rows if r["call"] == name and r["spinner_programs"] == n) for n in sizes]
        lines.append(f"| {name} | " + " | ".join(f"{c['seconds']:.3f}" + (" (waits)" if c["waited_for_other_process"]
                                                                          else "") for c in cells) + " |")
    text = "\n".join(lines) + "\n"
    print(text)
    with open(stem + ".json", "w") as f:
        json.dump(result, f, indent=1)
    with open(stem + ".md", "w") as f:
        f.write(text)
    plot(result, stem + ".png")


def _mps_active() -> bool:
    """An MPS control daemon listens in the pipe directory this process would use."""
    pipes = os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps")
    return os.path.exists(os.path.join(pipes, "control"))


def plot(result: dict, path: str) -> None:
    """A bar per host call (seconds blocked); skipped with a line where matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"matplotlib not installed: no {path} (draw it later from the .json)")
        return
    rows = result["rows"]
    fig, ax = plt.subplots(figsize=(9, 0.3 * len(rows) + 1.2))
    ax.barh([f"{r['call']} [{r['spinner_programs']}]" for r in rows], [r["seconds"] for r in rows],
            color=["tab:red" if r["waited_for_other_process"] else "tab:blue" for r in rows])
    ax.axvline(result["spin_seconds"], color="grey", ls="--", lw=1)
    ax.invert_yaxis()
    ax.set_xlabel(f"seconds blocked while another process's kernel spins {result['spin_seconds']:.1f} s")
    ax.set_title(f"{result['device']}, {'MPS' if result['mps'] else 'no MPS'}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
