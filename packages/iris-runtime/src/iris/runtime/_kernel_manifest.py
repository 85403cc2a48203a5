"""A kernel manifest: every Triton compilation a run asked for, written down so that a fresh machine
can compile them all at once, on all its cores, before (or while) the program needs them.

A job compiles its kernels one after the other as it first launches each: on a fresh machine a
test suite or an application with hundreds of kernel variants spends minutes of one core per job
in the compiler while the other cores idle. ``IRIS_KERNEL_RECORD=<folder>`` makes every process
append what it asks Triton to compile (the ``@triton.jit`` function by module and name, the
signature, the compile-time constants, the specialisation attributes, the options and the target)
to a file of its own in the folder; ``python -m iris.runtime.precompile --merge <folder> <file>``
joins the records into one manifest, and ``python -m iris.runtime.precompile <file>`` compiles
its kernels in parallel into Triton's cache, where the program then finds them.

What is recorded is the kernel's specialisation, not its code: the source is read again when the
manifest is compiled, so a manifest stays useful while kernel bodies change. An entry whose
function or parameters no longer exist is counted as stale and left out.
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import importlib
import importlib.util
import json
import os
import sys
import threading
import time

RECORD_ENV = "IRIS_KERNEL_RECORD"
MANIFEST_VERSION = 1

_LOCK = threading.Lock()


class Unrecordable(Exception):
    """A value of a compilation this format cannot write down (the entry is not recorded)."""


# -- values: JSON with the Python types that Triton's cache key tells apart kept apart ----------

def encode(value):
    """``value`` as JSON data that :func:`decode` turns back into an equal value of the same type
    (tuples stay tuples: Triton's cache key is built from ``str()`` of these values)."""
    from triton import language as tl
    from triton.runtime.jit import JITFunction

    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, list):
        return [encode(v) for v in value]
    if isinstance(value, tuple):
        return {"tuple": [encode(v) for v in value]}
    if isinstance(value, dict):
        return {"dict": [[encode(k), encode(v)] for k, v in value.items()]}
    if isinstance(value, tl.dtype) and type(value) is tl.dtype:
        return {"dtype": value.name}
    if isinstance(value, JITFunction):
        return {"jit": function_address(value)}
    raise Unrecordable(f"{type(value).__name__} value {value!r}")


def decode(data):
    """The value :func:`encode` wrote."""
    from triton import language as tl

    if isinstance(data, list):
        return [decode(v) for v in data]
    if not isinstance(data, dict):
        return data
    if "tuple" in data:
        return tuple(decode(v) for v in data["tuple"])
    if "dict" in data:
        return {decode(k): decode(v) for k, v in data["dict"]}
    if "dtype" in data:
        return tl.dtype(data["dtype"])
    if "jit" in data:
        return load_function(data["jit"])
    raise ValueError(f"kernel manifest: unknown value {data!r}")


# -- functions: found again by module, by file, by qualified name ------------------------------

def function_address(fn) -> dict:
    """Where ``fn`` (a ``@triton.jit`` function) is found again: its module, its file (relative to
    the working directory when inside it: test helpers are modules only on their test's path) and
    its qualified name."""
    inner = fn.fn
    path = os.path.abspath(inner.__code__.co_filename)
    here = os.getcwd()
    if path.startswith(here + os.sep):
        path = os.path.relpath(path, here)
    return {"module": fn.__module__, "file": path, "name": inner.__qualname__}


def load_function(address: dict):
    """The ``@triton.jit`` function at ``address``: imported by module name, else loaded from its
    file (once per process)."""
    name = address["module"]
    if name == "__main__":  # a script's kernel: load the script as a module (its main guard holds)
        name = "iris_manifest_script_" + hashlib.sha256(address["file"].encode()).hexdigest()[:12]
        module = sys.modules.get(name) or _load_file(name, address["file"])
    else:
        module = sys.modules.get(name)
    if module is None:
        try:
            module = importlib.import_module(name)
        except ImportError:
            module = _load_file(name, address["file"])
    obj = module
    for part in address["name"].split("."):
        obj = getattr(obj, part)
    return obj


def _load_file(name: str, path: str):
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"no module {name} and no file {path}")
    directory = os.path.dirname(os.path.abspath(path))
    if directory not in sys.path:  # its own imports of neighbouring test helpers
        sys.path.insert(0, directory)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


# -- recording ----------------------------------------------------------------------------------

def entry(src, target, options) -> dict:
    """One compilation as manifest data (raises :class:`Unrecordable`)."""
    return {
        "function": function_address(src.fn),
        "signature": encode(dict(src.signature)),
        "constants": encode(dict(src.constants)),
        "attrs": encode(dict(src.attrs)),
        "target": encode((target.backend, target.arch, target.warp_size)) if target is not None else None,
        "options": encode(dict(options or {})),
    }


def entry_key(data: dict) -> str:
    """A name for an entry: equal entries (the same kernel specialisation) have the same key."""
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:24]


def record(src, target, options, folder: str | None = None) -> bool:
    """Append the compilation of ``src`` to this process's file in ``folder`` (default
    ``$IRIS_KERNEL_RECORD``); returns whether it was recorded. Only ``@triton.jit`` sources
    (``ASTSource``) are recorded; a value the format cannot write leaves the entry out."""
    folder = folder or os.environ.get(RECORD_ENV, "")
    if not folder or not hasattr(src, "fn") or not hasattr(src, "constants"):
        return False
    try:
        # the time first: merge puts the entries of every process in the order they were first
        # compiled, which is the order a precompile should follow (the run's first kernels first)
        line = f"{time.time():.3f} " + json.dumps(entry(src, target, options), sort_keys=True)
    except (Unrecordable, TypeError, AttributeError):
        return False
    os.makedirs(folder, exist_ok=True)
    with _LOCK, open(os.path.join(folder, f"{os.getpid()}.jsonl"), "a") as out:
        out.write(line + "\n")
    return True


def merge(folder: str) -> list[dict]:
    """Every entry recorded in ``folder``'s files, each once, in the order first recorded across
    all the processes (a line without its time, as written before the time was recorded, counts
    as recorded at its process's start)."""
    first: dict[str, tuple[float, int, dict]] = {}
    for name in sorted(os.listdir(folder)):
        if not name.endswith(".jsonl"):
            continue
        with open(os.path.join(folder, name)) as f:
            for line in f:
                when, _, text = line.strip().partition(" ")
                try:
                    stamp = float(when)
                except ValueError:
                    stamp, text = 0.0, line.strip()
                if not text:
                    continue
                try:
                    data = json.loads(text)
                except json.JSONDecodeError:  # a process killed mid-line
                    continue
                key = entry_key(data)
                if key not in first or stamp < first[key][0]:
                    first[key] = (stamp, first[key][1] if key in first else len(first), data)
    return [data for _, _, data in sorted(first.values(), key=lambda item: (item[0], item[1]))]


def write(entries: list[dict], path: str) -> None:
    """The manifest file: entries with their (few distinct) options and targets in tables."""
    tables = {"options": [], "target": []}
    kernels = []
    for data in entries:
        row = dict(data)
        for field, table in tables.items():
            text = json.dumps(data[field], sort_keys=True)
            texts = [json.dumps(t, sort_keys=True) for t in table]
            if text not in texts:
                table.append(data[field])
                texts.append(text)
            row[field] = texts.index(text)
        kernels.append(row)
    with _open(path, "w") as out:
        json.dump({"version": MANIFEST_VERSION, **tables, "kernels": kernels}, out, indent=0, sort_keys=True)
        out.write("\n")


def _open(path: str, mode: str):
    """A manifest file; gzip-compressed when its name ends in ``.gz`` (a suite's manifest of thousands of
    kernels is some megabytes of JSON, a twentieth of that compressed)."""
    return gzip.open(path, mode + "t") if path.endswith(".gz") else open(path, mode)


def read(path: str) -> list[dict]:
    """The entries of a manifest file written by :func:`write`."""
    with _open(path, "r") as f:
        data = json.load(f)
    if data.get("version") != MANIFEST_VERSION:
        raise ValueError(f"kernel manifest {path}: version {data.get('version')}, this reader knows "
                         f"{MANIFEST_VERSION}; record it again")
    return [{**k, "options": data["options"][k["options"]], "target": data["target"][k["target"]]}
            for k in data["kernels"]]


_RECORDER_INSTALLED = False


def install_recorder_from_env(backend: str) -> bool:
    """With ``IRIS_KERNEL_RECORD`` set and kernels compiled (not the cpu backend, whose
    interpreter compiles nothing), wrap ``triton.compiler.compile`` so that each compilation it is
    asked for is recorded first; returns whether the recorder is installed."""
    global _RECORDER_INSTALLED
    if _RECORDER_INSTALLED:
        return True
    if not os.environ.get(RECORD_ENV) or backend == "cpu":
        return False
    import functools

    import triton.compiler as compiler

    original = compiler.compile

    @functools.wraps(original)
    def compile_and_record(src, target=None, options=None, _env_vars=None):
        record(src, target, options)
        return original(src, target=target, options=options, _env_vars=_env_vars)

    compiler.compile = compile_and_record
    _RECORDER_INSTALLED = True
    return True


# -- compiling ----------------------------------------------------------------------------------

def source_of(data: dict):
    """The ``ASTSource``, target and options of an entry, rebuilt from the current code."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    fn = load_function(data["function"])
    source = ASTSource(fn, decode(data["signature"]), decode(data["constants"]), decode(data["attrs"]))
    target = GPUTarget(*decode(data["target"])) if data["target"] is not None else None
    return source, target, _local_extern_libs(decode(data["options"]))


def _local_extern_libs(options: dict) -> dict:
    """``options`` with each external library (``libdevice``) that is not at its recorded path taken
    from this Triton's own copy of the same file: the recording machine's Triton may live in another
    folder (another virtual environment), and a path that does not exist here fails the compile.
    Triton's cache key holds the library's contents, not its path, so the entry compiled is the one
    the program will look for."""
    libs = options.get("extern_libs") if isinstance(options, dict) else None
    if not libs:
        return options
    return {**options, "extern_libs": tuple((name, _local_library(path)) for name, path in libs)}


@functools.cache
def _local_library(path: str) -> str:
    # ``path`` where it exists, else the file of its name under this Triton's backends (found once
    # per path: a manifest's thousands of entries name the same library)
    if os.path.exists(path):
        return path
    import triton

    here = os.path.join(os.path.dirname(triton.__file__), "backends")
    base = os.path.basename(path)
    found = [os.path.join(root, base) for root, _, files in os.walk(here) if base in files]
    return found[0] if found else path


def compile_entry(data: dict) -> str:
    """Compile one entry into Triton's cache: ``"compiled"`` (``"compiled, launcher built"`` where
    its C launcher was built too), or ``"stale: <why>"`` when the code no longer has the function
    or its parameters changed."""
    import triton.compiler as compiler  # the module's attribute: with IRIS_COMPILE_LOCK, the locked one

    try:
        source, target, options = source_of(data)
    except Exception as exc:  # a manifest older than the code: say so, go on
        return f"stale: {type(exc).__name__}: {exc}"
    try:
        kernel = compiler.compile(source, target=target, options=options)
    except Exception as exc:  # e.g. a parameter renamed since the recording
        return f"stale: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    return "compiled, launcher built" if _build_launcher(source, kernel) else "compiled"


def _build_launcher(source, kernel) -> bool:
    """Build the kernel's host launcher into Triton's cache too, where the Triton version compiles a
    C launcher per kernel signature with the system's C compiler (Triton 3.6: a second or two of
    ``gcc`` at a kernel's first launch, which a job would otherwise spend; later versions launch
    through one generic launcher and have nothing to build). Needs the CUDA driver library, not a
    GPU context; where it is missing (a machine without a GPU) the launcher is left to the first
    launch, as without a manifest. Returns whether one was built (or found in the cache)."""
    try:
        from triton.backends.nvidia import driver as nvidia_driver
    except ImportError:
        return False
    if not hasattr(nvidia_driver, "make_launcher") or getattr(kernel, "metadata", None) is None:
        return False
    try:
        nvidia_driver.CudaLauncher(source, kernel.metadata)
    except Exception:  # no libcuda here, or another Triton's launcher: the first launch builds it
        return False
    return True
