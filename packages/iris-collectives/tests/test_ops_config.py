"""``ops.choose``: the cached config choice answers as the table says (its first matching row
wins), and follows table changes."""

from __future__ import annotations

import pytest

from iris.collectives import ops
from iris.collectives.ops import _config
from iris.runtime import IrisUsageError


def test_a_choice_is_cached_per_shape_class_and_config():
    first = _config.choose("matmul_all_reduce", 4096, 4096, 4096, 2, "cuda", None)
    again = _config.choose("matmul_all_reduce", 8192, 8192, 1024, 2, "cuda", None)  # also "large"
    assert again is first  # the cache answered: the shape enters only through its class
    small = _config.choose("matmul_all_reduce", 64, 64, 64, 2, "cuda", None)
    assert _config.shape_class(64, 64, 64) == "small" and small.block_m == 64 and first.block_m == 128
    forced = _config.choose("matmul_all_reduce", 4096, 4096, 4096, 2, "cuda", ops.Config(block_n=64))
    assert forced.block_n == 64 and forced.block_m == first.block_m


def test_bad_configs_raise_on_every_call():
    for _ in range(2):  # an error is not cached as an answer
        with pytest.raises(IrisUsageError, match=r"matmul_all_reduce: config\.block_m=48 must be a power of two"):
            _config.choose("matmul_all_reduce", 64, 64, 64, 1, "cpu", ops.Config(block_m=48))
        with pytest.raises(IrisUsageError, match=r"must be an iris\.collectives\.ops\.Config or None"):
            _config.choose("matmul_all_reduce", 64, 64, 64, 1, "cpu", {"block_m": 32})


def test_table_changes_take_effect(monkeypatch):
    before = _config.choose("all_gather_matmul", 64, 64, 64, 3, "cpu", None)
    row = (("cpu", "all_gather_matmul", "*", 3), dict(block_m=32))
    monkeypatch.setattr(_config, "DEFAULTS", [row] + _config.DEFAULTS)  # a new table: looked up anew
    assert _config.choose("all_gather_matmul", 64, 64, 64, 3, "cpu", None).block_m == 32
    _config.DEFAULTS.insert(0, (("cpu", "all_gather_matmul", "*", 3), dict(block_n=32)))  # a row more: too
    assert _config.choose("all_gather_matmul", 64, 64, 64, 3, "cpu", None).block_n == 32
    _config.DEFAULTS[0][1]["block_n"] = 64  # edited in place: only after cache_clear
    assert _config.choose("all_gather_matmul", 64, 64, 64, 3, "cpu", None).block_n == 32
    _config.choose.cache_clear()
    assert _config.choose("all_gather_matmul", 64, 64, 64, 3, "cpu", None).block_n == 64
    monkeypatch.undo()
    assert _config.choose("all_gather_matmul", 64, 64, 64, 3, "cpu", None) == before


def test_a_new_workspace_waits_for_every_rank_once():
    # Peers signal into a new workspace's flags as soon as their kernel runs; this rank's zero fill
    # is queued on its stream. Creation must therefore wait for every rank (ctx.barrier) before
    # any launch: without it, 2 ranks sharing an H200 hung at the first call after a long GEMM.
    import torch

    from iris.collectives import _workspace

    class Ctx:  # a stand-in host context (weak-referenceable, as the cache needs)
        def __init__(self, world_size, name):
            self.world_size, self.device, self.name = world_size, torch.device("cpu"), name

        def barrier(self):
            calls.append(self.name)

    calls = []
    ctx = Ctx(2, "barrier")

    def make(_):
        calls.append("make")
        return {"flags": torch.zeros(4, dtype=torch.int32)}

    first = _workspace.workspace(ctx, ("op", 1), make)
    again = _workspace.workspace(ctx, ("op", 1), make)
    assert first is again and calls == ["make", "barrier"], calls
    alone = Ctx(1, "solo")
    _workspace.workspace(alone, ("op", 1), make)
    assert "solo" not in calls  # one rank: no peer to wait for


def test_four_byte_inputs_take_a_shorter_k_block_on_the_gpu():
    # the bf16 tiles' pipeline in fp32 needs more shared memory than an H200 has (found when the
    # torch operators ran fp32 through the defaults on the GPU)
    bf16 = _config.choose("matmul_reduce_scatter", 4096, 8192, 2048, 4, "cuda", None)
    fp32 = _config.choose("matmul_reduce_scatter", 4096, 8192, 2048, 4, "cuda", None, itemsize=4)
    assert bf16.block_k == 64 and fp32.block_k == 32, (bf16, fp32)
    # fp64 at 32 needed 288 KiB of shared memory (test_ops_compile checks what the defaults compile to)
    fp64 = _config.choose("matmul_reduce_scatter", 4096, 8192, 2048, 4, "cuda", None, itemsize=8)
    assert (fp64.block_k, fp64.block_n) == (16, 128), fp64
    assert (fp32.block_m, fp32.block_n, fp32.num_stages) == (bf16.block_m, bf16.block_n, bf16.num_stages)
    forced = _config.choose("matmul_reduce_scatter", 4096, 8192, 2048, 4, "cuda", ops.Config(block_k=64), itemsize=4)
    assert forced.block_k == 64  # what the caller sets stays
    assert _config.choose("matmul_reduce_scatter", 64, 64, 64, 2, "cpu", None, itemsize=4).block_k == 16


def test_partial_dtype_input_picks_the_measured_strategy_and_is_refused_where_no_partials_travel():
    cpu_default = _config.choose("matmul_reduce_scatter", 64, 64, 64, 2, "cpu", None)
    assert cpu_default.partial_dtype == "accumulator" and cpu_default.variant == "owner"
    for op in ("matmul_reduce_scatter", "matmul_all_reduce"):
        picked = _config.choose(op, 64, 64, 64, 2, "cpu", ops.Config(partial_dtype="input"))
        assert picked.variant == "rotated" and picked.partial_dtype == "input"
        # on the GPU, cuBLAS then ccl (measured faster at 2 and 4 ranks); fp32 partials stay fused
        for world in (2, 4, 8):
            picked = _config.choose(op, 4096, 8192, 2048, world, "cuda", ops.Config(partial_dtype="input"))
            assert picked.variant == "unfused" and picked.partial_dtype == "input", (op, world, picked)
            assert _config.choose(op, 4096, 8192, 2048, world, "cuda", None).variant == "rotated"
        forced = _config.choose(op, 4096, 8192, 2048, 4, "cuda", ops.Config(variant="rotated", partial_dtype="input"))
        assert forced.variant == "rotated"
    with pytest.raises(IrisUsageError, match=r"matmul_all_reduce: config\.partial_dtype='input' needs strategy "
                                             r"'rotated' or 'unfused', got variant='two_shot': drop variant"):
        _config.choose("matmul_all_reduce", 64, 64, 64, 2, "cpu", ops.Config(variant="two_shot", partial_dtype="input"))
    for variant in (None, "unfused"):  # a gather op's "unfused" hands no partials over either
        with pytest.raises(IrisUsageError, match=r"all_gather_matmul: config\.partial_dtype='input': this op hands "
                                                 r"no partial products between ranks, whatever its strategy; leave "
                                                 r"partial_dtype unset"):
            _config.choose("all_gather_matmul", 64, 64, 64, 2, "cpu",
                           ops.Config(variant=variant, partial_dtype="input"))
    with pytest.raises(IrisUsageError, match=r"config\.partial_dtype='bf16' must be 'accumulator' or 'input'"):
        _config.choose("matmul_reduce_scatter", 64, 64, 64, 2, "cpu", ops.Config(partial_dtype="bf16"))


def test_fp32_inputs_multiply_at_torchs_precision_through_cublas_and_ccl(monkeypatch):
    # An op in fp32 multiplies as torch.matmul does at the call: tf32 while torch does, else full
    # precision. With the same precision on both sides torch's GEMM + ccl is the strategy on the
    # GPU (FP32_INPUTS: the fused GEMM core in tf32 is slower than cuBLAS's); a call that asks for
    # the other precision keeps the fused strategies, the only ones that give it.
    tf32 = {"on": True}
    monkeypatch.setattr(_config, "torch_multiplies_fp32_as_tf32", lambda: tf32["on"])

    def chosen(op, backend="cuda", config=None, itemsize=4):
        return _config.choose(op, 4096, 8192, 2048, 4, backend, config, itemsize=itemsize)

    for op in ops.VARIANTS:
        for on in (True, False):
            tf32["on"] = on  # read per call: the cached answer follows it
            torchs, other = ("tf32", "ieee") if on else ("ieee", "tf32")
            assert (chosen(op).variant, chosen(op).input_precision) == ("unfused", torchs), (op, on)
            assert chosen(op, config=ops.Config(input_precision=torchs)).variant == "unfused", (op, on)
            asked = chosen(op, config=ops.Config(input_precision=other))
            assert asked.variant != "unfused" and asked.input_precision == other, (op, on, asked)
            for itemsize in (2, 8):  # fp16/bf16 and fp64: no fp32 precision to follow
                assert chosen(op, itemsize=itemsize).variant != "unfused", (op, on, itemsize)
                assert chosen(op, itemsize=itemsize).input_precision == "tf32", (op, on, itemsize)
            interpreted = chosen(op, backend="cpu")  # the interpreter runs the fused strategies
            assert interpreted.variant != "unfused" and interpreted.input_precision == torchs, (op, on)
            forced = ops.VARIANTS[op][0]
            named = chosen(op, config=ops.Config(variant=forced))
            assert (named.variant, named.input_precision) == (forced, torchs), (op, on, named)


class _Flags:
    """A stand-in for ``torch.backends.cuda.matmul``: ``fp32_precision`` (torch 2.9 and later) and
    the legacy ``allow_tf32``, which torch refuses to read after a mix of the two APIs."""

    def __init__(self, allow_tf32, fp32_precision=None):
        self._allow = allow_tf32
        if fp32_precision is not None:
            self.fp32_precision = fp32_precision

    @property
    def allow_tf32(self):
        if isinstance(self._allow, Exception):
            raise self._allow
        return self._allow


def test_torchs_tf32_setting_is_read_through_either_api(monkeypatch):
    import torch

    assert isinstance(_config.torch_multiplies_fp32_as_tf32(), bool)  # torch's real flags, as they are
    cases = [(_Flags(False), False), (_Flags(True), True),  # torch before 2.9: the legacy flag only
             (_Flags(True, "none"), True), (_Flags(False, "none"), False),  # "none": the legacy flag decides
             (_Flags(RuntimeError("mixed APIs"), "tf32"), True), (_Flags(RuntimeError("mixed APIs"), "ieee"), False),
             (_Flags(RuntimeError("mixed APIs"), "none"), False)]
    for flags, expected in cases:
        monkeypatch.setattr(torch.backends.cuda, "matmul", flags)
        assert _config.torch_multiplies_fp32_as_tf32() is expected, (vars(flags), expected)


def test_b_operand_reads_b_in_the_layout_its_tensor_cores_take(monkeypatch):
    # the host's choice of USE_TMA for B: row-major B through its own descriptor, column-major B
    # (weight.t()) through its transpose's without a copy, fp32 under tf32 always column-major
    # (transposed once by the host), and the pointer path where no descriptor fits
    import torch

    from iris.collectives.ops import _launch

    monkeypatch.setattr(_launch, "INTERPRETER_TMA", True)  # the interpreter's descriptor path, as on a GPU
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    cfg = _config.choose("matmul_all_reduce", 64, 64, 64, 2, "cuda", None)
    a = torch.ones(64, 32, dtype=torch.bfloat16, device=dev)
    rows = torch.arange(32 * 64, dtype=torch.bfloat16, device=dev).reshape(32, 64)
    columns = rows.t().contiguous().t()
    got, mode = _launch.b_operand(cfg, rows, a)
    assert mode == _launch.TMA_B_ROWS and got is rows
    got, mode = _launch.b_operand(cfg, columns, a)
    assert mode == _launch.TMA_B_COLUMNS and got is columns  # read in place
    wide = rows.float()
    got, mode = _launch.b_operand(cfg, wide, a.float())
    assert mode == _launch.TMA_B_COLUMNS and got.stride() == (1, 32) and torch.equal(got, wide)
    ieee = _config.choose("matmul_all_reduce", 64, 64, 64, 2, "cuda", ops.Config(input_precision="ieee"))
    got, mode = _launch.b_operand(ieee, wide, a.float())
    assert mode == _launch.TMA_B_ROWS and got is wide  # full fp32 products: no tensor cores, no copy
    odd = torch.ones(32, 65, dtype=torch.bfloat16, device=dev)[:, :63]  # row stride of 130 bytes
    got, mode = _launch.b_operand(cfg, odd, a)
    assert mode == _launch.TMA_OFF and got is odd
    skewed = torch.ones(64, 33, dtype=torch.bfloat16, device=dev)[:, :32]  # A with rows 66 bytes apart
    got, mode = _launch.b_operand(cfg, rows, skewed)  # no descriptor of A: none of B either
    assert mode == _launch.TMA_OFF and got is rows


def test_the_descriptor_allocator_is_set_in_every_thread_that_launches():
    # Triton keeps its allocator per thread (a ContextVar): set once per process, the backward of a
    # compiled model, which autograd runs in its own thread, found none ("no allocator was set")
    import threading

    from iris.collectives import _workspace

    def has_one():
        return _workspace._thread_has_allocator()

    _workspace.ensure_allocator()
    assert has_one()
    seen = {}

    def worker():
        seen["before"] = has_one()
        _workspace.ensure_allocator()
        seen["after"] = has_one()

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join()
    assert seen == {"before": False, "after": True}, seen


def test_rmsnorm_rule_follows_the_all_reduce_table(monkeypatch):
    # all_reduce_residual_rmsnorm: the variant ccl.all_reduce's table picks for the same message,
    # one_shot_buffered where that is two-shot but fewer rows than ranks, one_shot on one rank; one
    # row per rank and tile for two-shot, one row per tile for the one-shots on the GPU
    from iris.collectives import ccl
    from iris.collectives.ccl import _table
    from iris.collectives.ops import _norm_config

    # the H200's table (its measured rows pick all three variants), whatever this machine's card
    monkeypatch.setattr(_table, "TABLE", _table.load("NVIDIA H200", "sm_90")[0])

    def norm(rows, width, nbytes, world, backend="cuda", config=None):
        return _norm_config.choose("call", rows, width, nbytes, "bfloat16", world, backend, world, config)

    for world in (2, 4, 8):
        for rows, width in ((1, 8192), (16, 4096), (256, 8192), (8192, 8192)):
            nbytes = 2 * rows * width
            table = ccl.choose("all_reduce", nbytes, "bfloat16", world, "cuda", ranks_per_gpu=world).variant
            cfg = norm(rows, width, nbytes, world)
            assert cfg.variant == ("one_shot_buffered" if table == "two_shot" and rows < world else table), cfg
            assert cfg.block_m == (world if cfg.variant == "two_shot" else 1), cfg
            assert cfg.num_warps == min(16, max(4, width // 1024)), cfg
    assert norm(8192, 8192, 1 << 27, 1).variant == "one_shot"
    assert norm(8192, 8192, 1 << 27, 3, config=ops.Config(variant="two_shot")).block_m == 4  # ragged shares
    assert norm(5, 64, 640, 2, "cpu").block_m == 4  # the interpreter: fewer, larger tiles
    forced = norm(4, 8192, 1 << 16, 2, config=ops.Config(variant="one_shot", block_m=2, num_warps=2, grid=3))
    assert (forced.variant, forced.block_m, forced.num_warps, forced.grid) == ("one_shot", 2, 2, 3)
    with pytest.raises(IrisUsageError, match=r"call: config sets block_n=64, group_m=2, which apply to the GEMM"):
        norm(4, 64, 512, 2, config=ops.Config(block_n=64, group_m=2))
    with pytest.raises(IrisUsageError, match=r"call: config.num_warps=3 must be a power of two"):
        norm(4, 64, 512, 2, config=ops.Config(num_warps=3))


def test_a_training_step_keeps_the_gathered_rows_where_the_table_says():
    # on the GPU the measured table keeps them (the unfused pair trained faster); the interpreter runs
    # the fused kernels; a named strategy decides alone; a row added for a world size wins there
    keeps = _config.keeps_gathered
    assert keeps(8192, 7168, 8192, 4, "cuda", None) and not keeps(8192, 7168, 8192, 4, "cpu", None)
    assert keeps(64, 64, 64, 2, "cpu", "unfused") and not keeps(8192, 7168, 8192, 4, "cuda", "pull")
    row = (("cuda", "all_gather_matmul", "*", 8), False)
    _config.KEEP_GATHERED.insert(0, row)
    try:
        assert not keeps(8192, 7168, 8192, 8, "cuda", None) and keeps(8192, 7168, 8192, 4, "cuda", None)
    finally:
        _config.KEEP_GATHERED.remove(row)
