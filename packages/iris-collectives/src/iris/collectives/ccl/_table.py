"""The selection table of the host collectives: which variant and tiling each call gets.

Data, not code: a list of rows, the first matching row wins (so specific rows come first). A row
matches a call when its ``backend`` is the context's, ``collective`` is the call's or ``"*"``,
the per-rank message (``inp``'s bytes; ``tensor``'s for broadcast) is at most ``max_bytes``
(``None``: any size), ``dtype`` is the call's (``"float32"``, ...) or ``"*"``, and
``world_size`` is the call's or 0 (any). Its ``config`` fills the fields of
:class:`~iris.collectives.ccl.Config` the caller left ``None``.

This is a starting point written by reasoning, not a measurement, until
``benchmarks/ccl.py --write-table`` measures every variant and tiling per size class and
rewrites this file: cpu rows use big tiles (Triton's interpreter pays per operation, not per
element, and runs every program in turn); cuda rows use one-shot all-reduce up to 1 MiB (one
round of flags, every rank reads every peer: latency-bound sizes) and two-shot above (each
element read and written once per rank: bandwidth-bound sizes), tiles of 4096 elements in rows
of 1024 (what ``benchmarks/tile_collectives.py`` found fast on an H200) and 8192 for large
messages.
"""

TABLE = [
    {"backend": "cpu", "collective": "*", "max_bytes": None, "dtype": "*", "world_size": 0,
     "config": {"variant": None, "block": 1024, "width": 64, "num_warps": 4}},
    {"backend": "cuda", "collective": "all_reduce", "max_bytes": 1 << 20, "dtype": "*", "world_size": 0,
     "config": {"variant": "one_shot", "block": 4096, "width": 1024, "num_warps": 4}},
    {"backend": "cuda", "collective": "all_reduce", "max_bytes": None, "dtype": "*", "world_size": 0,
     "config": {"variant": "two_shot", "block": 8192, "width": 1024, "num_warps": 8}},
    {"backend": "cuda", "collective": "*", "max_bytes": 1 << 20, "dtype": "*", "world_size": 0,
     "config": {"variant": None, "block": 4096, "width": 1024, "num_warps": 4}},
    {"backend": "cuda", "collective": "*", "max_bytes": None, "dtype": "*", "world_size": 0,
     "config": {"variant": None, "block": 8192, "width": 1024, "num_warps": 8}},
]
