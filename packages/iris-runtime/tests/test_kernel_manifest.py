"""The kernel manifest (``IRIS_KERNEL_RECORD``, ``python -m iris.runtime.precompile``): what one process
compiled is compiled again by another, on a fresh cache, into the very cache entry the first one
made, so that a program finds it there. Compiles for sm_90 with Triton's own ptxas: no GPU needed."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import textwrap

KERNELS = '''
import triton
import triton.language as tl


@triton.jit
def twice(x):
    return x * 2


@triton.jit
def scale_kernel(src, dst, n, BLOCK: tl.constexpr, DTYPE: tl.constexpr, FN: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(src + offsets, mask=mask).to(DTYPE)
    tl.store(dst + offsets, FN(x), mask=mask)
'''

# What a launch hands Triton: the source with its specialisation (a dtype and a function among the
# constants, tuples in the attributes) and every option, as the JIT passes them.
COMPILE = '''
import sys
sys.path.insert(0, {folder!r})
import iris.runtime  # installs the recorder (IRIS_KERNEL_RECORD)
import triton
import triton.compiler as compiler
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, make_backend
import manifest_kernels as K

target = GPUTarget("cuda", 90, 32)
options = make_backend(target).parse_options({{"num_warps": 4}}).__dict__
source = ASTSource(K.scale_kernel, {{"src": "*fp32", "dst": "*fp32", "n": "i32", "BLOCK": "constexpr",
                                     "DTYPE": "constexpr", "FN": "constexpr"}},
                   {{(3,): 256, (4,): tl.float32, (5,): K.twice}}, {{(0,): [["tt.divisibility", 16]]}})
compiler.compile(source, target=target, options=options)
'''


def run(args, env, cwd):
    result = subprocess.run([sys.executable, *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def test_a_recorded_kernel_is_compiled_again_into_the_same_cache_entry(tmp_path):
    (tmp_path / "manifest_kernels.py").write_text(textwrap.dedent(KERNELS))
    (tmp_path / "compile_one.py").write_text(COMPILE.format(folder=str(tmp_path)))
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "IRIS_COMPILE_LOCK")}
    env.update(IRIS_BACKEND="cuda", IRIS_KERNEL_RECORD=str(tmp_path / "records"),
               TRITON_CACHE_DIR=str(tmp_path / "cache-first"))
    run([str(tmp_path / "compile_one.py")], env, tmp_path)
    assert os.listdir(tmp_path / "records"), "the compilation was not recorded"

    manifest = tmp_path / "kernels.json.gz"  # compressed: the name says so
    out = run(["-m", "iris.runtime.precompile", "--merge", str(tmp_path / "records"), str(manifest)], env, tmp_path)
    assert "1 kernels recorded" in out, out
    data = json.loads(gzip.decompress(manifest.read_bytes()))
    assert data["kernels"][0]["function"]["name"] == "scale_kernel"

    # A stale entry (a function the code no longer has) is counted and skipped, not fatal.
    stale = dict(data["kernels"][0], function=dict(data["kernels"][0]["function"], name="renamed_kernel"))
    data["kernels"].append(stale)
    manifest.write_bytes(gzip.compress(json.dumps(data).encode()))

    env.pop("IRIS_KERNEL_RECORD")
    env["TRITON_CACHE_DIR"] = str(tmp_path / "cache-fresh")
    out = run(["-m", "iris.runtime.precompile", str(manifest), "--jobs", "2"], env, tmp_path)
    assert "2 kernels" in out and "1 compiled or found in the cache, 1 stale" in out, out
    assert "renamed_kernel" in out, out
    # The same cache entry as the first process's compilation: a launch of that kernel finds it.
    first, fresh = (set(os.listdir(tmp_path / name)) for name in ("cache-first", "cache-fresh"))
    assert first == fresh, (first, fresh)


def test_merge_orders_the_entries_by_their_first_compilation_across_processes(tmp_path):
    """A precompile follows the manifest's order, so the run's first kernels must come first
    whichever process compiled them; an entry compiled by several processes counts once, at its
    earliest time, and a line without a time (an older record) at its process's start."""
    from iris.runtime import _kernel_manifest as manifest

    def line(when, name):
        text = json.dumps({"function": {"name": name}}, sort_keys=True)
        return text if when is None else f"{when:.3f} {text}"

    folder = tmp_path / "records"
    folder.mkdir()
    (folder / "100.jsonl").write_text("\n".join([line(20.0, "c"), line(40.0, "e"), line(21.0, "a")]) + "\n")
    (folder / "200.jsonl").write_text("\n".join([line(10.0, "a"), line(30.0, "d"), '{"trunc']) + "\n")
    (folder / "300.jsonl").write_text(line(None, "old") + "\n")
    names = [entry["function"]["name"] for entry in manifest.merge(str(folder))]
    assert names == ["old", "a", "c", "d", "e"], names
