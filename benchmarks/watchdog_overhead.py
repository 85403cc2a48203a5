"""What the watchdog costs: tile all-reduces with the bounded waits compiled in and compiled out.

    python benchmarks/watchdog_overhead.py [--ranks 2] [--rounds 3] [--sizes 1M,256M] [--quick]

Runs ``benchmarks/tile_collectives.py`` alternately with ``IRIS_TIMEOUT_S`` unset (the default:
waits bounded, 300 s) and ``IRIS_TIMEOUT_S=0`` (the checks compiled out), ``--rounds`` times each,
so that drift of the machine hits both alike. For each variant and size it prints the median time
of each setting, the spread (max - min) of each setting over its rounds, and the difference of the
medians: the watchdog costs nothing measurable when the difference is within the spread. Writes
``watchdog_overhead_<N>ranks.{json,md,png}`` into ``--out``. ``IRIS_MPIEXEC`` sets the launcher
(e.g. ``"mpirun --allow-run-as-root --oversubscribe"`` on the GPU machine).

``--shapes 8x4,16x4,32x8`` (tile shapes as ``tile_collectives.py`` spells them) and ``--dtypes
fp32,bf16`` time every variant at each shape and dtype, and add a ``tuned`` row per variant, size
and dtype: the fastest shape of each setting in each round, as the benchmark's tuning picks it. Why:
ptxas schedules a kernel's bandwidth loop differently for code that changes anywhere in it (the
watchdog's report included), and which build gets the faster schedule changes from one shape or
dtype to the next (``tools/sass_schedule.py``, benchmarks/NOTES.md, twelfth session): one shape
alone measures that lottery as much as the watchdog.

A/B builds: ``--tree NAME=PATH`` (repeatable) adds a setting, watchdog on, that imports the
packages from another source tree (``PATH/packages/*/src``, e.g. a copy with one change), timed in
the same rounds; the table gets its median and its difference from "compiled out". ``--tree-off
NAME=PATH`` does the same with the watchdog compiled out: with a copy that changes something else
(``tools/watchdog-ab.sh``'s ``placebo``), it measures how far a change that is not the watchdog
moves the times, the compiler's share of any difference. ``--tag`` goes into the results' file
names. ``--plot FILE.json`` redraws a results file's table (``.md``) and plot (no run).
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
#: Setting name -> (IRIS_TIMEOUT_S, source tree or None for this one's packages).
SETTINGS = {"bounded": (None, None), "compiled out": ("0", None)}


def launcher() -> list[str]:
    from iris.runtime.testing import launcher as iris_launcher

    return iris_launcher()


def tree_path(tree: str) -> str:
    """PYTHONPATH entries of the packages in source tree ``tree``."""
    src = [os.path.join(tree, "packages", p, "src") for p in ("iris-device", "iris-runtime", "iris-collectives")]
    missing = [d for d in src if not os.path.isdir(d)]
    if missing:
        raise SystemExit(f"watchdog_overhead.py --tree: {missing[0]} does not exist; give a checkout's root")
    return os.pathsep.join(src)


def run_once(args, timeout_s: str | None, tree: str | None, out_dir: str) -> dict:
    env = dict(os.environ)
    env.pop("IRIS_TIMEOUT_S", None)
    if timeout_s is not None:
        env["IRIS_TIMEOUT_S"] = timeout_s
    if tree is not None:
        # the tree's packages first; the rest of PYTHONPATH (torch, triton, ...) stays
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [tree_path(tree), env.get("PYTHONPATH", "")]))
    script = os.path.join(HERE, "tile_collectives.py")
    # every variant at every shape when there are several (shapes_us in the result)
    tune = args.variants if "," in args.shapes else ""
    cmd = launcher() + ["-n", str(args.ranks), sys.executable, "-m", "mpi4py", script, "--variants", args.variants,
                        "--dtypes", args.dtypes, "--sizes", args.sizes, "--no-torch", "--tune", tune,
                        "--shapes", args.shapes, "--out", out_dir]
    if args.quick:
        cmd.append("--quick")
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise SystemExit(f"tile_collectives.py failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n"
                         f"{proc.stderr[-3000:]}")
    name = next(f for f in os.listdir(out_dir) if f.endswith(".json"))
    with open(os.path.join(out_dir, name)) as f:
        return json.load(f)


def markdown(result: dict) -> str:
    """The results as printed: a row per variant, size, dtype and shape with the times of every
    setting, then the kernels as launched. ``result`` is what the JSON holds (files of the eleventh
    session have no dtype, shape, A/B trees or spills: those cells are left out or '-')."""
    rows = result["rows"]
    trees = list(rows[0].get("trees_us", {})) if rows else []
    settings = list(rows[0]["kernels"]) if rows and "kernels" in rows[0] else ["bounded", "compiled out", *trees]
    head = "".join(f" {name} (us, median; difference) |" for name in trees)
    lines = [f"watchdog cost, {result['ranks']} ranks, {result['backend']} on {result['device']}, "
             f"{result['rounds']} rounds each", "",
             "| variant | bytes/rank | dtype | tile shape | bounded (us, median) | compiled out (us, median) | "
             f"difference (us) | spread (us) | within noise |{head}", "| --- " * (9 + len(trees)) + "|"]
    for r in rows:
        cells = "".join(f" {statistics.median(t):.2f}; {statistics.median(t) - r['median_compiled_out_us']:+.2f} |"
                        for t in r.get("trees_us", {}).values())
        lines.append(f"| {r['variant']} | {r['bytes_per_rank']} | {r.get('dtype', 'fp32')} | {r.get('shape', '-')} | "
                     f"{r['median_bounded_us']:.2f} | "
                     f"{r['median_compiled_out_us']:.2f} | {r['difference_us']:+.2f} | {r['spread_us']:.2f} | "
                     f"{'yes' if r['within_noise'] else 'NO'} |{cells}")
    if not any(r.get("kernels") for r in rows):
        return "\n".join(lines)  # the eleventh session's files: no kernels recorded
    # spilled: Triton's n_spills, the kernel's local memory per thread in 4-byte words (what ptxas
    # spills registers to). A build that spills where another does not is slower for that alone
    # (the placebo's one-shot, benchmarks/NOTES.md, fourteenth session).
    lines += ["", "kernels as launched (registers per thread / spilled 4-byte words per thread / programs per SM / "
              "grid; the GPU only; with several shapes, the fastest shape's)", "",
              "| variant | bytes/rank | dtype | tile shape |" + "".join(f" {name} |" for name in settings),
              "| --- " * (4 + len(settings)) + "|"]
    several = any(r.get("shape") == "tuned" for r in rows)
    for r in rows:
        if several and r["shape"] != "tuned":
            continue  # the benchmark describes the kernel of each setting's fastest shape only
        kernels = [r.get("kernels", {}).get(name, {}) for name in settings]
        cells = "".join(f" {k['shape'] + ': ' if 'shape' in k else ''}{k.get('regs', '-')} / {k.get('spills', '-')} / "
                        f"{k.get('resident_per_sm', '-')} / {k.get('grid', '-')} |" for k in kernels)
        lines.append(f"| {r['variant']} | {r['bytes_per_rank']} | {r.get('dtype', 'fp32')} | {r.get('shape', '-')} |"
                     f"{cells}")
    return "\n".join(lines)


def plot(result: dict, path: str) -> str | None:
    """Draw each row's times relative to its median compiled-out time: one column per row, the
    settings side by side in it. ``result`` is what the JSON holds. Returns why no plot was drawn,
    or None."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "no matplotlib: no plot"
    rows, title = result["rows"], f"watchdog cost, {result['ranks']} ranks ({result['device']})"
    fig, ax = plt.subplots(figsize=(max(7.0, 0.45 * len(rows)), 4.2))
    # one line per column, turned: "two_shot 256M bf16 64x8" stays readable with 30 columns
    # (files of the eleventh session have one dtype and shape and no A/B trees: no such keys)
    size = [f"{n >> 20}M" if n >= 1 << 20 else f"{n >> 10}K" for n in (r["bytes_per_rank"] for r in rows)]
    labels = [f"{r['variant']} {s} {r.get('dtype', '')} {r.get('shape', '')}".strip() for r, s in zip(rows, size)]
    # bounded red, compiled out blue, the A/B trees in colours neither of those uses
    tree_colors = ["tab:green", "tab:purple", "tab:orange", "tab:brown", "tab:pink", "tab:olive"]
    for i, r in enumerate(rows):
        base = r["median_compiled_out_us"]
        ax.scatter([i - 0.15] * len(r["bounded_us"]), [t / base for t in r["bounded_us"]], s=14,
                   color="tab:red", label="bounded (shipped)" if i == 0 else None)
        ax.scatter([i - 0.05] * len(r["compiled_out_us"]), [t / base for t in r["compiled_out_us"]], s=14,
                   color="tab:blue", label="compiled out" if i == 0 else None)
        for j, (name, t) in enumerate(r.get("trees_us", {}).items()):
            ax.scatter([i + 0.05 + 0.1 * j] * len(t), [x / base for x in t], marker="x", s=14,
                       color=tree_colors[j % len(tree_colors)], label=name if i == 0 else None)
        if r.get("shape") == "tuned":
            ax.axvspan(i - 0.4, i + 0.4, color="0.92", zorder=0)
    ax.axhline(1.0, color="gray", lw=0.5)
    ax.set_xticks(range(len(rows)), labels, fontsize=7, rotation=60, ha="right", rotation_mode="anchor")
    ax.set_ylabel("time / median compiled out")
    ax.set_title(title + ("; shaded: tuned (each setting's fastest shape)" if any(r.get("shape") == "tuned"
                                                                                for r in rows) else ""), fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--sizes", default="1M,256M")
    p.add_argument("--variants", default="one_shot,two_shot,spinlock")
    p.add_argument("--dtypes", default="fp32", help="fp32,bf16")
    p.add_argument("--shapes", default="8x4", help="tile shapes ROWSxWARPS, comma-separated (several: a tuned row too)")
    p.add_argument("--quick", action="store_true", help="tiny sizes (the CPU backend)")
    p.add_argument("--tree", action="append", default=[], metavar="NAME=PATH",
                   help="also time the packages of source tree PATH (watchdog on) as setting NAME")
    p.add_argument("--tree-off", action="append", default=[], metavar="NAME=PATH",
                   help="the same with the watchdog compiled out (IRIS_TIMEOUT_S=0): a placebo, a change that "
                        "is not the watchdog, shows how far any change moves the times")
    p.add_argument("--tag", default="", help="appended to the results' file names")
    p.add_argument("--out", default=os.path.join(HERE, "results"))
    p.add_argument("--plot", metavar="JSON", help="only redraw the table and plot of a results file (next to it)")
    args = p.parse_args()
    if args.plot:
        with open(args.plot) as f:
            result = json.load(f)
        stem = os.path.splitext(args.plot)[0]
        with open(stem + ".md", "w") as f:
            f.write(markdown(result) + "\n")
        why_not = plot(result, stem + ".png")
        print(why_not or f"wrote {stem}.md and .png", flush=True)
        sys.exit(1 if why_not else 0)
    if args.quick:
        args.sizes = "4K"
    settings = dict(SETTINGS)
    for option, items, timeout_s in (("--tree", args.tree, None), ("--tree-off", args.tree_off, "0")):
        for item in items:
            name, sep, path = item.partition("=")
            if not sep or not name or name in settings:
                raise SystemExit(f"watchdog_overhead.py {option} {item!r}: give NAME=PATH with a new NAME")
            tree_path(path)
            settings[name] = (timeout_s, os.path.abspath(path))
    extra = [name for name in settings if name not in SETTINGS]
    # (variant, bytes, dtype, shape or "tuned", setting) -> the times of the rounds
    times: dict[tuple[str, int, str, str, str], list[float]] = {}
    # (variant, bytes, dtype, shape, setting) -> the kernel as launched: registers, programs per SM,
    # grid (of the fastest shape for "tuned"). A build that needs more registers can fit fewer
    # programs per SM, and that costs bandwidth by itself.
    kernels: dict[tuple[str, int, str, str, str], dict] = {}
    device = backend = None
    compiled_in: dict[str, bool] = {}  # setting -> whether its kernels had the watchdog compiled in
    for round_ in range(args.rounds):
        for setting, (value, tree) in settings.items():
            with tempfile.TemporaryDirectory() as tmp:
                result = run_once(args, value, tree, tmp)
            device, backend = result["device"], result["backend"]
            compiled_in[setting] = result["watchdog_compiled_in"]
            for point in result["points"]:
                assert all(point["correct"].values()), point
                for variant, us in point["times_us"].items():
                    kernel = dict(point.get("kernel", {}).get(variant, {}), grid=point["grid"][variant])
                    base = (variant, point["bytes_per_rank"], point.get("dtype", "fp32"))
                    per_shape = point.get("shapes_us", {}).get(variant) or {point["shape"][variant]: us}
                    for shape, shape_us in per_shape.items():
                        assert shape_us is not None, (variant, shape, point)  # None: a wrong result
                        times.setdefault((*base, shape, setting), []).append(shape_us)
                    kernels[(*base, point["shape"][variant], setting)] = kernel
                    if len(per_shape) > 1:
                        times.setdefault((*base, "tuned", setting), []).append(us)
                        kernels[(*base, "tuned", setting)] = dict(kernel, shape=point["shape"][variant])
            print(f"round {round_ + 1}/{args.rounds} {setting}: done", flush=True)
    rows = []
    def order(key):  # by variant, size, dtype, then the shapes as given and "tuned" last
        shapes = args.shapes.split(",")
        return key[:3], shapes.index(key[3]) if key[3] in shapes else len(shapes)

    for variant, nbytes, dtype, shape in sorted({k[:4] for k in times}, key=order):
        key = (variant, nbytes, dtype, shape)
        on, off = times[(*key, "bounded")], times[(*key, "compiled out")]
        spread = max(max(on) - min(on), max(off) - min(off))
        diff = statistics.median(on) - statistics.median(off)
        rows.append({"variant": variant, "bytes_per_rank": nbytes, "dtype": dtype, "shape": shape,
                     "bounded_us": on, "compiled_out_us": off,
                     "median_bounded_us": statistics.median(on), "median_compiled_out_us": statistics.median(off),
                     "difference_us": diff, "spread_us": spread, "within_noise": abs(diff) <= spread,
                     "trees_us": {name: times[(*key, name)] for name in extra},
                     "kernels": {name: kernels.get((*key, name), {}) for name in settings}})
    result = {"ranks": args.ranks, "device": device, "backend": backend, "rounds": args.rounds,
              "trees": {name: settings[name][1] for name in extra}, "watchdog_compiled_in": compiled_in,
              "rows": rows}
    table = markdown(result)
    print(table)
    os.makedirs(args.out, exist_ok=True)
    stem = os.path.join(args.out, f"watchdog_overhead_{args.ranks}ranks{'_quick' if args.quick else ''}"
                                  f"{'_' + args.tag if args.tag else ''}")
    with open(stem + ".json", "w") as f:
        json.dump(result, f, indent=1)
    with open(stem + ".md", "w") as f:
        f.write(table + "\n")
    why_not = plot(result, stem + ".png")
    if why_not:
        print(why_not, flush=True)


if __name__ == "__main__":
    main()
