"""The public surface of iris.collectives, without launching ranks: the spec's names and
signatures, the host helpers' arithmetic, errors, and the package boundary."""

from __future__ import annotations

import inspect
import os
import subprocess
import sys

import pytest

import iris.collectives as ic
import iris.device
from iris.collectives import IrisWaitTimeoutError

# The spec's bound signatures (after self), in order, with defaults.
SPEC = {
    "all_reduce_atomic": ["tile", "dst_view"],
    "all_reduce_spinlock": ["tile", "dst_view", "locks"],
    "all_reduce_one_shot": ["tile", "src_view", "dst_view", "locks"],
    "all_reduce_ring": ["tile", "src_view", "dst_view"],
    "all_reduce_two_shot": ["tile", "src_view", "dst_view", "locks"],
    "all_gather": ["tile", "dst_view", "dim"],
    "gather": ["tile", "src_view", "source_rank", "hint=None"],
    "all_to_all": ["tile", "src_view", "dst_view", "N_per_rank"],
    "reduce_scatter": ["tile", "src_view", "dst_view", "locks"],
}


def params(fn) -> list[str]:
    fn = getattr(fn, "fn", fn)  # JITFunction -> the Python function
    out = []
    for p in inspect.signature(fn).parameters.values():
        out.append(p.name if p.default is inspect.Parameter.empty else f"{p.name}={p.default!r}")
    return out


@pytest.mark.parametrize("name", sorted(SPEC))
def test_bound_and_free_forms_have_the_spec_signature(name):
    # the spec's parameters, in its order, then this library's group= (a group of ranks, None: all)
    assert params(getattr(ic.DeviceContext, name))[1:] == [*SPEC[name], "group=None"]
    assert params(getattr(ic, name)) == ["ctx", *SPEC[name], "group=None"]
    assert getattr(ic, name).__doc__ if not hasattr(getattr(ic, name), "fn") else getattr(ic, name).fn.__doc__


def test_context_has_every_device_method_and_the_spec_initialize():
    device_methods = {n for n in dir(iris.device.DeviceContext) if not n.startswith("_")}
    missing = device_methods - set(dir(ic.DeviceContext))
    assert not missing, missing
    assert params(ic.DeviceContext.initialize) == ["context_tensor", "rank", "world_size", "tracing=False"]


def test_all_is_sorted_complete_and_documented():
    assert set(ic.__all__) == {n for n in ic.__all__ if hasattr(ic, n)}
    for name in ("Tile", "TileView", "TensorView", "device_barrier", "lock_words", "DeviceContext"):
        assert name in ic.__all__
        obj = getattr(ic, name)
        assert (getattr(obj, "fn", None) or obj).__doc__


def test_tile_counts_and_lock_sizes():
    assert ic.num_tiles(130, 257, 64, 64) == 3 * 5
    assert ic.num_tiles(5, 7, 16, 32) == 1
    assert ic.lock_words(130, 257, 64, 64) == 15 * ic.LOCK_WORDS
    assert ic.barrier_words(6) == 6 * ic.BARRIER_WORDS
    with pytest.raises(iris.device.IrisUsageError, match=r"lock_words\(10, 0, 8, 8\).*N=0"):
        ic.lock_words(10, 0, 8, 8)


@pytest.mark.parametrize("tiles", [1, 2, 3, 7, 15, 64])
@pytest.mark.parametrize("world", [1, 2, 3, 4, 8])
def test_owners_partition_the_tiles(tiles, world):
    owned = [list(ic.reduce_scatter_tiles(r, tiles, world)) for r in range(world)]
    assert sorted(t for ts in owned for t in ts) == list(range(tiles))
    for r, ts in enumerate(owned):
        assert ts == sorted(ts) and all(t * world // tiles == r for t in ts)  # contiguous, device rule



@pytest.mark.parametrize("block_m", [1, 2, 3, 8, 16])
@pytest.mark.parametrize("world", [1, 2, 3, 4, 8])
def test_two_shot_shares_partition_every_tile(block_m, world):
    for tile_id in range(2 * world):
        shares = [list(ic.two_shot_rows(tile_id, block_m, world, r)) for r in range(world)]
        assert sorted(row for rows in shares for row in rows) == list(range(block_m)), (tile_id, shares)
        assert all(rows == list(range(rows[0], rows[-1] + 1)) for rows in shares if rows)  # contiguous
    # rotated with the tile: with more ranks than rows, the empty shares move between ranks
    if block_m < world:
        assert {r for t in range(world) for r in range(world) if not ic.two_shot_rows(t, block_m, world, r)} == \
            set(range(world))
    with pytest.raises(iris.device.IrisUsageError, match=r"two_shot_rows.*rank=5.*\[0, 4\)"):
        ic.two_shot_rows(0, 8, 4, 5)


def test_errors_belong_to_the_iris_hierarchy():
    assert issubclass(IrisWaitTimeoutError, iris.device.IrisError)
    assert issubclass(IrisWaitTimeoutError, RuntimeError)


def test_ring_capacity_matches_the_signal_pad():
    from iris.device import _layout

    # the ring's records (the four flag words of a lock record, in either mode) fill the pad up to
    # the watchdog's reserved words
    assert ic.RING_MAX_TILES * ic._sync.FLAG_WORDS * 4 == _layout.SIGNAL_PAD_BYTES - _layout.PAD_RESERVED_BYTES


def test_lock_records_grow_only_in_debug_mode():
    # production lock arrays keep their size; debug mode adds each call's signature to a record
    code = "import iris.collectives as ic; print(ic.LOCK_WORDS, ic.lock_words(16, 16, 8, 8), ic.RING_MAX_TILES)"
    sizes = {}
    for debug in ("0", "1"):
        env = dict(os.environ, IRIS_BACKEND="cpu", IRIS_DEBUG=debug)
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
        assert proc.returncode == 0, proc.stderr
        sizes[debug] = proc.stdout.split()
    assert sizes["0"][:2] == ["4", "16"] and sizes["1"][:2] == ["16", "64"], sizes
    assert sizes["0"][2] == sizes["1"][2], sizes


def test_iris_device_does_not_import_collectives():
    code = "import iris.device, sys; assert 'iris.collectives' not in sys.modules; print('ok')"
    env = dict(os.environ, IRIS_BACKEND="cpu", TRITON_INTERPRET="1")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stderr


def test_every_waiting_call_is_named_in_the_watchdog_reports():
    # A wait whose call name is not in WAIT_CALLS is reported as "an iris wait": every module of
    # this package that passes its CALL to a wait must have it registered in iris.device.
    import importlib
    import pkgutil

    import iris.collectives.ops
    from iris.device._watchdog import WAIT_CALLS

    waiting = []
    for package in (ic, iris.collectives.ops):
        for info in pkgutil.iter_modules(package.__path__):
            module = importlib.import_module(f"{package.__name__}.{info.name}")
            source = inspect.getsource(module)
            if isinstance(getattr(module, "CALL", None), str) and "CALL_C," in source.replace(" ", ""):
                waiting.append(module.CALL)
    assert "iris.collectives.ops.all_gather_matmul" in waiting, waiting  # the scan finds what it must
    # the host collectives' pull kernel names its waits by mode; reduce and point to point their own
    from iris.collectives.ccl import _kernels as ccl_kernels
    from iris.collectives.ccl import _p2p_kernels

    assert "iris.collectives.wait_signal" in waiting, waiting
    from iris.collectives.ccl import _exchange_kernels

    waiting += [*ccl_kernels.PULL_CALLS, ccl_kernels.REDUCE_CALL.value, *_p2p_kernels.P2P_CALLS,
                *_exchange_kernels.EXCHANGE_CALLS]
    assert [c for c in waiting if c not in WAIT_CALLS] == []


def constexpr_assignments_in_loops(root: str) -> list[str]:
    """``name: tl.constexpr = ...`` inside a loop in the Python files under ``root``: Triton's
    compiler refuses the second assignment once the loop unrolls (the interpreter does not)."""
    import ast

    found = []
    for folder, _, files in os.walk(root):
        for name in sorted(f for f in files if f.endswith(".py")):
            path = os.path.join(folder, name)
            with open(path, encoding="utf-8") as f:
                tree = ast.parse(f.read(), path)
            for loop in ast.walk(tree):
                if isinstance(loop, (ast.For, ast.While)):
                    found += [f"{path}:{node.lineno}: {ast.unparse(node)}" for node in ast.walk(loop)
                              if isinstance(node, ast.AnnAssign) and "constexpr" in ast.unparse(node.annotation)]
    return sorted(set(found))


def test_no_constexpr_is_assigned_in_a_loop():
    # all_gather_matmul's arrival strategy did this; it ran under the interpreter and compiled at
    # two ranks, and failed to compile at four on the GPU.
    assert constexpr_assignments_in_loops(os.path.dirname(ic.__file__)) == []


def test_the_loop_check_finds_a_constexpr_assigned_in_a_loop(tmp_path):
    (tmp_path / "k.py").write_text("def k(n):\n    for i in range(n):\n        p: tl.constexpr = i\n")
    assert constexpr_assignments_in_loops(str(tmp_path)) == [f"{tmp_path / 'k.py'}:3: p: tl.constexpr = i"]
