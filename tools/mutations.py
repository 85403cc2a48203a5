"""Break a promise on purpose and check that a test notices.

    python tools/mutations.py                 # every mutation, on the cpu backend (about 20 minutes)
    python tools/mutations.py --list          # the mutations and the checks that must fail
    python tools/mutations.py frame-strides   # some of them, by name
    python tools/mutations.py --baseline ...  # first run the same checks unmutated: they must pass

Each mutation copies ``packages/`` to a temporary folder, replaces one piece of the library's
source (the text must occur exactly as often as stated, so a mutation that no longer applies
fails loudly instead of testing nothing), and runs the checks that guard the promise against
that copy. A mutation is *caught* when every one of its checks fails. The repository itself is
never changed. Prints a table: mutation, promise, check, outcome.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEVICE = "iris-device/src/iris/device"
COLL = "iris-collectives/src/iris/collectives"


@dataclass
class Mutation:
    name: str
    promise: str
    edits: list[tuple[str, str, str, int]]  # (file under packages/, old, new, occurrences)
    checks: list[tuple[str, ...]]  # ("pytest", node...) or ("worker", nranks, scenario..., [ENV=VALUE...])
    env: dict[str, str] = field(default_factory=dict)


MUTATIONS = [
    Mutation("sem-default-and-swap",
             "atomics: sem=None is acq_rel, acquire and release reach the instruction",
             [(f"{DEVICE}/_options.py", "            f\"pass e.g. sem='release' on the writer and sem='acquire' on the reader\"\n"
               "        )\n    return sem\n",
               "            f\"pass e.g. sem='release' on the writer and sem='acquire' on the reader\"\n"
               "        )\n    return {None: 'relaxed', 'acquire': 'release', 'release': 'acquire'}.get(sem, sem)\n", 1)],
             [("pytest", "packages/iris-device/tests/test_device_gpu_compile.py")]),
    Mutation("no-barrier-in-signal", "signal: a CTA barrier before the release",
             [(f"{COLL}/_sync.py", "    \"\"\"\n    tl.debug_barrier()\n    if DEBUG and CHECKED:", "    \"\"\"\n    if DEBUG and CHECKED:", 1)],
             [("pytest", "packages/iris-collectives/tests/test_collectives_compile.py")]),
    Mutation("no-barrier-after-wait", "wait_at_least: a CTA barrier after the acquire",
             [(f"{COLL}/_sync.py", "        seen = tl.atomic_add(flag, 0, sem=\"acquire\", scope=\"sys\")\n    tl.debug_barrier()\n",
               "        seen = tl.atomic_add(flag, 0, sem=\"acquire\", scope=\"sys\")\n", 1)],
             [("pytest", "packages/iris-collectives/tests/test_collectives_compile.py")]),
    Mutation("unlock-acquires", "the spinlock's unlock releases",
             [(f"{COLL}/_all_reduce.py", "tl.atomic_xchg(peer_flag(mutex, rank, peer, heap_bases), 0, sem=\"release\", scope=\"sys\")",
               "tl.atomic_xchg(peer_flag(mutex, rank, peer, heap_bases), 0, sem=\"acquire\", scope=\"sys\")", 1)],
             [("pytest", "packages/iris-collectives/tests/test_collectives_compile.py")]),
    Mutation("frame-strides", "TensorView works for any strides",
             [(f"{COLL}/_views.py", "        pointers = self.ptr + (rows[:, None] * self.stride_m + cols[None, :] * self.stride_n)",
               "        pointers = self.ptr + (rows[:, None] * self.N + cols[None, :])", 1)],
             [("worker", "2", "strided_views_all_reduce"), ("worker", "2", "tensor_view_helpers_any_strides")]),
    Mutation("no-trace-gather-family", "every collective records its trace event",
             [(f"{COLL}/_gather.py", "if ctx.tracing.enabled:", "if False:", 6)],
             [("worker", "2", "tracing_every_collective")]),
    Mutation("no-trace-barrier", "device_barrier records its trace event",
             [(f"{COLL}/_sync.py", "if ctx.tracing.enabled:", "if False:", 2)],
             [("worker", "2", "tracing_every_collective")]),
    Mutation("barrier-own-arrival", "device_barrier waits for every rank",
             [(f"{COLL}/_sync.py", "    signal_all(flags, ctx.rank, ctx.world_size, ctx.heap_bases, SELF=True)\n",
               "    signal(flags, ctx.rank, ctx.rank, ctx.heap_bases, CHECKED=False)\n", 1),
              (f"{COLL}/_sync.py", "wait_at_least(flags, generation * ctx.world_size,", "wait_at_least(flags, generation,", 2)],
             [("worker", "3", "device_barrier_waits_for_late_ranks"), ("worker", "3", "device_barrier_explicit_epochs")]),
    Mutation("debug-timeout-10x", "IRIS_DEBUG_TIMEOUT_S bounds a debug wait",
             [(f"{COLL}/_sync.py", "return float(os.environ.get(\"IRIS_DEBUG_TIMEOUT_S\", \"60\"))",
               "return 10 * float(os.environ.get(\"IRIS_DEBUG_TIMEOUT_S\", \"60\"))", 1)],
             [("worker", "2", "debug_wait_times_out", "IRIS_DEBUG=1", "IRIS_DEBUG_TIMEOUT_S=3", "MPIEXEC_TIMEOUT=120")]),
    Mutation("watchdog-never-stops", "the watchdog ends a wait whose peer never comes",
             [(f"{DEVICE}/_watchdog.py", "    stop = (limit > 0) & ((reason != 0) | timed_out)",
               "    stop = (limit > 0) & (reason != 0)", 1)],
             [("pytest", "packages/iris-collectives/tests/test_collectives_faults.py", "-k", "skip and 2")]),
]


def mutate(mutation: Mutation, root: str) -> None:
    shutil.copytree(os.path.join(REPO, "packages"), os.path.join(root, "packages"),
                    ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "build"))
    for rel, old, new, count in mutation.edits:
        path = os.path.join(root, "packages", rel)
        with open(path) as f:
            text = f.read()
        if text.count(old) != count:
            raise SystemExit(f"{mutation.name}: {rel} holds {text.count(old)} copies of the text to replace, "
                             f"expected {count}: update the mutation to the current source")
        with open(path, "w") as f:
            f.write(text.replace(old, new))


def run_check(check: tuple[str, ...], root: str, env: dict[str, str]) -> tuple[bool, float, str]:
    """(passed, seconds, last lines) of one check against the copy at ``root``."""
    pkgs = os.path.join(root, "packages")
    full = dict(os.environ, PYTHONPATH=os.pathsep.join(
        os.path.join(pkgs, p, "src") for p in ("iris-device", "iris-runtime", "iris-collectives")), **env)
    full.pop("TRITON_INTERPRET", None)
    full.setdefault("IRIS_BACKEND", "cpu")
    if check[0] == "pytest":
        cmd = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
               *[os.path.join(root, a) if a.startswith("packages/") else a for a in check[1:]]]
    else:
        nranks, rest = check[1], check[2:]
        scenarios = [a for a in rest if "=" not in a]
        full.update(dict(a.split("=", 1) for a in rest if "=" in a))
        # the launcher of iris.runtime.testing, asked in a child (importing iris here would fix
        # Triton's mode in this process)
        code = "import shlex; from iris.runtime.testing import launcher; print(shlex.join(launcher()))"
        found = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=full, check=True)
        worker = os.path.join(pkgs, "iris-collectives", "tests", "workers", "collectives_worker.py")
        cmd = shlex.split(found.stdout.strip().splitlines()[-1]) + ["-n", nranks, sys.executable, "-m", "mpi4py",
                                                                    worker, *scenarios]
    start = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=full, cwd=root, timeout=1800)
    tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-3:])
    return proc.returncode == 0, time.monotonic() - start, tail


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("names", nargs="*", help="mutations to run (default: all)")
    p.add_argument("--list", action="store_true")
    p.add_argument("--baseline", action="store_true", help="run each check unmutated first; it must pass")
    args = p.parse_args()
    chosen = [m for m in MUTATIONS if not args.names or m.name in args.names]
    unknown = set(args.names) - {m.name for m in MUTATIONS}
    if unknown:
        raise SystemExit(f"unknown mutation(s) {sorted(unknown)}; --list shows them")
    if args.list:
        for m in chosen:
            print(f"{m.name}: {m.promise}\n    checks: {[' '.join(c) for c in m.checks]}")
        return
    rows, missed = [], 0
    for m in chosen:
        if args.baseline:
            with tempfile.TemporaryDirectory(prefix="iris-baseline-") as root:
                shutil.copytree(os.path.join(REPO, "packages"), os.path.join(root, "packages"),
                                ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "build"))
                for check in m.checks:
                    ok, seconds, tail = run_check(check, root, m.env)
                    if not ok:
                        raise SystemExit(f"baseline of {m.name}: {' '.join(check)} fails unmutated:\n{tail}")
        with tempfile.TemporaryDirectory(prefix=f"iris-mutant-{m.name}-") as root:
            mutate(m, root)
            for check in m.checks:
                ok, seconds, _ = run_check(check, root, m.env)
                missed += ok
                rows.append((m.name, m.promise, " ".join(check), "MISSED" if ok else "caught", seconds))
                print(f"{m.name}: {' '.join(check)}: {'MISSED' if ok else 'caught'} ({seconds:.0f} s)", flush=True)
    print("\n| mutation | promise | check | outcome | s |\n| --- | --- | --- | --- | --- |")
    for name, promise, check, outcome, seconds in rows:
        print(f"| {name} | {promise} | `{check}` | {outcome} | {seconds:.0f} |")
    raise SystemExit(1 if missed else 0)


if __name__ == "__main__":
    main()
