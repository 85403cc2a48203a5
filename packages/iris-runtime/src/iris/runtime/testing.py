"""Multi-rank test support: launch N ranks from pytest, run many scenarios per launch.

Pattern (never hangs, output kept): the pytest process runs
``mpiexec -n N python -m mpi4py worker.py scenario ...`` under a timeout and asserts exit 0,
showing every rank's output when it fails. ``python -m mpi4py`` turns an uncaught exception on
any rank into ``MPI_Abort``, so one failing rank ends the job at once.

Worker side::

    def scenario_store_to_every_peer(ctx): ...

    if __name__ == "__main__":
        iris.runtime.testing.run_scenarios(globals())

:func:`run_torchrun` does the same under torchrun (``python -m torch.distributed.run
--standalone --nproc-per-node N worker.py ...``): the ranks bootstrap from torch.distributed, and
a failing rank's exit makes torchrun end the others.

Environment: ``IRIS_MPIEXEC`` overrides the launcher (e.g. ``"mpirun --oversubscribe"``);
``IRIS_TEST_WORLD_SIZES`` (``"1,2,3,4"``) is read by :func:`world_sizes`; ``IRIS_TEST_SPREAD_CASES=1``
makes :func:`spread` share a product loop's cases out among those world sizes, and
``IRIS_TEST_SCENARIO_PARTS=n`` makes :func:`scenario_params` split a worker's scenarios over n jobs;
``IRIS_TEST_TIMINGS=<folder>`` records where a suite's time goes (:func:`record_timing`): every
job's command and seconds, and for each :func:`run_scenarios` worker its start-up, each scenario's
seconds and the Triton compilation inside them, and its close.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable

SCENARIO_PREFIX = "scenario_"


def expect_error(fn: Callable[[], object], kind: type[BaseException], *fragments: str) -> str:
    """Call ``fn``; it must raise ``kind`` (or a subclass) whose text holds every fragment.

    The text is the exception's and that of every exception it was raised from or during (Triton's
    compiler and interpreter wrap errors, sometimes several times), so a message raised deep in a
    kernel's compilation is found. Returns the message of the exception raised (``str(exc)``);
    raises ``AssertionError`` naming the missing fragments, or saying nothing was raised.
    """
    try:
        fn()
    except kind as exc:
        chain, seen = [], exc
        while seen is not None and len(chain) < 20:
            chain.append(f"{type(seen).__name__}: {seen}")
            seen = seen.__cause__ or seen.__context__
        text = "\n".join(chain)
        missing = [f for f in fragments if f not in text]
        assert not missing, f"{kind.__name__} text lacks {missing}: {text}"
        return str(exc)
    raise AssertionError(f"expected {kind.__name__} mentioning {fragments}; nothing was raised")


def busy_stream(ctx, seconds: float = 0.5) -> None:
    """Keep this rank's device stream busy for about ``seconds``, as a long GEMM would, so that the
    rank's next kernel starts late while its host goes on: on the GPU a spin kernel
    (``torch.cuda._sleep``, which counts GPU clock cycles: the device's clock rate where torch
    reports one, else 1.98 GHz, an H100/H200 boost clock, so the time is approximate), on the cpu
    backend, whose work runs on the host, a host sleep."""
    import time

    import torch

    if ctx.device.type == "cuda":
        rate_khz = getattr(torch.cuda.get_device_properties(ctx.device), "clock_rate", 0) or 1_980_000
        torch.cuda._sleep(int(seconds * rate_khz * 1e3))
    else:
        time.sleep(seconds)


def world_sizes(default: str = "1,2,3,4") -> list[int]:
    """World sizes to test, from ``IRIS_TEST_WORLD_SIZES`` (comma-separated)."""
    return [int(n) for n in os.environ.get("IRIS_TEST_WORLD_SIZES", default).split(",") if n.strip()]


SPREAD_ENV = "IRIS_TEST_SPREAD_CASES"


def spread(cases, world_size: int) -> list:
    """The cases of a product loop this world size runs: all of them, or, with
    ``IRIS_TEST_SPREAD_CASES=1`` (set by ``tools/gpu-tests.sh``), a k-th of them (k the number of
    world sizes in ``IRIS_TEST_WORLD_SIZES``), so that the suite's world sizes share the cases out
    and each case runs once, at one of them. Case i goes to the world size at place
    ``(i + i // k) % k`` of the list: the pattern shifts every k cases, so that an inner factor of
    k values (two ops, two strategies) does not go whole to one world size.

    For loops over dtypes x ops x variants on the GPU: each case is a kernel specialisation, which
    every rank compiles (the rank is a compile-time constant), and the cpu suite already runs every
    case at every world size. A world size outside the list (a test that fixes its own) runs all.
    """
    cases = list(cases)
    if os.environ.get(SPREAD_ENV, "0") in ("", "0"):
        return cases
    sizes = world_sizes()
    if world_size not in sizes:
        return cases
    k, place = len(sizes), sizes.index(world_size)
    return [case for i, case in enumerate(cases) if (i + i // k) % k == place]


PARTS_ENV = "IRIS_TEST_SCENARIO_PARTS"
ONLY_ENV = "IRIS_TEST_SCENARIOS"


def scenario_params(sizes: list[int], scenarios: list[str]) -> list:
    """``pytest.param(nranks, names)`` for ``@pytest.mark.parametrize("nranks, scenarios", ...)``:
    one job per world size running every scenario (ids ``"2"``, ``"4"``), or, with
    ``IRIS_TEST_SCENARIO_PARTS=n`` (``tools/gpu-tests.sh`` sets it), n jobs per world size that share
    the scenarios out in turn (ids ``"2-part1of3"``...). A job runs its scenarios one after the
    other, each compiling its kernels; the side-by-side processes of the GPU suite run the parts at
    once, so that no single job holds the suite's end.

    ``IRIS_TEST_SCENARIOS=a,b`` keeps only the scenarios named (in the worker's order): one feature's
    scenarios on the GPU, without the rest of their workers; a worker with none of them gets no job
    (its test is reported as skipped: an empty parameter set)."""
    import pytest

    only = [name.strip() for name in os.environ.get(ONLY_ENV, "").split(",") if name.strip()]
    if only:
        scenarios = [name for name in scenarios if name in only]
        if not scenarios:
            return []
    parts = max(1, int(os.environ.get(PARTS_ENV, "1") or 1))
    shares = [scenarios[k::parts] for k in range(parts)]
    shares = [share for share in shares if share]
    if len(shares) <= 1:
        return [pytest.param(n, list(scenarios), id=str(n)) for n in sizes]
    return [pytest.param(n, share, id=f"{n}-part{k + 1}of{len(shares)}") for n in sizes
            for k, share in enumerate(shares)]


def launcher() -> list[str]:
    """The mpiexec command line prefix for this machine."""
    override = os.environ.get("IRIS_MPIEXEC")
    if override:
        return shlex.split(override)
    here = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    exe = here if os.path.exists(here) else shutil.which("mpiexec") or shutil.which("mpirun")
    if exe is None:
        raise RuntimeError("no mpiexec found: pip install mpich (or set IRIS_MPIEXEC)")
    cmd = [exe]
    # env: Python's copy of the environment, without what an initialised MPI in this process may
    # have set at the C level (Open MPI's variables make a nested mpiexec fail)
    version = subprocess.run([exe, "--version"], capture_output=True, text=True, env=dict(os.environ)).stdout
    if "Open MPI" in version or "OpenRTE" in version:
        cmd += ["--oversubscribe"]
        if os.geteuid() == 0:
            cmd += ["--allow-run-as-root"]
    return cmd


def run_ranks(nranks: int, script: str, *args: str, timeout: float = 600, env: dict | None = None,
              expect_failure: bool = False) -> subprocess.CompletedProcess:
    """Run ``script`` on ``nranks`` ranks; raise ``AssertionError`` with the ranks' output unless it
    exits 0 (or, with ``expect_failure``, unless it exits non-zero)."""
    cmd = launcher() + ["-n", str(nranks), sys.executable, "-m", "mpi4py", script, *args]
    return run_command(cmd, timeout=timeout, env=env, expect_failure=expect_failure)


def torchrun_launcher(nranks: int) -> list[str]:
    """The torchrun command line prefix for ``nranks`` ranks on this machine (this Python's
    ``torch.distributed.run``, a standalone rendezvous on a free local port)."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nranks}"]


def run_torchrun(nranks: int, script: str, *args: str, timeout: float = 600, env: dict | None = None,
                 expect_failure: bool = False) -> subprocess.CompletedProcess:
    """Like :func:`run_ranks`, with torchrun as the launcher: ``script`` runs on ``nranks`` ranks
    that bootstrap through torch.distributed. Output is kept and shown on failure."""
    # OMP_NUM_THREADS: torchrun sets 1 anyway and prints a banner about it; saying so silences it.
    env = {"OMP_NUM_THREADS": "1", **(env or {})}
    return run_command(torchrun_launcher(nranks) + [script, *args], timeout=timeout, env=env,
                       expect_failure=expect_failure)


def run_command(cmd: list[str], timeout: float = 600, env: dict | None = None,
                expect_failure: bool = False) -> subprocess.CompletedProcess:
    """Run a launcher command line ``cmd`` under ``timeout`` with ``env`` added to this process's
    environment; raise ``AssertionError`` with its output unless it exits 0 (or, with
    ``expect_failure``, unless it exits non-zero).

    The job runs in a session of its own, and a timeout (or Ctrl-C) kills the whole session: a
    launcher killed alone leaves its ranks behind (torchrun's workers outlive a killed agent).
    """
    full_env = dict(os.environ, PYTHONUNBUFFERED="1", **(env or {}))
    start = time.monotonic()
    shm_before = _shm_listing()
    job = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=full_env,
                           start_new_session=True)
    try:
        out, err = job.communicate(timeout=timeout)
    except BaseException as exc:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(job.pid, signal.SIGKILL)
        out, err = job.communicate()
        remove_dead_mpich_segments(shm_before)  # the killed ranks never unlink theirs
        if isinstance(exc, subprocess.TimeoutExpired):
            raise AssertionError(
                f"{' '.join(cmd)} timed out after {timeout} s\n--- stdout\n{out}\n--- stderr\n{err}") from None
        if isinstance(exc, KeyboardInterrupt):
            # a suite ended by an outer deadline (SIGINT): say how far the job got, past pytest's
            # capture, which an interrupted run does not report
            print(f"\ninterrupted after {time.monotonic() - start:.0f} s: {' '.join(cmd)}\n--- its stdout (end)\n"
                  f"{out[-4000:]}\n--- its stderr (end)\n{err[-2000:]}", file=sys.__stderr__, flush=True)
        raise
    proc = subprocess.CompletedProcess(cmd, job.returncode, out, err)
    elapsed = time.monotonic() - start
    record_timing("jobs", {"cmd": " ".join(cmd[cmd.index("-n"):] if "-n" in cmd else cmd[-3:]),
                           "seconds": round(elapsed, 2), "rc": job.returncode})
    if proc.returncode != 0:
        remove_dead_mpich_segments(shm_before)
    failed = proc.returncode != 0
    if failed != expect_failure:
        raise AssertionError(
            f"{' '.join(cmd)} exited {proc.returncode} after {elapsed:.1f} s"
            f"{' (expected a failure)' if expect_failure else ''}"
            f"\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}")
    return proc


TIMINGS_ENV = "IRIS_TEST_TIMINGS"


def record_timing(kind: str, row: dict) -> None:
    """Append ``row`` as one JSON line to ``<IRIS_TEST_TIMINGS>/<kind>.jsonl`` (nothing when the
    variable is unset). ``tools/suite_timings.py`` sums the files into a breakdown of the suite."""
    folder = os.environ.get(TIMINGS_ENV)
    if not folder:
        return
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, f"{kind}.jsonl"), "a") as f:
        f.write(json.dumps(row) + "\n")


def process_age_s() -> float:
    """Seconds since this process started (Linux ``/proc``; 0.0 where it is not readable): what a
    worker spent before its first scenario (interpreter, imports, MPI, the context)."""
    try:
        with open("/proc/self/stat") as f:
            start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return max(0.0, uptime - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return 0.0


class CompileClock:
    """Counts Triton's compilations in this process (misses of its cache, their seconds, and hits)
    through ``triton.knobs.compilation.listener``, where this Triton has it (``available``)."""

    def __init__(self) -> None:
        self.seconds, self.compiled, self.hits = 0.0, 0, 0
        self.available = False
        try:
            from triton import knobs
        except ImportError:
            return
        compilation = getattr(knobs, "compilation", None)
        if compilation is not None and hasattr(compilation, "listener") and compilation.listener is None:
            compilation.listener = self
            self.available = True

    def __call__(self, *, times, cache_hit, **_) -> None:
        if cache_hit:
            self.hits += 1
        else:
            self.compiled += 1
            self.seconds += times.total / 1e6

    def reading(self) -> tuple[float, int, int]:
        return self.seconds, self.compiled, self.hits


SHM_DIR = "/dev/shm"
#: A segment younger than this may belong to a job that is starting: its ranks open it by name.
_YOUNG_S = 1.0


def _shm_listing() -> set[str]:
    return set(os.listdir(SHM_DIR)) if os.path.isdir(SHM_DIR) else set()


def _mapped_anywhere(path: str) -> bool:
    # some live process maps the file: it belongs to a running job
    for maps in glob.glob("/proc/[0-9]*/maps"):
        try:
            with open(maps) as f:
                if path in f.read():
                    return True
        except OSError:
            continue
    return False


def remove_dead_mpich_segments(before: set[str]) -> list[str]:
    """Remove the MPICH shared-memory segments (``/dev/shm/mpich_shm_*``) that appeared since the
    listing ``before`` (names in ``/dev/shm``) and that no live process maps; returns their paths.

    An MPICH job that ends in ``MPI_Abort`` (how a failing rank ends the job) leaves its node's
    segment behind, a few MB each; test runs that abort jobs on purpose filled ``/dev/shm`` by
    hundreds of them. :func:`run_command` calls this after every job that exits non-zero or
    that it kills.
    Segments still mapped (their job is running) or created in the last second (a job starting:
    its ranks open the segment by name after its creator made it) are left alone.
    """
    removed = []
    for name in sorted(_shm_listing() - before):
        if not name.startswith("mpich_shm_"):
            continue
        path = os.path.join(SHM_DIR, name)
        deadline = time.monotonic() + 3  # killed ranks may take a moment to go after mpiexec returned
        while time.monotonic() < deadline:
            try:
                young = time.time() - os.stat(path).st_mtime < _YOUNG_S
            except OSError:
                break  # already gone
            if not young and not _mapped_anywhere(path):
                with contextlib.suppress(OSError):
                    os.unlink(path)
                    removed.append(path)
                break
            time.sleep(0.2)
    return removed


def dump_stacks_before_the_launchers_limit(margin_s: float = 15.0) -> None:
    """Where the job sits if it hangs: with ``MPIEXEC_TIMEOUT`` set (the launcher ends the job
    after that many seconds, silently), every thread's Python stack is written to stderr
    ``margin_s`` before then (``faulthandler``, which needs neither the interpreter lock's owner
    nor the watchdog). A job that ends in time prints nothing."""
    import faulthandler

    limit = os.environ.get("MPIEXEC_TIMEOUT", "")
    try:
        seconds = float(limit) - margin_s - process_age_s()
    except ValueError:
        return
    if seconds > 1:
        faulthandler.dump_traceback_later(seconds, exit=False)


def run_scenarios(namespace: dict, argv: list[str] | None = None, **iris_options) -> None:
    """Worker entry point: run the ``scenario_*`` functions of ``namespace`` named in ``argv``
    (all of them when none is named) on one :class:`~iris.runtime.Iris`, each followed by a
    barrier. Rank 0 prints ``PASS name (seconds)`` for each."""
    import iris.runtime

    argv = sys.argv[1:] if argv is None else argv
    scenarios: dict[str, Callable] = {
        name[len(SCENARIO_PREFIX):]: fn for name, fn in namespace.items()
        if name.startswith(SCENARIO_PREFIX) and callable(fn)
    }
    names = argv or list(scenarios)
    unknown = [n for n in names if n not in scenarios]
    if unknown:
        raise SystemExit(f"unknown scenario(s) {unknown}; known: {sorted(scenarios)}")
    iris_options.setdefault("heap_size", 1 << 26)
    dump_stacks_before_the_launchers_limit()
    timed = bool(os.environ.get(TIMINGS_ENV))
    clock = CompileClock() if timed else None
    ctx = iris.runtime.iris(**iris_options)
    row = {"worker": os.path.basename(sys.argv[0]), "ranks": ctx.world_size, "startup_s": round(process_age_s(), 2),
           "scenarios": [], "pid": os.getpid()}
    for name in names:
        start = time.monotonic()
        before = clock.reading() if clock else (0.0, 0, 0)
        if timed and ctx.rank == 0:
            # as it starts, not only at the job's end: a job cut by a deadline (or stuck) still
            # tells which scenario it was in and since when (tools/suite_timings.py)
            record_timing("progress", {"worker": row["worker"], "ranks": ctx.world_size, "pid": row["pid"],
                                       "scenario": name, "at_s": round(process_age_s(), 2)})
        try:
            scenarios[name](ctx)
        except BaseException as exc:
            # Said on stdout first, and a moment given to the launcher: the job's abort that follows
            # the traceback can end it before a rank's stderr is forwarded (seen with MPICH: a check's
            # message lost, only "Abort(1)" left).
            print(f"FAIL {name} on rank {ctx.rank}/{ctx.world_size}: {type(exc).__name__}: {exc}", flush=True)
            time.sleep(0.2)
            raise RuntimeError(f"scenario {name!r} failed on rank {ctx.rank}/{ctx.world_size}: {exc}") from exc
        ctx.barrier()
        seconds = time.monotonic() - start
        if ctx.rank == 0:
            print(f"PASS {name} ({seconds:.2f} s, {ctx.world_size} ranks, {ctx.backend})", flush=True)
            if clock:
                after = clock.reading()
                row["scenarios"].append([name, round(seconds, 2), round(after[0] - before[0], 2),
                                         after[1] - before[1], after[2] - before[2]])
    start = time.monotonic()
    ctx.close()
    if timed and ctx.rank == 0:
        row["close_s"] = round(time.monotonic() - start, 2)
        row["compile_clock"] = clock.available
        record_timing("workers", row)
