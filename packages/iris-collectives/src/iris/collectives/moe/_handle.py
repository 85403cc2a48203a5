"""What a MoE dispatch returns besides the rows: :class:`ExpertMeta` and :class:`MoEHandle`.

The handle's ``layout`` is one int32 tensor on the device holding, for this rank, what the
combine needs to bring every row back (written by the dispatch's kernels, never read by the
host): ``[send_counts E | send_offsets E | recv_counts G x W | recv_offsets G x W | slots T x K |
order T x K]`` with ``E`` experts, ``G = E / W`` local experts, ``T`` tokens and ``K`` experts per
token:

- ``send_counts[e]``, ``send_offsets[e]``: this rank's rows for expert ``e`` and where they start in
  its dispatch order (tokens sorted by expert, then by token and slot);
- ``recv_counts[g, s]``, ``recv_offsets[g, s]``: the rows rank ``s`` sent to local expert ``g`` and
  where they start in ``expert_x``;
- ``slots[t * K + k]``: the place of token ``t``'s ``k``-th expert in the dispatch order;
- ``order``: the dispatch order itself (``t * K + k`` ids).
"""

from __future__ import annotations

from typing import NamedTuple

import torch


class ExpertMeta(NamedTuple):
    """Per local expert, what a dispatch delivered (device tensors, ready for a grouped GEMM).

    - ``counts``: int32 ``[G]``, rows per local expert;
    - ``offsets``: int32 ``[G + 1]``, where expert ``g``'s rows start in ``expert_x`` (flattened to
      rows), then the end (packed layout: the rows received; padded: ``G * expert_capacity``);
      ``offsets[1:]`` are the ends ``torch._grouped_mm``'s ``offs`` takes;
    - ``weights``: ``[rows]`` (fp32; fp64 for fp64 ``topk_weights``), each row's top-k weight, 0 in
      padding rows; ``combine`` applies them, so use them only where the experts weigh their own
      outputs (and then pass ``topk_weights`` of ones to ``combine``).
    """

    counts: torch.Tensor
    offsets: torch.Tensor
    weights: torch.Tensor


class MoEHandle(NamedTuple):
    """What :func:`iris.collectives.moe.combine` needs to bring a dispatch's rows back: the ``layout``
    (see the module docstring), the routing (``topk_idx``, ``topk_weights``, ``row_weights``: the
    weights by row, as in :class:`ExpertMeta`) and the dispatch's sizes. Pass it as it is; a handle
    is valid for one combine of the same rows (and any number of backward passes)."""

    layout: torch.Tensor
    topk_idx: torch.Tensor
    topk_weights: torch.Tensor
    row_weights: torch.Tensor
    num_experts: int
    capacity: int
    expert_capacity: int
    max_tokens: int
    config: str


def layout_size(num_experts: int, tokens: int, topk: int) -> int:
    """Entries of a handle's layout."""
    return 4 * num_experts + 2 * tokens * topk


def layout_parts(layout: torch.Tensor, num_experts: int, tokens: int, topk: int) -> dict:
    """Views of the parts of ``layout`` by name (see the module docstring)."""
    E, n = num_experts, tokens * topk
    return {"send_counts": layout[:E], "send_offsets": layout[E:2 * E], "recv_counts": layout[2 * E:3 * E],
            "recv_offsets": layout[3 * E:4 * E], "slots": layout[4 * E:4 * E + n],
            "order": layout[4 * E + n:4 * E + 2 * n]}
