"""iris.collectives.ccl's host side alone (no ranks, no kernels): the selection table and
``choose``, workspace capacities, and the direct GPU launch path driven with stand-ins."""

from __future__ import annotations

import json
import logging
import os
import re
import types

import pytest
import torch

from iris.collectives import ccl
from iris.collectives.ccl import _launch, _table
from iris.runtime import IrisUsageError


def _table_files():
    return sorted(name for name in os.listdir(_table.TABLES_DIR) if name.endswith(".json"))


def test_the_table_is_data_and_every_row_is_valid():
    required = {"backend", "collective", "max_bytes", "dtype", "world_size", "config"}
    files = _table_files()
    assert _table.FALLBACK_FILE in files and len(files) >= 2, files  # the fallback and a measured card
    for name in files:
        data = _table.read(os.path.join(_table.TABLES_DIR, name))
        card = name != _table.FALLBACK_FILE
        # a card's file is named after the card (torch.cuda.get_device_name) and says its capability
        assert set(data) == ({"device", "capability", "rows"} if card else {"rows"}), (name, set(data))
        if card:
            assert _table.file_name(data["device"]) == name and re.fullmatch(r"sm_\d+", data["capability"]), data
        for row in data["rows"]:
            assert required <= set(row) <= required | {"ranks_per_gpu", "measured"}, (name, row)
            assert set(row["config"]) <= {"variant", "block", "width", "grid", "num_warps", "chunk", "heap_chunk"}, row
            # a card's rows are measured there, for a world size and ranks per GPU; the fallback's
            # hold for any world size and any card
            assert ("measured" in row) == card and (row["world_size"] != 0) == card, (name, row)
            assert not card or (row.get("ranks_per_gpu", 0) >= 1 and data["device"] in row["measured"]), row
    for name in files:
        table, _ = _table.load(name[:-5] if name != _table.FALLBACK_FILE else None, None)
        # the fallbacks (any world size) come after every specific row: the first match wins
        fallback = [i for i, row in enumerate(table) if row["world_size"] == 0]
        assert fallback == list(range(len(table) - len(fallback), len(table))), (name, table)
        for backend in ("cpu", "cuda"):
            for coll in ccl.VARIANTS:
                for nbytes in (4, 4096, 1 << 20, (1 << 20) + 4, 1 << 30):
                    for world, per_gpu in ((2, 1), (2, 2), (4, 4), (8, 8), (3, 1)):
                        cfg = ccl.choose(coll, nbytes, "float32", world, backend, table=table, ranks_per_gpu=per_gpu)
                        assert cfg.variant in ccl.VARIANTS[coll] and cfg.block % cfg.width == 0, (coll, nbytes, cfg)


def test_the_table_files_hold_every_row_of_the_python_table_they_replaced():
    # tests/data/ccl_table_2026_12_05.json: ccl/_table.py's TABLE when the rows moved into JSON
    # files (the H200's measured rows, then the rows for any device). A re-measurement on the H200
    # (benchmarks/ccl.py --write-table) changes that file's rows: update this copy with it.
    with open(os.path.join(os.path.dirname(__file__), "data", "ccl_table_2026_12_05.json")) as f:
        before = json.load(f)
    table, source = _table.load("NVIDIA H200", "sm_90")
    assert len(table) == len(before) == 163 and table == before, source
    assert _table.OTHER_BACKENDS == [row for row in before if "measured" not in row]


@pytest.fixture
def on_card(monkeypatch):
    """``on_card(name, capability)``: the process's CUDA device as ``torch.cuda`` would name it;
    the table is looked up anew on the next call, and forgotten after the test."""
    saved = {k: vars(_table)[k] for k in ("TABLE", "SOURCE") if k in vars(_table)}

    def use(name, capability):
        monkeypatch.setattr(_table, "current_device", lambda: (name, capability))
        for k in ("TABLE", "SOURCE"):
            vars(_table).pop(k, None)

    yield use
    for k in ("TABLE", "SOURCE"):
        vars(_table).pop(k, None)
    vars(_table).update(saved)


def test_each_card_gets_its_own_table_else_one_of_its_compute_capability_else_the_fallback(on_card, caplog):
    h200 = _table.read(os.path.join(_table.TABLES_DIR, "NVIDIA_H200.json"))["rows"]
    fallback = _table.fallback_rows()
    # 8 ranks on one GPU, 64 KiB of bf16: the H200's table measured the buffered one-shot fastest
    call = ("all_reduce", 65536, "bfloat16", 8, "cuda")
    cases = [("NVIDIA H200", "sm_90", h200, "NVIDIA_H200.json (measured on this card)", "one_shot_buffered"),
             ("NVIDIA H100 80GB HBM3", "sm_90", h200, "NVIDIA_H200.json (borrowed: NVIDIA H100 80GB HBM3 has no",
              "one_shot_buffered"),
             ("NVIDIA A100-SXM4-80GB", "sm_80", [], "fallback.json (NVIDIA A100-SXM4-80GB, sm_80: no table of its",
              "one_shot")]
    for name, capability, own, source, variant in cases:
        on_card(name, capability)
        with caplog.at_level(logging.INFO, logger="iris"):
            assert ccl.choose(*call, ranks_per_gpu=8).variant == variant, name
        assert _table.TABLE == own + fallback and _table.TABLE[:len(own)] == own, name  # its rows first, in order
        assert ccl.table_source().startswith(source), ccl.table_source()
        assert f"selection table {ccl.table_source()}" in caplog.text, caplog.text  # said once, at INFO
        # the cpu backend searches the fallback rows whatever the card
        assert ccl.choose("all_reduce", 65536, "bfloat16", 8, "cpu", ranks_per_gpu=8) == \
            ccl.choose("all_reduce", 65536, "bfloat16", 8, "cpu", table=fallback, ranks_per_gpu=8)


def test_a_card_of_its_own_comes_before_a_borrowed_one_and_the_first_row_wins(tmp_path):
    def row(world, block, measured=True):
        extra = {"ranks_per_gpu": 1, "measured": "2026-12-06, a card"} if measured else {}
        return {"backend": "cuda", "collective": "*", "max_bytes": None, "dtype": "*", "world_size": world,
                **extra, "config": {"variant": None, "block": block, "width": 64, "num_warps": 4}}

    _table.write(str(tmp_path / "fallback.json"), [row(0, 256, False)])
    _table.write(str(tmp_path / "Card_A.json"), [row(2, 1024), row(2, 2048)], "Card A", "sm_100")
    _table.write(str(tmp_path / "Card_B_2.json"), [row(2, 4096)], "Card B/2", "sm_100")
    table, source = _table.load("Card B/2", "sm_100", str(tmp_path))
    assert [r["config"]["block"] for r in table] == [4096, 256] and source.startswith("Card_B_2.json (measured")
    table, source = _table.load("Card C", "sm_100", str(tmp_path))  # the first card of sm_100 by file name
    assert [r["config"]["block"] for r in table] == [1024, 2048, 256] and "borrowed" in source, source
    assert ccl.choose("all_gather", 64, "float32", 2, "cuda", table=table).block == 1024
    assert ccl.choose("all_gather", 64, "float32", 4, "cuda", table=table).block == 256
    table, source = _table.load("Card D", "sm_90", str(tmp_path))
    assert [r["config"]["block"] for r in table] == [256] and source.startswith("fallback.json (Card D, sm_90"), source


def test_without_cuda_the_table_is_the_fallback_and_cuda_is_never_asked(monkeypatch, on_card):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for name in ("current_device", "get_device_name", "get_device_capability", "init"):
        monkeypatch.setattr(torch.cuda, name, lambda *a, **k: pytest.fail("asked CUDA"))
    for k in ("TABLE", "SOURCE"):
        vars(_table).pop(k, None)
    assert ccl.choose("all_reduce", 4096, "float32", 2, "cpu").block == 1024  # the cpu row: no CUDA call
    assert "TABLE" not in vars(_table)  # the cuda table is looked up on first use only
    assert _table.current_device() == (None, None)
    assert ccl.table_source() == "fallback.json (no CUDA device)" and _table.TABLE == _table.fallback_rows()


def test_rows_measured_on_a_shared_gpu_do_not_apply_to_one_rank_per_gpu():
    shared = {"backend": "cuda", "collective": "all_reduce", "max_bytes": None, "dtype": "*", "world_size": 2,
              "ranks_per_gpu": 2, "config": {"variant": "two_shot", "block": 1024, "width": 64, "num_warps": 4},
              "measured": "a test"}
    fallback = {"backend": "cuda", "collective": "*", "max_bytes": None, "dtype": "*", "world_size": 0,
                "config": {"variant": None, "block": 8192, "width": 1024, "num_warps": 8}}
    table = [shared, fallback]
    assert ccl.choose("all_reduce", 64, "float32", 2, "cuda", table=table, ranks_per_gpu=2).block == 1024
    assert ccl.choose("all_reduce", 64, "float32", 2, "cuda", table=table, ranks_per_gpu=1).block == 8192
    assert ccl.choose("all_reduce", 64, "float32", 4, "cuda", table=table, ranks_per_gpu=2).block == 8192


def test_choose_takes_the_first_matching_row_and_the_callers_fields():
    table = [{"backend": "cuda", "collective": "all_reduce", "max_bytes": 1024, "dtype": "*", "world_size": 0,
              "config": {"variant": "one_shot", "block": 256, "width": 64, "num_warps": 2}},
             {"backend": "cuda", "collective": "*", "max_bytes": None, "dtype": "*", "world_size": 0,
              "config": {"variant": None, "block": 4096, "width": 1024, "num_warps": 8}}]
    small = ccl.choose("all_reduce", 1024, "float32", 2, "cuda", table=table)
    assert (small.variant, small.block, small.width, small.num_warps) == ("one_shot", 256, 64, 2)
    big = ccl.choose("all_reduce", 1025, "float32", 2, "cuda", ccl.Config(variant="two_shot", grid=3), table=table)
    assert (big.variant, big.block, big.grid, big.num_warps) == ("two_shot", 4096, 3, 8)
    assert ccl.choose("broadcast", 8, "bfloat16", 4, "cuda", table=table).variant == "pull"


@pytest.mark.parametrize("config, fragment", [
    (ccl.Config(variant="ring"), "config.variant='ring'"),
    (ccl.Config(block=100), "config.block=100"),
    (ccl.Config(block=64, width=128), "config.width=128"),
    (ccl.Config(grid=0), "config.grid=0"),
    ({"block": 64}, "must be an iris.collectives.ccl.Config"),
])
def test_choose_names_the_bad_field(config, fragment):
    with pytest.raises(IrisUsageError, match=r"iris\.collectives\.ccl\.all_reduce") as info:
        ccl.choose("all_reduce", 64, "float32", 2, "cpu", config)
    assert fragment in str(info.value)


def test_capacity_is_the_next_power_of_two():
    assert [_launch.capacity(t) for t in (1, 2, 3, 4, 5, 9)] == [1, 2, 4, 4, 8, 16]


def test_direct_launch_compiles_through_triton_once_then_calls_the_launcher(monkeypatch):
    import triton.runtime

    launches, triton_calls = [], []
    compiled = types.SimpleNamespace(run=lambda *a: launches.append(a), function="fn", packed_metadata="meta")

    class Kernel:
        params = [types.SimpleNamespace(name=n) for n in ("x", "n", "rank", "BLOCK")]

        def __getitem__(self, grid):
            def launch(*args, **options):
                triton_calls.append((grid, args, options))
                return compiled
            return launch

    monkeypatch.setattr(triton.runtime, "driver", types.SimpleNamespace(
        active=types.SimpleNamespace(get_current_stream=lambda index: 1000 + index)))
    options = {"rank": 1, "BLOCK": 64, "num_warps": 4}
    device = types.SimpleNamespace(index=2)
    # the plan's fixed arguments as integers: the tensor's address and n
    direct = _launch.DirectLaunch(Kernel(), 5, options, device, (4096, 10))
    assert direct.fast is None
    direct("x0", 10)  # compiles through Triton's launcher, then offers the fast launch
    assert triton_calls == [((5,), ("x0", 10), options)]
    direct.fast("out", "inp")
    direct.fast("out", "inp")
    assert len(triton_calls) == 1
    assert launches == [(5, 1, 1, 1002, "fn", "meta", None, None, None, 4096, 10, 1, 64)] * 2
    # root_last: the last argument is each call's own (broadcast's source rank)
    launches.clear()
    rooted = _launch.DirectLaunch(Kernel(), 5, options, device, (4096, 0), root_last=True)
    rooted("x0", 0)
    rooted.fast("out", "inp", 3)
    assert launches == [(5, 1, 1, 1002, "fn", "meta", None, None, None, 4096, 3, 1, 64)]


def test_the_fast_launch_calls_the_c_entry_only_where_its_layout_is_known(monkeypatch):
    import triton

    entry = object()
    run = types.SimpleNamespace(launch=entry, global_scratch_size=0, profile_scratch_size=0,
                                launch_cooperative_grid=False, launch_pdl=False)
    monkeypatch.setattr(triton, "__version__", "3.6.0")
    assert _launch._c_entry(run) is entry
    assert _launch._c_entry(types.SimpleNamespace(**dict(vars(run), global_scratch_size=64))) is None  # scratch
    assert _launch._c_entry(lambda *a: None) is None  # another launcher
    monkeypatch.setattr(triton, "__version__", "3.9.0")
    assert _launch._c_entry(run) is None  # another layout: Triton's own run


def test_the_call_key_is_what_the_caller_passed():
    # Everything a plan derives (on the heap or not, aliasing, 16-byte alignment) is a function of
    # the addresses, sizes, dtypes and devices, so those alone make the key.
    buf = torch.zeros(64)
    a, b = buf[:32], buf[32:]
    key = _launch.call_key("all_reduce", None, a, b)
    assert key == _launch.call_key("all_reduce", None, buf[:32], buf[32:])  # other views, same memory
    assert key != _launch.call_key("all_reduce", None, b, a)  # out and inp swapped
    assert key != _launch.call_key("all_reduce", None, buf[1:33], b)  # another address (alignment)
    assert key != _launch.call_key("all_reduce", None, a.view(4, 8), b)  # another shape
    assert key != _launch.call_key("all_reduce", ccl.Config(block=64), a, b)
    assert key != _launch.call_key("all_gather", None, a, b)
    t = torch.zeros(4, 4)
    # strides: a transposed view has the address and shape of its tensor, and is not contiguous
    assert _launch.call_key("all_reduce", None, t.t(), t) != _launch.call_key("all_reduce", None, t, t)  # out
    assert _launch.call_key("all_reduce", None, t, t.t()) != _launch.call_key("all_reduce", None, t, t)  # inp
    assert _launch.call_key("all_reduce", None, a, [1.0]) is None  # not a tensor: the miss's checks say so


def test_plans_are_capped_per_context_oldest_first(monkeypatch):
    monkeypatch.setattr(_launch, "MAX_PLANS", 3)
    class Context:  # any weak-referenceable object with a registrations count stands for a context
        registrations_generation = 0

    ctx = Context()
    made = []
    for i in range(5):
        _launch.plan_for(ctx, ("k", i), lambda i=i: made.append(i) or (lambda: i))
    assert made == [0, 1, 2, 3, 4]
    assert [_launch.lookup(ctx, ("k", i)) is not None for i in range(5)] == [False, False, True, True, True]
    assert _launch.plan_for(ctx, ("k", 4), lambda: pytest.fail("a cached plan is not rebuilt"))() == 4
    _launch.forget(ctx)
def test_a_plan_gives_way_to_its_fast_launch_and_clearing_workspaces_drops_both():
    from iris.collectives import _workspace

    class Context:  # any weak-referenceable object with a registrations count stands for a context
        registrations_generation = 0

    ctx, other, calls = Context(), Context(), []
    launch = types.SimpleNamespace(fast=None)

    def plan(*args):  # the first call compiles; then the launch offers its fast form
        calls.append(("plan", args))
        launch.fast = lambda *a: calls.append(("fast", a))
        _launch.promote(ctx, "key", launch)

    _launch.call(ctx, "key", lambda: plan, "out", "inp")
    _launch.call(ctx, "key", lambda: pytest.fail("a cached plan is not rebuilt"), "out", "inp")
    assert calls == [("plan", ("out", "inp")), ("fast", ("out", "inp"))]
    _launch.call(other, "key", lambda: (lambda *a: calls.append(("other", a))), 1)  # another context: its own
    assert calls[-1] == ("other", (1,)) and _launch.lookup(ctx, "key") is launch.fast
    _workspace.clear(ctx)  # buffers freed: every plan made before is stale
    assert _launch.lookup(ctx, "key") is None and _launch.lookup(other, "key") is None
    _launch.call(ctx, "key", lambda: (lambda *a: calls.append(("again", a))), 2)
    assert _launch.lookup(ctx, "key") is not None
    ctx.registrations_generation += 1  # a tensor was registered or unregistered: where peers reach it changed
    assert _launch.lookup(ctx, "key") is None
    _launch.forget(ctx)
    _launch.forget(other)


def test_registration_on_the_fly_is_decided_by_the_message_all_gathers_being_its_output(monkeypatch):
    # The default rule (Config.register None) agrees on how tensors are reached, registering plain
    # ones, from ccl.REGISTER_FROM message bytes on the cuda backend. all_gather's peers read its
    # input, a W-th of its message: the size that decides is the output's.
    asked = []
    ctx = types.SimpleNamespace(world_size=4, device=types.SimpleNamespace(type="cuda"), quick_allgather=True,
                                reach=lambda tensors: asked.append(len(tensors)) or ["reached"] * len(tensors))
    small, big = torch.empty(ccl.REGISTER_FROM // 4 // 4, dtype=torch.float32), torch.empty(ccl.REGISTER_FROM // 4)
    assert _launch.agreed_reach(ctx, None, small) is None
    assert _launch.agreed_reach(ctx, None, big) == ("reached",)
    assert _launch.agreed_reach(ctx, None, small, message=big) == ("reached",)
    assert _launch.agreed_reach(ctx, None, big, message=small) is None
    assert _launch.agreed_reach(ctx, ccl.Config(register=False), big) is None
    assert asked == [1, 1]

    seen = {}

    def agreed_reach(ctx, config, *tensors, message=None):
        seen.update(tensors=tensors, message=message)
        raise RuntimeError("stop here")

    monkeypatch.setattr(_launch, "agreed_reach", agreed_reach)
    with pytest.raises(RuntimeError, match="stop here"):
        ccl.all_gather(ctx, big, small)
    assert len(seen["tensors"]) == 1 and seen["tensors"][0] is small, "the peers read the input"
    assert seen["message"] is big, "the output's size is the message's"


def test_the_p2p_default_grid_shares_the_sms_among_every_rank_on_the_gpu(monkeypatch):
    # one send and one receive per rank sharing the GPU, each a program per SM at most: the job's
    # own ranks, or IRIS_GPU_RANKS (every job's, as resident_grid counts) where that is more; a
    # suite's jobs side by side otherwise size their waiting kernels for their own ranks alone
    from iris.collectives.ccl import _p2p

    ctx = types.SimpleNamespace(device=torch.device("cuda", 0), ranks_on_device=2, get_cu_count=lambda: 132)
    monkeypatch.delenv("IRIS_GPU_RANKS", raising=False)
    assert _p2p._default_grid(ctx) == 33
    monkeypatch.setenv("IRIS_GPU_RANKS", "24")
    assert _p2p._default_grid(ctx) == 2
    monkeypatch.setenv("IRIS_GPU_RANKS", "1")  # fewer than the job's own: the job's own count
    assert _p2p._default_grid(ctx) == 33
    cpu = types.SimpleNamespace(device=torch.device("cpu"), ranks_on_device=2, get_cu_count=lambda: 2)
    assert _p2p._default_grid(cpu) == 2
