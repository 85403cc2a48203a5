"""The sm_90 SASS of the tile all-reduce benchmark's kernel, compiled here without a GPU: how many
instructions each variant has and in which order its bandwidth loop issues loads, adds and stores.

    PYTHONPATH=<tree>/packages/iris-device/src:<tree>/packages/iris-runtime/src:<tree>/packages/iris-collectives/src \
        python tools/sass_schedule.py [--tag NAME] [--variants one_shot,two_shot,spinlock] [--dump DIR]

    python tools/sass_schedule.py --compare NAME=TREE [NAME=TREE ...] [--off NAME=TREE ...] [--jobs 2]

The second form compiles this checkout with the watchdog compiled out (``IRIS_TIMEOUT_S=0``) and
each TREE (a copy of the repository, e.g. from tools/patched_tree.py; ``.`` is this checkout) at
16 configurations (ranks 0 and 1 of 2 and of 4, fp32 and bf16, tile shapes 8x4 and 16x4) and
prints, per build and variant, in how many the bandwidth loop is scheduled as in the compiled-out
build and in how many the register count differs. ``--off`` builds are compiled with the watchdog
compiled out as well: a copy that changes something else (``tools/watchdog-ab.sh``'s ``placebo``)
shows what a change that is not the watchdog does to the schedule.

Why: code that a wait holds but never runs (the watchdog's report) changed the time of a 256 MiB
all-reduce on an H200 by up to 20 us (benchmarks/NOTES.md), and the SASS is the cheap look before
device time is spent. What it showed (NOTES, twelfth session): ptxas draws a new schedule of the
bandwidth loop for any change to the kernel, and which build matches the compiled-out schedule
changes from one configuration to the next; so compare builds over many configurations
(``--compare``), and time them at several shapes, rather than pick one from a single
configuration. The first form prints one line per variant: instruction count, registers, stack
bytes, the number of global vector loads (L), float adds (a) and vector stores (S), and their
issue order. Needs Triton's ptxas, nvdisasm and cuobjdump (they ship in the triton wheel); the
interpreter is switched off here.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

os.environ.pop("TRITON_INTERPRET", None)
os.environ["IRIS_BACKEND"] = "cuda"
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

TARGET = GPUTarget("cuda", 90, 32)
# The benchmark's first shape: 8 rows x 1024 fp32 per tile, 4 warps; PDL launches.
SIGNATURE = {"context": "*i64", "src": "*fp32", "dst": "*fp32", "locks": "*i32", "M": "i32", "N": "i32",
             "stride_src": "i32", "stride_dst": "i32"}
# Pointers and sizes 16-divisible, as the JIT specialises a launch with rows of 4 KiB.
ALIGNED = ("context", "src", "dst", "locks", "M", "N", "stride_src", "stride_dst")

# SASS opcodes of the bandwidth loop: vector global loads, float adds, vector global stores.
_LOAD = re.compile(r"\bLDG\.E(?:\.\w+)*\.128\b")
_ADD = re.compile(r"\bFADD\b")
_STORE = re.compile(r"\bSTG\.E(?:\.\w+)*\.128\b")
_INSTRUCTION = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(.+?);")


def sass(variant: str, rank: int, world_size: int, block_m: int, block_n: int, warps: int,
         dtype: str = "fp32") -> tuple[str, int, int]:
    """Disassembled SASS of the benchmark kernel for ``variant`` (sm_90), its registers per thread and
    stack bytes (spills)."""
    import tile_collectives as bench  # here: --compare's parent process needs no packages on its path

    constexprs = {"rank": rank, "world_size": world_size, "VARIANT": bench.VARIANT_IDS[variant], "BLOCK_M": block_m,
                  "BLOCK_N": block_n, "CALLS": 1, "PDL": True}
    # atomic and spinlock add into an fp32 destination for bf16 data (as the benchmark allocates it)
    sig = dict(SIGNATURE, src=f"*{dtype}", dst="*fp32" if variant in ("atomic", "spinlock") else f"*{dtype}")
    sig.update({k: "constexpr" for k in constexprs})
    names = list(sig)
    attrs = {(names.index(a),): [["tt.divisibility", 16]] for a in ALIGNED}
    src = ASTSource(fn=bench.all_reduce_bench, signature=sig, constexprs=constexprs, attrs=attrs)
    compiled = triton.compile(src, target=TARGET, options={"num_warps": warps})
    nvdisasm = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "nvdisasm"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compiled.asm["cubin"])
        f.flush()
        text = subprocess.run([str(nvdisasm), "-c", f.name], check=True, capture_output=True, text=True).stdout
        usage = subprocess.run([str(nvdisasm.with_name("cuobjdump")), "--dump-resource-usage", f.name], check=True,
                               capture_output=True, text=True).stdout
    regs = int(re.search(r"REG:(\d+)", usage).group(1))
    stack = int(re.search(r"STACK:(\d+)", usage).group(1))
    return text, regs, stack


def instructions(text: str) -> list[str]:
    """The SASS instructions of a disassembly, in order (predicates kept)."""
    return [m.group(1).strip() for m in _INSTRUCTION.finditer(text)]


def schedule(code: list[str]) -> str:
    """L, a and S for the vector loads, float adds and vector stores, in issue order."""
    letters = []
    for ins in code:
        if _LOAD.search(ins):
            letters.append("L")
        elif _ADD.search(ins):
            letters.append("a")
        elif _STORE.search(ins):
            letters.append("S")
    return "".join(letters)


#: The configurations of --compare: (world size, rank, dtype, shape).
CONFIGS = [(w, r, d, sh) for w in (2, 4) for r in (0, 1) for d in ("fp32", "bf16") for sh in ("8x4", "16x4")]


def _compile_config(job: tuple) -> list[dict]:
    # one build at one configuration, in a child process: each build is another copy of the packages
    name, tree, env, variants, (world_size, rank, dtype, shape) = job
    src = [str(Path(tree, "packages", p, "src").resolve()) for p in ("iris-device", "iris-runtime", "iris-collectives")]
    child_env = {k: v for k, v in os.environ.items() if k != "IRIS_TIMEOUT_S"}  # the watchdog on, unless env says
    child_env.update(PYTHONPATH=os.pathsep.join(src), **env)
    proc = subprocess.run([sys.executable, __file__, "--json", "--tag", name, "--variants", variants, "--world-size",
                           str(world_size), "--rank", str(rank), "--dtype", dtype, "--shape", shape],
                          env=child_env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"sass_schedule.py: {name} ({tree}) at {world_size} ranks, rank {rank}, {dtype} {shape} "
                         f"failed:\n{proc.stderr[-2000:]}")
    return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]


def compare(builds: list[str], variants: str, jobs: int, off_builds: list[str] = ()) -> None:
    """The --compare table: each build's schedules against the compiled-out build's; ``off_builds``
    are compiled with the watchdog compiled out too (a placebo: a change that is not the watchdog)."""
    from concurrent.futures import ThreadPoolExecutor

    here = Path(__file__).resolve().parent.parent
    trees = {"compiled out": (str(here), {"IRIS_TIMEOUT_S": "0"})}
    for option, items, env in (("--compare", builds, {}), ("--off", off_builds, {"IRIS_TIMEOUT_S": "0"})):
        for item in items:
            name, sep, tree = item.partition("=")
            if not sep or not Path(tree, "packages").is_dir() or name in trees:
                raise SystemExit(f"sass_schedule.py {option} {item!r}: give NAME=TREE, TREE a checkout with "
                                 f"packages/")
            trees[name] = (tree, env)
    work = [(name, tree, env, variants, config) for name, (tree, env) in trees.items() for config in CONFIGS]
    with ThreadPoolExecutor(jobs) as pool:
        results = [r for rows in pool.map(_compile_config, work) for r in rows]

    def key(r):
        return r["world_size"], r["rank"], r["dtype"], r["shape"], r["variant"]

    off = {key(r): r for r in results if r["tag"] == "compiled out"}
    names = variants.split(",")
    print(f"| build |{''.join(f' {v}: schedule as compiled out / registers differ |' for v in names)}")
    print("| --- " * (1 + len(names)) + "|")
    for name in trees:
        if name == "compiled out":
            continue
        cells = ""
        for v in names:
            mine = [r for r in results if r["tag"] == name and r["variant"] == v]
            same = sum(r["schedule"] == off[key(r)]["schedule"] for r in mine)
            regs = sum(r["registers"] != off[key(r)]["registers"] for r in mine)
            cells += f" {same}/{len(mine)} / {regs} |"
        print(f"| {name} |{cells}", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tag", default="", help="a name for this build, printed on every line")
    p.add_argument("--variants", default="one_shot,two_shot,spinlock")
    p.add_argument("--world-size", type=int, default=2)
    p.add_argument("--rank", type=int, default=0, help="the rank compiled for (a constexpr: kernels differ by rank)")
    p.add_argument("--dtype", default="fp32", choices=("fp32", "bf16"))
    p.add_argument("--shape", default="8x4", help="ROWSxWARPS, as tile_collectives.py --shapes (rows of 4 KiB)")
    p.add_argument("--json", action="store_true", help="one JSON object per line instead of the table")
    p.add_argument("--dump", help="write each variant's SASS to DIR/<tag>-<variant>.sass")
    p.add_argument("--compare", nargs="+", metavar="NAME=TREE", help="the table of builds against compiled out")
    p.add_argument("--off", nargs="+", default=[], metavar="NAME=TREE",
                   help="with --compare: builds compiled with the watchdog compiled out as well (a placebo)")
    p.add_argument("--jobs", type=int, default=2, help="parallel compiles for --compare")
    args = p.parse_args()
    if args.compare or args.off:
        compare(args.compare or [], args.variants, args.jobs, args.off)
        return
    for variant in args.variants.split(","):
        rows, warps = (int(x) for x in args.shape.split("x"))
        block_n = 4096 // (4 if args.dtype == "fp32" else 2)
        text, regs, stack = sass(variant, args.rank, args.world_size, rows, block_n, warps, args.dtype)
        code = instructions(text)
        order = schedule(code)
        if args.dump:
            Path(args.dump).mkdir(parents=True, exist_ok=True)
            Path(args.dump, f"{args.tag or 'build'}-{variant}.sass").write_text(text)
        if args.json:
            print(json.dumps({"tag": args.tag, "variant": variant, "rank": args.rank, "world_size": args.world_size,
                              "dtype": args.dtype, "shape": args.shape, "instructions": len(code), "registers": regs,
                              "stack": stack, "schedule": order}), flush=True)
            continue
        print(f"{args.tag:>14} {variant:>9} {len(code):5d} instr {regs:3d} regs {stack:3d} stack  "
              f"L{order.count('L')} a{order.count('a')} S{order.count('S')}  {order}", flush=True)


if __name__ == "__main__":
    main()
