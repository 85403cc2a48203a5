"""What the watchdog costs: tile all-reduces with the bounded waits compiled in and compiled out.

    python benchmarks/watchdog_overhead.py [--ranks 2] [--rounds 3] [--sizes 1M,256M] [--quick]

Runs ``benchmarks/tile_collectives.py`` alternately with ``IRIS_TIMEOUT_S`` unset (the default:
waits bounded, 300 s) and ``IRIS_TIMEOUT_S=0`` (the checks compiled out), ``--rounds`` times each,
so that drift of the machine hits both alike. For each variant and size it prints the median time
of each setting, the spread (max - min) of each setting over its rounds, and the difference of the
medians: the watchdog costs nothing measurable when the difference is within the spread. Writes
``watchdog_overhead_<N>ranks.{json,md,png}`` into ``--out``. ``IRIS_MPIEXEC`` sets the launcher
(e.g. ``"mpirun --allow-run-as-root --oversubscribe"`` on the GPU machine).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SETTINGS = {"bounded": None, "compiled out": "0"}


def launcher() -> list[str]:
    from iris.runtime.testing import launcher as iris_launcher

    return iris_launcher()


def run_once(args, timeout_s: str | None, out_dir: str) -> dict:
    env = dict(os.environ)
    env.pop("IRIS_TIMEOUT_S", None)
    if timeout_s is not None:
        env["IRIS_TIMEOUT_S"] = timeout_s
    script = os.path.join(HERE, "tile_collectives.py")
    cmd = launcher() + ["-n", str(args.ranks), sys.executable, "-m", "mpi4py", script, "--variants", args.variants,
                        "--dtypes", "fp32", "--sizes", args.sizes, "--no-torch", "--tune", "", "--out", out_dir]
    if args.quick:
        cmd.append("--quick")
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise SystemExit(f"tile_collectives.py failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n"
                         f"{proc.stderr[-3000:]}")
    name = next(f for f in os.listdir(out_dir) if f.endswith(".json"))
    with open(os.path.join(out_dir, name)) as f:
        return json.load(f)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--sizes", default="1M,256M")
    p.add_argument("--variants", default="one_shot,two_shot,spinlock")
    p.add_argument("--quick", action="store_true", help="tiny sizes (the CPU backend)")
    p.add_argument("--out", default=os.path.join(HERE, "results"))
    args = p.parse_args()
    if args.quick:
        args.sizes = "4K"
    times: dict[tuple[str, int, str], list[float]] = {}
    device = backend = None
    for round_ in range(args.rounds):
        for setting, value in SETTINGS.items():
            with tempfile.TemporaryDirectory() as tmp:
                result = run_once(args, value, tmp)
            device, backend = result["device"], result["backend"]
            for point in result["points"]:
                assert all(point["correct"].values()), point
                for variant, us in point["times_us"].items():
                    times.setdefault((variant, point["bytes_per_rank"], setting), []).append(us)
            print(f"round {round_ + 1}/{args.rounds} {setting}: done", flush=True)
    rows = []
    for variant, nbytes in sorted({(v, b) for v, b, _ in times}):
        on, off = times[(variant, nbytes, "bounded")], times[(variant, nbytes, "compiled out")]
        spread = max(max(on) - min(on), max(off) - min(off))
        diff = statistics.median(on) - statistics.median(off)
        rows.append({"variant": variant, "bytes_per_rank": nbytes, "bounded_us": on, "compiled_out_us": off,
                     "median_bounded_us": statistics.median(on), "median_compiled_out_us": statistics.median(off),
                     "difference_us": diff, "spread_us": spread, "within_noise": abs(diff) <= spread})
    lines = [f"watchdog cost, {args.ranks} ranks, {backend} on {device}, {args.rounds} rounds each, fp32",
             "", "| variant | bytes/rank | bounded (us, median) | compiled out (us, median) | difference (us) | "
             "spread (us) | within noise |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        lines.append(f"| {r['variant']} | {r['bytes_per_rank']} | {r['median_bounded_us']:.2f} | "
                     f"{r['median_compiled_out_us']:.2f} | {r['difference_us']:+.2f} | {r['spread_us']:.2f} | "
                     f"{'yes' if r['within_noise'] else 'NO'} |")
    table = "\n".join(lines)
    print(table)
    os.makedirs(args.out, exist_ok=True)
    stem = os.path.join(args.out, f"watchdog_overhead_{args.ranks}ranks{'_quick' if args.quick else ''}")
    with open(stem + ".json", "w") as f:
        json.dump({"ranks": args.ranks, "device": device, "backend": backend, "rounds": args.rounds, "rows": rows}, f,
                  indent=1)
    with open(stem + ".md", "w") as f:
        f.write(table + "\n")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("no matplotlib: no plot", flush=True)
        return
    fig, ax = plt.subplots(figsize=(7, 3.5))
    labels = [f"{r['variant']}\n{r['bytes_per_rank'] >> 10} KiB" for r in rows]
    for i, r in enumerate(rows):
        ax.scatter([i - 0.1] * len(r["bounded_us"]), [t / r["median_compiled_out_us"] for t in r["bounded_us"]],
                   color="tab:red", label="bounded" if i == 0 else None)
        ax.scatter([i + 0.1] * len(r["compiled_out_us"]),
                   [t / r["median_compiled_out_us"] for t in r["compiled_out_us"]], color="tab:blue",
                   label="compiled out" if i == 0 else None)
    ax.axhline(1.0, color="gray", lw=0.5)
    ax.set_xticks(range(len(rows)), labels, fontsize=7)
    ax.set_ylabel("time / median compiled out")
    ax.set_title(f"watchdog cost, {args.ranks} ranks ({device})", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(stem + ".png", dpi=120)


if __name__ == "__main__":
    main()
