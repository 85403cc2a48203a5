"""iris.collectives.ccl: collectives called from the host, on whole tensors.

Like ``torch.distributed``'s tensor API (and AMD Iris's ``ccl``), with the Iris context first and
the output before the input:

- :func:`all_reduce` ``(ctx, out, inp, op="sum", config=None)``: sum, avg, max, min or prod;
- :func:`reduce_scatter` ``(ctx, out, inp, op="sum", config=None)``: rank ``r`` gets chunk ``r``;
- :func:`all_gather` ``(ctx, out, inp, config=None)``: every rank's ``inp`` along dim 0;
- :func:`all_to_all` ``(ctx, out, inp, config=None)``: chunk ``j`` of rank ``i`` to chunk ``i`` of ``j``;
- :func:`all_to_all_v` ``(ctx, out, inp, in_splits, out_splits, out_offsets=None, config=None)``: the
  same with split sizes that only the device knows (device tensors; no host synchronisation);
- :func:`broadcast` ``(ctx, tensor, src, config=None)``: in place, from rank ``src``;
- :func:`reduce` ``(ctx, out, inp, dst, op="sum", config=None)``: ``op`` over every rank, on ``dst``;
- :func:`gather` ``(ctx, out, inp, dst, config=None)``: every rank's ``inp`` along dim 0, on ``dst``;
- :func:`scatter` ``(ctx, out, inp, src, config=None)``: chunk ``r`` of ``src``'s ``inp`` to rank ``r``;
- :func:`barrier` ``(ctx)``: a device-side barrier, ordered on the stream;
- point to point: :func:`send` ``(ctx, tensor, dst, tag=0)``, :func:`recv` ``(ctx, tensor, src,
  tag=0)``, :func:`isend`, :func:`irecv` (each on a stream of its own, returning a :class:`Work`),
  :func:`batch_isend_irecv` ``(ctx, [P2POp(ccl.isend, tensor, peer, tag), ...])``, after
  :func:`init_p2p` ``(ctx)`` (collective, once: the mailboxes on the heap).

Every call above (and :func:`barrier`) takes ``group=``: an :class:`iris.runtime.Group`
(``ctx.new_group(ranks)``) to run among its members only, with the group's ranks and size (a
root or a peer is a group rank); None, the default, is every rank of the context. Point to point
on a group goes through the group's own mailboxes (``init_p2p(ctx, group=group)``).

Each call is one persistent kernel on torch's current stream, built from the tile collectives'
flags (counters in device memory that only grow): back-to-back calls need no host barrier, and a
CUDA graph of them replays correctly. Tensors on the symmetric heap are read by the peers in
place; other tensors are staged through a cached heap buffer inside the kernel. The variant and
tiling come from a measured table (:mod:`iris.collectives.ccl._table`: a JSON file per card;
:func:`table_source` says which one this process uses); ``config=Config(...)`` overrides it.

Inside ``torch.compile`` each call is a torch operator (``torch.ops.iris.all_reduce`` ..., see
:mod:`iris.collectives.functional`, which also has the differentiable, functional forms): no graph
break. In eager mode the call launches its kernel directly, without the dispatcher's host cost.

Example::

    import torch, iris.runtime
    from iris.collectives import ccl

    ctx = iris.runtime.iris()
    x = torch.full((1000,), float(ctx.rank), device=ctx.device)
    ccl.all_reduce(ctx, x, x)                  # in place: every element is 0 + 1 + ... + (W - 1)
"""

from ._all_to_all_v import all_to_all_v
from ._config import REGISTER_FROM, VARIANTS, Config, choose
from ._launch import forget as _forget_plans
from ._move import all_gather, all_to_all, barrier, broadcast
from ._p2p import P2POp, P2PSettings, Work, batch_isend_irecv, init_p2p, irecv, isend, p2p_settings, recv, send
from ._reduce import all_reduce, reduce_scatter
from ._rooted import gather, reduce, scatter
from ._table import table_source


def clear_workspaces(ctx) -> None:
    """Free the heap buffers of every host collective and fused op of ``ctx``, and the
    point-to-point mailboxes (collective: every rank calls it, once no kernel uses them, e.g. after
    ``ctx.barrier()``). The next call allocates again, with fresh counters (point to point: after
    :func:`init_p2p` again)."""
    from .. import _workspace

    _forget_plans(ctx)
    _workspace.clear(ctx)


__all__ = [
    "REGISTER_FROM",
    "VARIANTS",
    "Config",
    "P2POp",
    "P2PSettings",
    "Work",
    "all_gather",
    "all_reduce",
    "all_to_all",
    "all_to_all_v",
    "barrier",
    "batch_isend_irecv",
    "broadcast",
    "choose",
    "clear_workspaces",
    "gather",
    "init_p2p",
    "irecv",
    "isend",
    "p2p_settings",
    "recv",
    "reduce",
    "reduce_scatter",
    "scatter",
    "send",
    "table_source",
]
