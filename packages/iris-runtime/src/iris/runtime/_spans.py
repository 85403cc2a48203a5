"""Where a tensor's memory lies: its first element's address, and whether all of it is inside a
range of bytes (the heap, a registered tensor)."""

from __future__ import annotations

import torch


def address(tensor: torch.Tensor) -> int:
    """Address of ``tensor``'s first element. Unlike ``data_ptr()``, which is 0 for a tensor with no
    elements, it also locates empty tensors, so they can be recognised and freed like others."""
    return tensor.untyped_storage().data_ptr() + tensor.storage_offset() * tensor.element_size()


def lies_within(tensor: torch.Tensor, start: int, nbytes: int) -> bool:
    """True when every element of ``tensor`` (any strides) lies in ``[start, start + nbytes)``; an
    empty tensor, when its address does (its end included)."""
    first = address(tensor)
    if tensor.numel() == 0:
        return start <= first <= start + nbytes
    span = sum((n - 1) * abs(s) for n, s in zip(tensor.shape, tensor.stride())) + 1
    return start <= first and first + span * tensor.element_size() <= start + nbytes
