"""One compilation per kernel per machine when many processes start at once (``IRIS_COMPILE_LOCK=1``).

The ranks of a job run the same program, so each of them JIT-compiles the same kernels at the
same moment: a job of 8 ranks on one machine does each compilation 8 times, on 8 cores, and a
machine that runs several jobs side by side (a GPU test suite) spends most of its CPU compiling
the same thing again. With the lock, Triton's ``compile`` first takes an exclusive ``flock`` on a
file named after the kernel (its source hash, options and target) beside Triton's cache: the
first process compiles and writes the cache, the others wait for the lock and then find the
kernel in the cache. Different kernels do not wait for each other. ``flock`` locks go with the
process that holds them, so a rank that dies while compiling leaves no stale lock.

Off by default: a single job on an idle machine compiles in parallel on idle cores anyway, and
the lock makes the ranks wait in turn for what is not cached yet.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import os

_INSTALLED = False


def lock_key(src, target, options) -> str:
    """A name for one compilation: the source's hash, the options and the target (what Triton's own
    cache key is made of, less the environment, which the processes of one job share)."""
    source = src.hash() if hasattr(src, "hash") else repr(src)
    text = f"{source}|{sorted((options or {}).items())!r}|{target!r}"
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def lock_folder() -> str:
    from triton import knobs

    base = knobs.cache.dir or os.path.join(os.path.expanduser("~"), ".triton", "cache")
    return os.path.join(base, "iris-compile-locks")


def install() -> bool:
    """Wrap ``triton.compiler.compile`` with the lock (once); returns whether it is installed."""
    global _INSTALLED
    if _INSTALLED:
        return True
    import triton.compiler as compiler

    original = compiler.compile

    @functools.wraps(original)
    def compile_once(src, target=None, options=None, _env_vars=None):
        folder = lock_folder()
        os.makedirs(folder, exist_ok=True)
        fd = os.open(os.path.join(folder, lock_key(src, target, options)), os.O_CREAT | os.O_RDWR, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            return original(src, target=target, options=options, _env_vars=_env_vars)
        finally:
            os.close(fd)  # releases the lock

    compiler.compile = compile_once
    _INSTALLED = True
    return True


def install_from_env(backend: str) -> bool:
    """Install the lock when ``IRIS_COMPILE_LOCK=1`` and kernels are compiled (not the cpu
    backend, whose interpreter compiles nothing)."""
    if os.environ.get("IRIS_COMPILE_LOCK", "") in ("", "0") or backend == "cpu":
        return False
    return install()
