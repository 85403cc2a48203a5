"""``Config``: what a caller of a fused op may force, and the default chooser.

Choosing is data, not code: :data:`DEFAULTS` is a small table keyed by (backend, op, shape class,
world size); :func:`choose` looks a call up in it and fills in what the caller left as ``None``.
Two more tables of the same keys name the strategy where the inputs decide it:
:data:`INPUT_PARTIALS` for ``partial_dtype="input"``, :data:`FP32_INPUTS` for fp32 inputs
multiplied at torch's own fp32 matmul precision.
The GPU rows are measured on an H200 for bf16 (tilings of the GEMM core against cuBLAS, and the
fused ops at 2 ranks on one GPU for the strategies' tile; docs/performance.md); the two-GPU
measurement of the fused ops (``benchmarks/fused_ops.py``) may refine them; the cpu rows use small
tiles so that Triton's interpreter, which runs every program in turn, stays fast.
"""

from __future__ import annotations

import dataclasses
import functools

import torch

from iris.runtime import IrisUsageError

#: Strategies each op accepts (``Config.variant``); the first is the default where the table says
#: nothing else.
VARIANTS = {
    "matmul_all_reduce": ("one_shot", "two_shot", "rotated", "unfused"),
    "matmul_reduce_scatter": ("owner", "rotated", "unfused"),
    "matmul_all_gather": ("push", "unfused"),
    "all_gather_matmul": ("pull", "arrival", "unfused"),
}


@dataclasses.dataclass(frozen=True)
class Config:
    """Launch settings of a fused op; every field left ``None`` is chosen by :func:`choose`.

    - ``variant``: the communication strategy (see :data:`VARIANTS` and docs/fused-ops.md).
    - ``block_m``, ``block_n``, ``block_k``: the GEMM tile (powers of two, at least 16).
    - ``group_m``: rows of tiles visited together in the grouped order (L2 reuse of B).
    - ``num_warps``, ``num_stages``: Triton's launch options.
    - ``grid``: programs per rank (a persistent grid); capped at what is resident on the GPU.
    - ``use_tma``: tensor descriptors (TMA) for the GEMM's loads on the GPU; ignored by the
      interpreter, which always takes the pointer path.
    - ``input_precision``: ``tl.dot``'s for fp32 inputs, ``"tf32"`` or ``"ieee"``. By default
      torch's own at the call (:func:`torch_multiplies_fp32_as_tf32`): ``"tf32"`` after
      ``torch.backends.cuda.matmul.allow_tf32 = True`` or ``set_float32_matmul_precision("high")``,
      else ``"ieee"`` (torch's default), so that an op in fp32 multiplies as ``torch.matmul`` does.
    - ``flatten``: let the compiler flatten the persistent tile loop with the K loop, so that the
      next tile's first loads are in flight during this tile's epilogue (GEMM core only).
    - ``warp_specialize``: split the K loop into a TMA producer warpgroup and two MMA consumer
      warpgroups (Triton's Hopper warp specialisation; with ``use_tma`` and ``num_warps=4``, which
      then launches 12 warps, one program per SM, the tile stored through a descriptor: with a
      pointer store the specialised kernel wrote wrong tiles under Triton 3.6 on an H200). GEMM core
      only, off by default: on an H200 it was no faster than the 8-warp default
      (docs/performance.md, "the GEMM core against cuBLAS"). The fused ops ignore it. Triton 3.6-3.9 refuse to
      specialise a persistent loop whose body waits (a compile error) and, where they do
      specialise one with a signal after the tile, drop its atomic (seen in the TTGIR), so a
      fused op's flags would be lost. Ignored without tensor descriptors.
    - ``partial_dtype``: the dtype in which strategies ``rotated`` and ``unfused`` of
      ``matmul_reduce_scatter`` and ``matmul_all_reduce`` hand the partial products between
      ranks. ``"accumulator"`` (default): fp32 (fp64 for fp64 inputs), so the result is rounded
      once. ``"input"``: the inputs' dtype,
      as torch's fused ops do: half the bytes on the wire for bf16 and fp16, at the cost of one
      rounding per rank's partial before the fp32 sum (still in rank order, still bit-identical
      on every rank). Setting it without ``variant`` picks the strategy of :data:`INPUT_PARTIALS`
      (``unfused`` on the GPU, ``rotated`` in the interpreter); the other strategies, and
      ``rotated`` of ``matmul_all_reduce`` falling back to ``one_shot`` (M not a multiple of the
      ranks), stage fp32. The ops without partial products refuse ``"input"``.
    """

    variant: str | None = None
    block_m: int | None = None
    block_n: int | None = None
    block_k: int | None = None
    group_m: int | None = None
    num_warps: int | None = None
    num_stages: int | None = None
    grid: int | None = None
    use_tma: bool | None = None
    input_precision: str | None = None
    flatten: bool | None = None
    warp_specialize: bool | None = None
    partial_dtype: str | None = None


#: Defaults by (backend, op or "*", shape class or "*", world size or 0 for any): the first
#: matching row, from the most specific, fills the fields a caller left out.
DEFAULTS: list[tuple[tuple[str, str, str, int], dict]] = [
    # Strategy "rotated" for the ops that reduce, at every world size. One H200, ranks under MPS,
    # bf16, M = 4096, N = K = 8192 (K split), 2026-12-03: at 4 ranks matmul_reduce_scatter took
    # 1.63 ms with "owner" (each owner waits for every peer's tile as the tiles come: the ranks move
    # in lockstep) and 1.11 with "rotated" before its reduction was sliced; matmul_all_reduce 2.27
    # (one_shot: every rank reads every partial), 1.33 (two_shot) and 1.27 (rotated). At 2 ranks
    # "rotated" was also the fastest of each op's strategies (0.79 against 0.84 ms; 0.85 against
    # 0.93 and 0.95). all_gather_matmul keeps "pull": neither was faster everywhere ("arrival" took
    # 0.92-1.12x its time over M, shapes and world sizes). docs/performance.md has the measurements.
    (("cuda", "matmul_reduce_scatter", "*", 0), dict(variant="rotated")),
    (("cuda", "matmul_all_reduce", "*", 0), dict(variant="rotated")),
    (("cpu", "*", "*", 0), dict(block_m=16, block_n=16, block_k=16, group_m=4, num_warps=4, num_stages=1,
                               use_tma=False)),
    (("cuda", "*", "small", 0), dict(block_m=64, block_n=128, block_k=64, group_m=8, num_warps=4, num_stages=4,
                                    use_tma=True)),
    # 128 x 256 x 64, 8 warps, 4 stages: the best of 8 tilings for the GEMM core alone at the
    # layers' shapes (2026-12-01, docs/performance.md), and faster than 128 x 128 for every fused
    # op and strategy at M = 4096 (2 ranks on one H200: 3-14 %).
    (("cuda", "*", "*", 0), dict(block_m=128, block_n=256, block_k=64, group_m=8, num_warps=8, num_stages=4,
                                use_tma=True)),
]


#: The strategy that ``Config(partial_dtype="input")`` picks when the caller names none, by the keys
#: of :data:`DEFAULTS` (the first matching row wins; the last matches every call).
INPUT_PARTIALS: list[tuple[tuple[str, str, str, int], str]] = [
    # "unfused": torch's GEMM into a heap buffer, then ccl's collective in place. One H200, ranks
    # under MPS, bf16, M = 4096, 8192, 16384, N = K = 8192 and the MLP shapes (K split), both
    # strategies with partials in bf16 side by side in one run (2026-12-05,
    # runs tagged input; docs/performance.md, "Partials in the inputs' dtype"): "unfused" took 0.90-0.995x the time of
    # "rotated" at 4 ranks (12 of 12 cases) and 0.92-1.02x at 2 ranks (10 of 12 faster). Ranks that
    # share a GPU share its SMs and memory, so the fused kernel cannot hide the partials' traffic
    # behind the GEMM; cuBLAS's GEMM beats the fused kernel's. With fp32 partials (the default)
    # "rotated" stays: "unfused" moves twice the bytes in a separate pass (1.04-1.15x "rotated" at
    # 4 ranks, square shapes; docs/performance.md, "Strategies").
    (("cuda", "*", "*", 0), "unfused"),
    # the interpreter: the fused strategy, which runs this library's kernels (the tests' subject)
    (("*", "*", "*", 0), "rotated"),
]


#: The strategy of fp32 inputs, by the keys of :data:`DEFAULTS`, when the caller names none and
#: asks for the precision torch's own fp32 GEMM has now (the default; see ``Config.input_precision``):
#: then "unfused" (torch's GEMM, then ``ccl``) multiplies exactly as the call asks. A call that asks
#: for another precision than torch's (``input_precision="tf32"`` while torch multiplies fp32 in
#: full precision) keeps the fused strategies, which are the only ones that give it.
FP32_INPUTS: list[tuple[tuple[str, str, str, int], str]] = [
    # "unfused" for every op. One H200, ranks under MPS, fp32 (tf32 in both), M = 4096,
    # N = K = 8192 (K split for the ops that reduce), 2026-12-04
    # (benchmarks/results/fused_ops_{2,4}ranks_1gpu_dtypes.md): cuBLAS + ccl took 0.47-0.92x the
    # fused op's time in all 8 cases (matmul_all_gather 1.548 against 2.459 ms at 2 ranks, 1.705
    # against 3.641 at 4; all_gather_matmul 2.884 against 3.904, 5.978 against 8.254). The GEMM
    # core is the cause: in tf32 it takes 1.15-2.9x cuBLAS's time ("our GEMM" against "GEMM alone"
    # there), where in bf16 it is within 10 % of cuBLAS. After the switch (2026-12-05,
    # runs tagged fp32, docs/performance.md) the default took 0.67-0.85x the fused strategies' time at
    # 2 ranks and 0.50-0.88x at 4. In full precision the fused kernels' tl.dot runs on the FMA
    # units, and cuBLAS's SGEMM is faster: at 2 ranks "unfused" took 10.83 ms against 26.32 for
    # "rotated" (matmul_all_reduce) and 21.49 against 47.23 for "pull" (all_gather_matmul;
    # a run tagged fp32ieee).
    (("cuda", "*", "*", 0), "unfused"),
]


#: Whether ``all_gather_matmul`` in a training step (its ``b`` needs a gradient: the weight of a
#: ``ColumnParallelLinear``) keeps the rows it gathers for that gradient, through strategy
#: ``unfused`` with ``gathered=``, when the caller names no strategy; by the keys of
#: :data:`DEFAULTS` (the first matching row wins). Not keeping them, the backward gathers A again.
KEEP_GATHERED: list[tuple[tuple[str, str, str, int], bool]] = [
    # One H200, ranks under MPS, bf16, the sequence-parallel MLP of docs/tensor-parallel.md compiled,
    # M = 1024-16384, side by side in one run (2026-12-04, benchmarks/results/tp_mlp_{2,4}ranks_1gpu.md):
    # a forward and backward of cuBLAS + ccl keeping the gathered rows ("iris_unfused") took
    # 0.72-0.99x the time of the fused ops, which gather A again for the weight's gradient, at every
    # M, at 2 and 4 ranks (36.4 against 46.9 ms at M = 8192, 4 ranks; torch's async TP 37.3).
    (("cuda", "*", "*", 0), True),
    # the interpreter: the fused kernels, which the tests are about (a test names variant="unfused")
    (("*", "*", "*", 0), False),
]


def keeps_gathered(M: int, N: int, K: int, world_size: int, backend: str, named: str | None) -> bool:
    """Whether a training step's ``all_gather_matmul`` (``M`` gathered rows) keeps what it gathers:
    yes where the call's config names (``named``) strategy ``unfused``, no where it names another,
    else :data:`KEEP_GATHERED`'s answer."""
    if named is not None:
        return named == "unfused"
    return bool(_first_row(KEEP_GATHERED, "all_gather_matmul", shape_class(M, N, K), world_size, backend))


def torch_multiplies_fp32_as_tf32() -> bool:
    """Whether torch's fp32 matmuls on CUDA use tf32 now: ``torch.backends.cuda.matmul.fp32_precision``
    (torch 2.9 and later; ``"none"`` defers to the legacy flag) or ``allow_tf32`` (torch
    ``set_float32_matmul_precision("high")`` sets both). Read per call: the user may change it
    between calls."""
    matmul = torch.backends.cuda.matmul
    precision = getattr(matmul, "fp32_precision", "none")
    if precision != "none":
        return precision == "tf32"
    try:
        return bool(matmul.allow_tf32)
    except RuntimeError:  # torch refuses the legacy read after a mix of its two APIs
        return False


def shape_class(M: int, N: int, K: int) -> str:
    """``"small"`` when the output has fewer than ~2 tiles of 128 x 128 per H200 SM, else ``"large"``."""
    return "small" if M * N < 2 * 132 * 128 * 128 else "large"


def _is_pow2(value: int) -> bool:
    return value > 0 and value & (value - 1) == 0


def choose(op: str, M: int, N: int, K: int, world_size: int, backend: str, config: Config | None,
           itemsize: int = 2) -> Config:
    """The complete :class:`Config` for one call: ``config``'s fields where set, the table's elsewhere.

    ``itemsize``: bytes per input element. On the GPU, 4-byte inputs take at most a ``block_k`` of
    32 and 8-byte inputs 16 and a ``block_n`` of 128 unless the caller set them: the bf16 tiles'
    pipeline, in fp32, needs more shared memory than an H200 has (288 KiB for 128 x 256 x 64 in 3
    stages, of 227 KiB), fp64 at 32 as much again, and a 128 x 256 fp64 tile 256 KiB in the
    epilogue that Triton 3.6 converts through shared memory (a launch then fails with Triton's
    ``OutOfResources``).
    fp32 inputs (``itemsize`` 4) multiply at torch's fp32 matmul precision of the moment unless the
    caller set ``input_precision`` (:func:`torch_multiplies_fp32_as_tf32`, read per call), and
    take the strategy of :data:`FP32_INPUTS` when the caller names no variant and asks for no
    other precision than torch's.

    Raises :class:`iris.runtime.IrisUsageError` naming ``op`` for an unknown variant or a bad tile.
    The answer depends on the shape only through :func:`shape_class`, so it is cached per (op,
    shape class, world size, backend, config): a call costs a dictionary lookup instead of the
    table walk (tens of microseconds of Python per op call before). Rows appended to or removed
    from :data:`DEFAULTS` take effect at once; a row edited in place after its first use needs
    ``choose.cache_clear()``.
    """
    if config is not None and not isinstance(config, Config):
        raise IrisUsageError(f"iris.collectives.ops.{op}: config={config!r} must be an "
                             f"iris.collectives.ops.Config or None")
    fp32 = None if itemsize != 4 else "tf32" if torch_multiplies_fp32_as_tf32() else "ieee"
    tables = (DEFAULTS, INPUT_PARTIALS, FP32_INPUTS)
    return _choose(op, shape_class(M, N, K), world_size, backend, config, tuple(map(id, tables)),
                   tuple(map(len, tables)), itemsize, fp32)


def _first_row(table: list, op: str, shape: str, world_size: int, backend: str, fits=lambda value: True):
    """The value of ``table``'s first row that matches the call (and ``fits``), or None."""
    return next((value for (b, o, s, w), value in table if b in ("*", backend) and o in ("*", op)
                 and s in ("*", shape) and w in (0, world_size) and fits(value)), None)


def _strategy(table: list, op: str, shape: str, world_size: int, backend: str) -> str | None:
    """The strategy of ``table``'s (:data:`INPUT_PARTIALS`, :data:`FP32_INPUTS`) first row that
    matches the call and that ``op`` has, or None."""
    return _first_row(table, op, shape, world_size, backend, lambda variant: variant in VARIANTS[op])


@functools.lru_cache(maxsize=4096)
def _choose(op: str, shape: str, world_size: int, backend: str, config: Config | None, table_id: tuple,
            table_rows: tuple, itemsize: int = 2, fp32: str | None = None) -> Config:
    # fp32: torch's fp32 matmul precision ("tf32" or "ieee") for fp32 inputs, else None
    # table_id, table_rows (of the three tables): only in the cache key, so that a changed table is
    # looked up anew
    given = {k: v for k, v in dataclasses.asdict(config or Config()).items() if v is not None}
    fields: dict = {}
    for (b, o, s, w), row in reversed(DEFAULTS):
        if b == backend and o in ("*", op) and s in ("*", shape) and w in (0, world_size):
            fields.update(row)
    if backend == "cuda" and itemsize >= 4 and "block_k" in fields:
        # the same bytes per K step as the bf16 tiles': 8-byte inputs take a quarter of their block_k
        fields["block_k"] = min(fields["block_k"], 32 if itemsize == 4 else 16)
        if itemsize >= 8 and "block_n" in fields:
            # and half the columns: a 128 x 256 fp64 accumulator alone is 256 KiB where an epilogue
            # converts it through shared memory (Triton 3.6)
            fields["block_n"] = min(fields["block_n"], 128)
    fields.setdefault("variant", VARIANTS[op][0])
    fields.setdefault("input_precision", fp32 or "tf32")
    fields.setdefault("flatten", False)
    fields.setdefault("warp_specialize", False)
    fields.setdefault("partial_dtype", "accumulator")
    if given.get("partial_dtype") == "input" and "variant" not in given and "rotated" in VARIANTS[op]:
        given["variant"] = _strategy(INPUT_PARTIALS, op, shape, world_size, backend)
    elif fp32 and "variant" not in given and given.get("input_precision", fp32) == fp32:
        picked = _strategy(FP32_INPUTS, op, shape, world_size, backend)
        if picked is not None:
            given["variant"] = picked
    fields.update(given)
    chosen = Config(**{f.name: fields.get(f.name) for f in dataclasses.fields(Config)})
    where = f"iris.collectives.ops.{op}"
    if chosen.variant not in VARIANTS[op]:
        raise IrisUsageError(f"{where}: config.variant={chosen.variant!r} is not one of {VARIANTS[op]}")
    for name in ("block_m", "block_n", "block_k"):
        value = getattr(chosen, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 16 or not _is_pow2(value):
            raise IrisUsageError(f"{where}: config.{name}={value!r} must be a power of two >= 16 (tl.dot's minimum)")
    for name in ("group_m", "num_warps", "num_stages"):
        value = getattr(chosen, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise IrisUsageError(f"{where}: config.{name}={value!r} must be a positive int")
    if chosen.grid is not None and (isinstance(chosen.grid, bool) or not isinstance(chosen.grid, int)
                                    or chosen.grid < 1):
        raise IrisUsageError(f"{where}: config.grid={chosen.grid!r} must be a positive int or None")
    for name in ("flatten", "warp_specialize"):
        if not isinstance(getattr(chosen, name), bool):
            raise IrisUsageError(f"{where}: config.{name}={getattr(chosen, name)!r} must be True or False")
    if chosen.partial_dtype not in ("accumulator", "input"):
        raise IrisUsageError(f"{where}: config.partial_dtype={chosen.partial_dtype!r} must be 'accumulator' or 'input'")
    if chosen.partial_dtype == "input" and "rotated" not in VARIANTS[op]:
        raise IrisUsageError(f"{where}: config.partial_dtype='input': this op hands no partial products between "
                             f"ranks, whatever its strategy; leave partial_dtype unset")
    if chosen.partial_dtype == "input" and chosen.variant not in ("rotated", "unfused"):
        raise IrisUsageError(f"{where}: config.partial_dtype='input' needs strategy 'rotated' or 'unfused', got "
                             f"variant={chosen.variant!r}: drop variant or set variant='rotated' or 'unfused'")
    if chosen.input_precision not in ("tf32", "ieee"):
        raise IrisUsageError(f"{where}: config.input_precision={chosen.input_precision!r} must be 'tf32' or 'ieee'")
    return chosen


choose.cache_clear = _choose.cache_clear  # type: ignore[attr-defined]
