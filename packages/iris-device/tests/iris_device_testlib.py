"""Helpers shared by the iris-device tests (a uniquely named module: the tests of every package
run in one pytest session, and test folders have no ``__init__.py``).

Everything that runs kernels runs in a child process with a known mode: compiled for the GPU
(``TRITON_INTERPRET`` unset), interpreted, or several MPI ranks. The pytest process itself may
have either mode, depending on which tests imported ``iris.runtime`` before.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parents[2]


def _package_root(name: str) -> str | None:
    # The folder above the "iris" namespace that holds ``name``, found without importing it (an
    # import would fix iris.device's kernels in this process's mode).
    try:
        spec = importlib.util.find_spec(name)
    except ModuleNotFoundError:
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return str(Path(next(iter(spec.submodule_search_locations))).parents[1])


def child_env(interpret: bool | None, debug: bool = False, **extra: str) -> dict[str, str]:
    """Environment for a child process: the iris packages this process sees on its path, Triton's
    interpreter on (True), off (False: kernels compiled for a GPU, even where there is none) or as
    inherited (None), IRIS_DEBUG as asked."""
    env = dict(os.environ)
    roots = [r for r in (_package_root("iris.device"), _package_root("iris.runtime")) if r]
    roots += [str(REPO / "packages" / p / "src") for p in ("iris-device", "iris-runtime")]
    roots.append(str(TESTS))  # the workers import the shared kernels of this folder
    seen: list[str] = []
    for path in roots + env.get("PYTHONPATH", "").split(os.pathsep):
        if path and path not in seen:
            seen.append(path)
    env["PYTHONPATH"] = os.pathsep.join(seen)
    env["PYTHONUNBUFFERED"] = "1"
    # An explicit "0": without TRITON_INTERPRET, iris.device picks the interpreter where no GPU is.
    if interpret is not None:
        env["TRITON_INTERPRET"] = "1" if interpret else "0"
    # Explicit values (not removals): run_ranks lays this over os.environ.
    env["IRIS_DEBUG"] = "1" if debug else "0"
    env["TRITON_DEBUG"] = "1" if debug else "0"
    env.update(extra)
    return env


def rank_env(debug: bool = False) -> dict[str, str]:
    """What ``iris.runtime.testing.run_ranks`` should lay over ``os.environ`` for the workers."""
    full = child_env(interpret=None, debug=debug)
    return {k: full[k] for k in ("PYTHONPATH", "IRIS_DEBUG", "TRITON_DEBUG")}


def run_python(args: list[str], env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess:
    """Run ``python args...``; fail the test with the child's output unless it exits 0."""
    proc = subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env, timeout=timeout,
                          cwd=str(TESTS))
    if proc.returncode != 0:
        raise AssertionError(f"python {' '.join(args)} exited {proc.returncode}\n--- stdout\n{proc.stdout}\n"
                             f"--- stderr\n{proc.stderr}")
    return proc


def run_json_script(script: str, *args: str, env: dict[str, str], timeout: float = 300) -> dict:
    """Run a checking script of this folder that prints one JSON object as its last line."""
    proc = run_python([str(TESTS / script), *args], env=env, timeout=timeout)
    last = proc.stdout.strip().splitlines()[-1]
    return json.loads(last)


def spec_path() -> Path | None:
    """The seed spec: ``$IRIS_SPEC``, else ``../shared/seed/device-context-spec.txt`` next to the
    checkout. None when absent (the spec is not part of the repository)."""
    candidates = [os.environ.get("IRIS_SPEC")] if os.environ.get("IRIS_SPEC") else []
    candidates.append(str(REPO.parent / "shared" / "seed" / "device-context-spec.txt"))
    for candidate in candidates:
        if Path(candidate).is_file():
            return Path(candidate)
    return None


def backend() -> str:
    """The backend the ranks will use: ``IRIS_BACKEND`` when it names one, else what ``auto`` picks."""
    requested = os.environ.get("IRIS_BACKEND", "auto")
    if requested in ("cpu", "cuda", "nvshmem"):
        return requested
    import torch

    return "cuda" if torch.cuda.is_available() and torch.cuda.device_count() > 0 else "cpu"
