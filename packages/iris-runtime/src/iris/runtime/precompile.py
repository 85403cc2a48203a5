"""Compile a kernel manifest on every core: ``python -m iris.runtime.precompile MANIFEST``.

A fresh machine compiles each Triton kernel the first time a job launches it, one after the other;
a manifest (see ``IRIS_KERNEL_RECORD`` in docs/environment.md) lists the kernels a run compiled, and
this command compiles them all at once in ``--jobs`` processes into Triton's cache (the
``TRITON_CACHE_DIR`` the program will use), where the program's launches then find them. Run it
before the program, or beside it with ``IRIS_COMPILE_LOCK=1`` in both: a kernel the program needs
while it is being compiled here is then waited for, not compiled twice.

    IRIS_KERNEL_RECORD=/tmp/kernels mpirun -n 8 python app.py          # once: record
    python -m iris.runtime.precompile --merge /tmp/kernels app-kernels.json
    python -m iris.runtime.precompile app-kernels.json --jobs 16        # on each fresh machine

Prints one line: how many kernels, in how many seconds, how many were stale (the code no longer
has the function, or its parameters changed since the recording: such entries are skipped).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor

from . import _kernel_manifest as manifest


def _start_worker() -> None:
    import iris.runtime  # noqa: F401 - installs IRIS_COMPILE_LOCK's lock in this process too


def compile_all(path: str, jobs: int) -> dict:
    """Compile every entry of the manifest at ``path`` in ``jobs`` processes; returns the counts,
    the seconds and the reasons of the stale entries."""
    entries = manifest.read(path)
    os.environ.pop(manifest.RECORD_ENV, None)  # compiling the manifest must not record it again
    start = time.perf_counter()
    results = []
    if entries:
        # spawn: workers do not inherit the parent's torch or CUDA state
        with ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("spawn"),
                                 initializer=_start_worker) as pool:
            results = list(pool.map(manifest.compile_entry, entries, chunksize=1))
    stale = [r for r in results if r.startswith("stale")]
    return {"kernels": len(entries), "compiled": len(results) - len(stale), "stale": stale,
            "launchers": sum(r == "compiled, launcher built" for r in results),
            "seconds": time.perf_counter() - start, "jobs": jobs}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m iris.runtime.precompile", description=__doc__.split("\n")[0])
    parser.add_argument("manifest", nargs="+", help="the manifest to compile; with --merge: FOLDER MANIFEST")
    parser.add_argument("--merge", action="store_true",
                        help="join the records of IRIS_KERNEL_RECORD's FOLDER into the MANIFEST file")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="processes (default: every core)")
    args = parser.parse_args(argv)
    if args.merge:
        if len(args.manifest) != 2:
            parser.error("--merge takes FOLDER MANIFEST")
        folder, path = args.manifest
        entries = manifest.merge(folder)
        manifest.write(entries, path)
        print(f"precompile: {len(entries)} kernels recorded in {folder} written to {path}")
        return 0
    if len(args.manifest) != 1:
        parser.error("one MANIFEST to compile")
    if args.jobs < 1:
        parser.error(f"--jobs {args.jobs}: at least 1")
    result = compile_all(args.manifest[0], args.jobs)
    print(f"precompile: {result['kernels']} kernels of {args.manifest[0]} in {result['seconds']:.0f} s on "
          f"{result['jobs']} processes: {result['compiled']} compiled or found in the cache, "
          f"{len(result['stale'])} stale; {result['launchers']} C launchers built or found (Triton versions that "
          f"compile one per signature, on a machine with the CUDA driver)")
    for reason in sorted(set(result["stale"]))[:5]:
        print(f"  {reason}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
