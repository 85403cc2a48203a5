"""Cost model for Iris beyond one node (the nvshmem backend): no GPU, no measurement, arithmetic only.

    python benchmarks/multinode_model.py [--out benchmarks/results] [--net-efficiency 0.85]
                                         [--net-step-us 7.5] [--overlap 1.1]

What would a job of several nodes take? No multi-node job has been measured yet: this script turns
what was measured on one node (2 x H200 over NVLink) and published link speeds into predictions for
jobs of 1, 2, 4 and 16 nodes of 8 GPUs, so that a first multi-node run has numbers to be checked
against. Every input is a named
constant below, marked *measured* (on 2 x H200, 2026-11-30), *published* (vendor figures) or
*assumed* (a guess, to be replaced by a measurement); every number printed is computed from them.

Model (per GPU, all GPUs of the job at once, phases one after the other, no pipelining):

- a phase inside a node moves ``bytes`` over NVLink in ``bytes / (NVLINK_GBPS * nvlink_efficiency)
  + nvlink_phase_us``; the efficiency is the 256 MiB tile all-reduce's bus bandwidth on 2 GPUs over
  the NVLink rate, the latency half the smallest measured all-reduce (a 2-GPU all-reduce is two
  phases here, a reduce-scatter and an all-gather);
- a phase across nodes runs on the GPU's own rail (one NIC per GPU) in ``bytes / (NIC_GBPS *
  net_efficiency) + steps * net_step_us``, with recursive halving/doubling (log2 N steps per
  reduce-scatter or all-gather) for a power-of-two node count and a ring (N - 1 steps) otherwise;
- all-reduce of S bytes = reduce-scatter in the node ((G-1)/G * S), all-reduce across nodes of the
  S/G shard (2(N-1)/N * S/G), all-gather in the node ((G-1)/G * S);
- tensor-parallel GEMM + collective: the GEMM takes the measured cuBLAS time per FLOP (same M, same
  op) times its FLOPs at TP degree T; unfused = GEMM + collective; fused = max(GEMM, collective) *
  overlap factor.

Writes ``multinode_model.{json,md,png}`` into ``--out`` (the plot when matplotlib is installed).
Results: docs/performance.md and docs/multinode.md.
"""

from __future__ import annotations

import argparse
import json
import math
import os

from common import NO_PLOT, pyplot

HERE = os.path.dirname(os.path.abspath(__file__))
KiB, MiB = 1 << 10, 1 << 20

# --- published (vendor figures, not measured here) -------------------------------------------------
GPUS_PER_NODE = 8  # HGX H100/H200 node: 8 GPUs, all connected through NVSwitch
NVLINK_GBPS = 450.0  # NVLink 4 on H100/H200 SXM: 18 links, 900 GB/s both ways per GPU = 450 GB/s per direction
NIC_GBPS = 50.0  # InfiniBand NDR (ConnectX-7): 400 Gb/s per port = 50 GB/s per direction; one NIC (rail) per GPU
BF16_PEAK_TFLOPS = 990.0  # H100/H200 SXM dense bf16 peak, only to show how close cuBLAS runs to it

# --- measured on 2 x H200 (NVLink, one rank per GPU), 2026-11-30 ------------------------------------
MEASURED_GPUS = 2
# Best tile all-reduce of iris.collectives (benchmarks/tile_collectives.py), fp32, bytes per rank -> us.
TILE_ALLREDUCE_US = {64 * KiB: 8.4, 1 * MiB: 7.4, 4 * MiB: 15.6, 16 * MiB: 54.6, 64 * MiB: 203.9, 256 * MiB: 790.8}
# Tensor-parallel MLP of a 70B-class model, bf16, per rank at TP 2: hidden 8192, intermediate 28672 / 2.
HIDDEN, INTERMEDIATE, BF16_BYTES = 8192, 28672, 2
# cuBLAS GEMM alone (torch.matmul) and NCCL collective alone, ms, by op and M.
MEASURED_GEMM_MS = {"AG+GEMM": {4096: 1.067, 8192: 2.445, 16384: 4.784},
                    "GEMM+RS": {4096: 1.206, 8192: 2.829, 16384: 5.654},
                    "GEMM+AR": {4096: 1.206, 8192: 2.829, 16384: 5.654}}
MEASURED_NCCL_MS = {"AG+GEMM": {4096: 0.159, 8192: 0.299, 16384: 0.587},
                    "GEMM+RS": {4096: 0.169, 8192: 0.331, 16384: 0.631},
                    "GEMM+AR": {4096: 0.253, 8192: 0.505, 16384: 0.956}}

# --- assumed (to be replaced by measurements on a multi-node job) ----------------------------------
NET_EFFICIENCY = 0.85  # fraction of the NIC rate bulk NVSHMEM puts reach (assumed, 0.8-0.9)
NET_STEP_US = 7.5  # one step across nodes: put + signal + the wait for it, IBGDA (assumed, 5-10 us)
OVERLAP_FACTOR = 1.1  # fused = max(GEMM, collective) x this: both share SMs and HBM (assumed)

# --- what to predict -------------------------------------------------------------------------------
NODES = (1, 2, 4, 16)
ALLREDUCE_BYTES = (1 * MiB, 16 * MiB, 256 * MiB)  # fp32 per GPU
TP_CASES = ((8, 1), (16, 2))  # (TP degree, nodes it spans): in one node, across two
OPS = ("AG+GEMM", "GEMM+RS", "GEMM+AR")


def nvlink_calibration() -> tuple[float, float]:
    """(efficiency, phase latency in us) of NVLink, from the measured 2-GPU tile all-reduce."""
    biggest = max(TILE_ALLREDUCE_US)
    busbw = 2 * (MEASURED_GPUS - 1) / MEASURED_GPUS * biggest / (TILE_ALLREDUCE_US[biggest] * 1e-6) / 1e9
    smallest_us = min(us for size, us in TILE_ALLREDUCE_US.items() if size <= 1 * MiB)
    return busbw / NVLINK_GBPS, smallest_us / 2


def inter_steps(nodes: int) -> int:
    """Steps of one reduce-scatter or all-gather across ``nodes`` (halving/doubling, or a ring)."""
    if nodes == 1:
        return 0
    return int(math.log2(nodes)) if nodes & (nodes - 1) == 0 else nodes - 1


class Model:
    """The link model: time of a phase inside a node and of a phase across nodes."""

    def __init__(self, net_efficiency: float, net_step_us: float):
        self.nvlink_efficiency, self.nvlink_phase_us = nvlink_calibration()
        self.net_efficiency, self.net_step_us = net_efficiency, net_step_us

    def intra_us(self, nbytes: float) -> float:
        """One phase inside the node moving ``nbytes`` out of (and into) each GPU over NVLink."""
        return nbytes / (NVLINK_GBPS * self.nvlink_efficiency * 1e3) + self.nvlink_phase_us

    def inter_us(self, nbytes: float, steps: int) -> float:
        """``steps`` network steps moving ``nbytes`` in all out of each GPU on its rail."""
        if steps == 0:
            return 0.0
        return nbytes / (NIC_GBPS * self.net_efficiency * 1e3) + steps * self.net_step_us

    def reduce_scatter(self, nbytes: float, gpus: int, nodes: int) -> tuple[float, float]:
        """(in-node us, across-nodes us) of a reduce-scatter of ``nbytes`` per GPU: first inside
        the node, then of the 1/gpus shard across the nodes, on the rails."""
        return (self.intra_us((gpus - 1) / gpus * nbytes),
                self.inter_us((nodes - 1) / nodes * nbytes / gpus, inter_steps(nodes)))

    def all_gather(self, nbytes: float, gpus: int, nodes: int) -> tuple[float, float]:
        """(in-node us, across-nodes us) of an all-gather whose result is ``nbytes`` per GPU:
        across the nodes on the rails first, then inside the node (the mirror of reduce_scatter)."""
        return self.reduce_scatter(nbytes, gpus, nodes)

    def all_reduce(self, nbytes: float, gpus: int, nodes: int) -> dict:
        """Hierarchical all-reduce of ``nbytes`` per GPU: phases in us, total and bus bandwidth."""
        rs_in, rs_net = self.reduce_scatter(nbytes, gpus, nodes)
        ag_in, ag_net = self.all_gather(nbytes, gpus, nodes)
        total = rs_in + rs_net + ag_net + ag_in
        world = gpus * nodes
        busbw = 2 * (world - 1) / world * nbytes / (total * 1e-6) / 1e9
        return {"intra_rs_us": rs_in, "inter_ar_us": rs_net + ag_net, "intra_ag_us": ag_in, "total_us": total,
                "busbw_GBps": busbw, "inter_steps": 2 * inter_steps(nodes)}

    def collective_us(self, op: str, nbytes: float, gpus: int, nodes: int) -> float:
        """The collective of a tensor-parallel op on ``nbytes`` (the full [M, hidden] tensor)."""
        if op == "GEMM+AR":
            return self.all_reduce(nbytes, gpus, nodes)["total_us"]
        return sum(self.all_gather(nbytes, gpus, nodes) if op == "AG+GEMM" else
                   self.reduce_scatter(nbytes, gpus, nodes))


def gemm_flops(m: int, tp: int) -> float:
    """FLOPs of one rank's MLP GEMM at TP degree ``tp``: [M, hidden] x [hidden, intermediate/tp]
    (AG+GEMM) or [M, intermediate/tp] x [intermediate/tp, hidden] (GEMM+RS, GEMM+AR): the same."""
    return 2.0 * m * HIDDEN * INTERMEDIATE / tp


def gemm_us(op: str, m: int, tp: int) -> float:
    """cuBLAS time of that GEMM: the measured time per FLOP at TP 2 (same op and M) x its FLOPs."""
    per_flop = MEASURED_GEMM_MS[op][m] * 1e3 / gemm_flops(m, MEASURED_GPUS)
    return per_flop * gemm_flops(m, tp)


def predict(model: Model, overlap: float) -> dict:
    """Every prediction and the calibration checks, as plain lists of dicts."""
    allreduce = [dict(nodes=n, gpus=GPUS_PER_NODE * n, bytes_per_gpu=s, **model.all_reduce(s, GPUS_PER_NODE, n))
                 for n in NODES for s in ALLREDUCE_BYTES]
    calibration = [{"what": f"tile all-reduce {size(s)}", "measured_us": us,
                    "model_us": model.all_reduce(s, MEASURED_GPUS, 1)["total_us"]}
                   for s, us in TILE_ALLREDUCE_US.items()]
    fused = []
    for op in OPS:
        for m in MEASURED_GEMM_MS[op]:
            nbytes = m * HIDDEN * BF16_BYTES
            tflops = gemm_flops(m, MEASURED_GPUS) / (MEASURED_GEMM_MS[op][m] * 1e-3) / 1e12
            calibration.append({"what": f"{op} collective M={m} (vs NCCL)",
                                "measured_us": MEASURED_NCCL_MS[op][m] * 1e3, "cublas_tflops": tflops,
                                "model_us": model.collective_us(op, nbytes, MEASURED_GPUS, 1)})
            for tp, nodes in TP_CASES:
                g, c = gemm_us(op, m, tp), model.collective_us(op, nbytes, tp // nodes, nodes)
                f = max(g, c) * overlap
                fused.append({"op": op, "M": m, "tp": tp, "nodes": nodes, "gemm_us": g, "collective_us": c,
                              "unfused_us": g + c, "fused_us": f, "speedup": (g + c) / f,
                              "bound": "GEMM" if g >= c else "collective"})
    return {"allreduce": allreduce, "fused": fused, "calibration": calibration}


def sensitivity() -> list[dict]:
    """The 16-node all-reduce at the ends of the assumed ranges (efficiency 0.8-0.9, step 5-10 us)."""
    rows = []
    for s in ALLREDUCE_BYTES:
        times = [Model(eff, step).all_reduce(s, GPUS_PER_NODE, max(NODES))["total_us"]
                 for eff in (0.8, 0.9) for step in (5, 10)]
        rows.append({"nodes": max(NODES), "bytes_per_gpu": s, "best_us": min(times), "worst_us": max(times)})
    return rows


def size(nbytes: int) -> str:
    return f"{nbytes // MiB} MiB" if nbytes >= MiB else f"{nbytes // KiB} KiB"


def markdown(model: Model, result: dict, sens: list[dict], overlap: float) -> str:
    """The tables the script prints (and writes as multinode_model.md)."""
    cal = [r for r in result["calibration"] if "cublas_tflops" in r]
    lo, hi = min(r["cublas_tflops"] for r in cal), max(r["cublas_tflops"] for r in cal)
    lines = [
        "Multi-node cost model (benchmarks/multinode_model.py): predictions, not measurements",
        "",
        f"- NVLink: {NVLINK_GBPS:.0f} GB/s per direction (published) x efficiency {model.nvlink_efficiency:.3f} "
        f"(measured 256 MiB tile all-reduce on {MEASURED_GPUS} GPUs), phase latency {model.nvlink_phase_us:.1f} us "
        f"(half the smallest measured all-reduce)",
        f"- network: {NIC_GBPS:.0f} GB/s per rail per direction (published) x efficiency {model.net_efficiency:.2f} "
        f"(assumed), {model.net_step_us:.1f} us per step (assumed); {GPUS_PER_NODE} GPUs per node, one NIC each",
        f"- GEMM: measured cuBLAS time per FLOP at TP {MEASURED_GPUS} ({lo:.0f}-{hi:.0f} TFLOP/s, "
        f"{lo / BF16_PEAK_TFLOPS:.0%}-{hi / BF16_PEAK_TFLOPS:.0%} of the {BF16_PEAK_TFLOPS:.0f} TFLOP/s bf16 peak); "
        f"fused = max(GEMM, collective) x {overlap:.2f} (assumed)",
        "",
        "Hierarchical all-reduce, fp32, per GPU (us):",
        "",
        "| nodes | GPUs | size | RS in node | AR across nodes (steps) | AG in node | total | bus GB/s |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in result["allreduce"]:
        across = f"{r['inter_ar_us']:.1f} ({r['inter_steps']})" if r["nodes"] > 1 else "-"
        lines.append(f"| {r['nodes']} | {r['gpus']} | {size(r['bytes_per_gpu'])} | {r['intra_rs_us']:.1f} | {across} | "
                     f"{r['intra_ag_us']:.1f} | {r['total_us']:.1f} | {r['busbw_GBps']:.0f} |")
    lines += ["", f"{max(NODES)} nodes over the assumed ranges (network efficiency 0.8-0.9, step 5-10 us):", "",
              "| size | best (us) | worst (us) |", "| --- | --- | --- |"]
    lines += [f"| {size(r['bytes_per_gpu'])} | {r['best_us']:.1f} | {r['worst_us']:.1f} |" for r in sens]
    lines += ["", f"Tensor-parallel MLP (hidden {HIDDEN}, intermediate {INTERMEDIATE} / TP, bf16), us per call:", "",
              "| op | M | TP | nodes | GEMM | collective | unfused | fused | unfused / fused | bound by |",
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in result["fused"]:
        lines.append(f"| {r['op']} | {r['M']} | {r['tp']} | {r['nodes']} | {r['gemm_us']:.0f} | "
                     f"{r['collective_us']:.0f} | {r['unfused_us']:.0f} | {r['fused_us']:.0f} | {r['speedup']:.2f} | "
                     f"{r['bound']} |")
    lines += ["", f"Calibration: the model at {MEASURED_GPUS} GPUs in one node against the measurements it uses:", "",
              "| what | measured (us) | model (us) | model / measured |", "| --- | --- | --- | --- |"]
    lines += [f"| {r['what']} | {r['measured_us']:.1f} | {r['model_us']:.1f} | {r['model_us'] / r['measured_us']:.2f} |"
              for r in result["calibration"]]
    return "\n".join(lines)


def plot(result: dict, path: str) -> None:
    """Left: all-reduce time against nodes, one line per size. Right: unfused and fused op time."""
    plt = pyplot()
    if plt is None:
        print(NO_PLOT, flush=True)
        return
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.2), gridspec_kw={"width_ratios": [1, 2]})
    for s in ALLREDUCE_BYTES:
        rows = [r for r in result["allreduce"] if r["bytes_per_gpu"] == s]
        left.plot([r["nodes"] for r in rows], [r["total_us"] for r in rows], marker="o", label=f"{size(s)} per GPU")
    left.set_xscale("log", base=2)
    left.set_yscale("log")
    left.set_xticks(NODES, [str(n) for n in NODES])
    left.set_xlabel(f"nodes ({GPUS_PER_NODE} GPUs each)")
    left.set_ylabel("predicted time (us)")
    left.set_title("hierarchical all-reduce, fp32", fontsize=9)
    left.legend(fontsize=7)
    groups = [(op, m) for op in OPS for m in MEASURED_GEMM_MS[op]]
    width = 0.2
    for k, (tp, nodes) in enumerate(TP_CASES):
        rows = {(r["op"], r["M"]): r for r in result["fused"] if r["tp"] == tp}
        for j, kind in enumerate(("unfused", "fused")):
            x = [i + (2 * k + j - 1.5) * width for i in range(len(groups))]
            right.bar(x, [rows[gr][f"{kind}_us"] / 1e3 for gr in groups], width, color=f"C{2 * k + j}",
                      label=f"TP {tp} ({nodes} node{'s' if nodes > 1 else ''}), {kind}")
    right.set_xticks(range(len(groups)), [f"{op}\nM={m}" for op, m in groups], fontsize=7)
    right.set_ylabel("predicted time (ms)")
    right.set_title("tensor-parallel MLP GEMM + collective, bf16", fontsize=9)
    right.legend(fontsize=7)
    fig.suptitle("Multi-node cost model (predictions from 2-GPU measurements, published and assumed link figures)",
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=os.path.join(HERE, "results"), help="folder for multinode_model.{json,md,png}")
    p.add_argument("--net-efficiency", type=float, default=NET_EFFICIENCY, help="fraction of the NIC rate reached")
    p.add_argument("--net-step-us", type=float, default=NET_STEP_US, help="latency of one step across nodes (us)")
    p.add_argument("--overlap", type=float, default=OVERLAP_FACTOR, help="fused = max(GEMM, collective) x this")
    args = p.parse_args()
    model = Model(args.net_efficiency, args.net_step_us)
    result = predict(model, args.overlap)
    sens = sensitivity()
    table = markdown(model, result, sens, args.overlap)
    print(table)
    os.makedirs(args.out, exist_ok=True)
    stem = os.path.join(args.out, "multinode_model")
    inputs = {"gpus_per_node": GPUS_PER_NODE, "nvlink_GBps": NVLINK_GBPS, "nic_GBps": NIC_GBPS,
              "bf16_peak_tflops": BF16_PEAK_TFLOPS, "measured_gpus": MEASURED_GPUS,
              "tile_allreduce_us": {str(k): v for k, v in TILE_ALLREDUCE_US.items()},
              "hidden": HIDDEN, "intermediate": INTERMEDIATE, "measured_gemm_ms": MEASURED_GEMM_MS,
              "measured_nccl_ms": MEASURED_NCCL_MS, "net_efficiency": args.net_efficiency,
              "net_step_us": args.net_step_us, "overlap_factor": args.overlap}
    derived = {"nvlink_efficiency": model.nvlink_efficiency, "nvlink_phase_us": model.nvlink_phase_us}
    with open(stem + ".json", "w") as f:
        json.dump({"kind": "model (no measurement)", "inputs": inputs, "derived": derived, **result,
                   "sensitivity": sens}, f, indent=1)
    with open(stem + ".md", "w") as f:
        f.write(table + "\n")
    plot(result, stem + ".png")


if __name__ == "__main__":
    main()
