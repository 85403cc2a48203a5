"""The cuda (CUDA IPC) and nvshmem heaps side by side, in one run: RMA bandwidth and tile all-reduce.

    python benchmarks/backends.py --ranks 2                 # GPU machine (MPS for ranks sharing a GPU)
    python benchmarks/backends.py --ranks 2 --quick         # short
    python benchmarks/backends.py --combine A.json B.json   # only the table of two earlier runs

Launches ``benchmarks/rma_bandwidth.py`` and ``benchmarks/tile_collectives.py`` once per backend
(``IRIS_BACKEND=cuda``, then ``nvshmem``: on one node the network path is off, so both run the same
kernels, and what differs is the heap: ``cudaMalloc`` + IPC handles, or NVSHMEM's symmetric heap
mapped by ``nvshmem_ptr``), each with its results in ``<out>/backends_<backend>/``, and prints one
table per benchmark: the cuda number, the nvshmem number, their ratio. Writes
``<out>/backends_<W>ranks.json``, ``.md`` and ``.png``. The nvshmem backend needs nvshmem4py
(``pip install 'iris-runtime[nvshmem]'``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
BACKENDS = ("cuda", "nvshmem")


def launch(ranks: int, script: str, args: list[str], backend: str, timeout: float) -> None:
    """``mpirun -n ranks python -m mpi4py script args`` with ``IRIS_BACKEND=backend``."""
    env = dict(os.environ, IRIS_BACKEND=backend)
    command = ["mpirun", "-n", str(ranks)]
    if os.geteuid() == 0:
        command.append("--allow-run-as-root")
    command += ["--oversubscribe", "-x", "IRIS_BACKEND", sys.executable, "-m", "mpi4py", script, *args]
    print("$ IRIS_BACKEND=" + backend + " " + " ".join(command), flush=True)
    subprocess.run(command, env=env, check=True, timeout=timeout)


def run_backend(backend: str, ranks: int, out: str, quick: bool, timeout: float) -> dict:
    """Both benchmarks on one backend; returns their JSON results."""
    folder = os.path.join(out, f"backends_{backend}")
    os.makedirs(folder, exist_ok=True)
    rma_out = os.path.join(folder, "rma_bandwidth")
    sizes = "1,16" if quick else "1,16,64,256"
    launch(ranks, os.path.join(HERE, "rma_bandwidth.py"),
           ["--ops", "load,store,put,atomic_add", "--dtypes", "fp32", "--sizes", sizes, "--out", rma_out], backend,
           timeout)
    coll_sizes = "64K,1M" if quick else "64K,1M,16M,256M"
    launch(ranks, os.path.join(HERE, "tile_collectives.py"),
           ["--sizes", coll_sizes, "--variants", "one_shot,two_shot", "--dtypes", "fp32", "--no-torch",
            "--out", folder], backend, timeout)
    with open(rma_out + ".json") as f:
        rma = json.load(f)
    coll_files = [n for n in os.listdir(folder) if n.startswith("tile_collectives_") and n.endswith(".json")
                  and not n.endswith(".partial.json")]
    with open(os.path.join(folder, sorted(coll_files)[0])) as f:
        coll = json.load(f)
    return {"backend": backend, "rma": rma, "tile_collectives": coll}


def compare(results: dict) -> list[dict]:
    """One row per measured point present on both backends: cuda, nvshmem, nvshmem / cuda."""
    rows = []
    a, b = results["cuda"], results["nvshmem"]
    rma_b = {(r["op"], r["dtype"], r["bytes"]): r for r in b["rma"]["rows"]}
    for r in a["rma"]["rows"]:
        other = rma_b.get((r["op"], r["dtype"], r["bytes"]))
        if other:
            rows.append({"benchmark": "rma remote GB/s", "what": f"{r['op']} {r['dtype']}", "bytes": r["bytes"],
                         "cuda": r["remote_gbps"], "nvshmem": other["remote_gbps"],
                         "ratio": other["remote_gbps"] / r["remote_gbps"]})
    coll_b = {(p["dtype"], p["bytes_per_rank"]): p for p in b["tile_collectives"]["points"]}
    for p in a["tile_collectives"]["points"]:
        other = coll_b.get((p["dtype"], p["bytes_per_rank"]))
        if not other:
            continue
        for variant in ("one_shot", "two_shot"):
            if variant in p["times_us"] and variant in other["times_us"]:
                rows.append({"benchmark": "tile all-reduce us", "what": f"{variant} {p['dtype']}",
                             "bytes": p["bytes_per_rank"], "cuda": p["times_us"][variant],
                             "nvshmem": other["times_us"][variant],
                             "ratio": other["times_us"][variant] / p["times_us"][variant]})
    return rows


def human(nbytes: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= size:
            return f"{nbytes / size:g} {unit}"
    return f"{nbytes} B"


def table(rows: list[dict]) -> str:
    lines = ["| benchmark | what | size | cuda | nvshmem | nvshmem / cuda |", "| --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        lines.append(f"| {r['benchmark']} | {r['what']} | {human(r['bytes'])} | {r['cuda']:.1f} | {r['nvshmem']:.1f} "
                     f"| {r['ratio']:.3f} |")
    return "\n".join(lines)


def plot(rows: list[dict], path: str, title: str) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(9, 4))
    labels = [f"{r['what']}\n{human(r['bytes'])}" for r in rows]
    ax.bar(range(len(rows)), [r["ratio"] for r in rows], color="tab:green")
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(rows)), labels, rotation=60, fontsize=7, ha="right")
    ax.set_ylabel("nvshmem / cuda (GB/s for RMA, time for all-reduce)")
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return True


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--quick", action="store_true", help="two sizes per benchmark")
    p.add_argument("--out", default=os.path.join(HERE, "results"))
    p.add_argument("--timeout", type=float, default=900, help="seconds per launch")
    p.add_argument("--combine", nargs=2, metavar=("CUDA_JSON", "NVSHMEM_JSON"),
                   help="compare two backend result files written by earlier runs (no launch)")
    args = p.parse_args(argv)
    if args.combine:
        results = {}
        for path in args.combine:
            with open(path) as f:
                data = json.load(f)
            results[data["backend"]] = data
    else:
        results = {backend: run_backend(backend, args.ranks, args.out, args.quick, args.timeout)
                   for backend in BACKENDS}
        for backend, data in results.items():
            with open(os.path.join(args.out, f"backends_{backend}", "results.json"), "w") as f:
                json.dump(data, f, indent=1)
    rows = compare(results)
    device = results["cuda"]["rma"]["meta"].get("device", "?")
    title = f"cuda vs nvshmem heap, {args.ranks} ranks, {device}"
    text = table(rows)
    print(f"\n{title}\n{text}")
    stem = os.path.join(args.out, f"backends_{args.ranks}ranks")
    with open(stem + ".json", "w") as f:
        json.dump({"title": title, "rows": rows}, f, indent=1)
    with open(stem + ".md", "w") as f:
        f.write(f"# {title}\n\n{text}\n")
    plotted = plot(rows, stem + ".png", title)
    print(f"wrote {stem}.json, {stem}.md" + (" and .png" if plotted else ""))


if __name__ == "__main__":
    main()
