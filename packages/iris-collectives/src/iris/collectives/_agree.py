"""What a host collective or fused op tells the call agreement (``iris.runtime.Iris.agree_call``):
its signature, with no address in it, and its text, in the caller's terms.

A tensor is its shape and dtype (and its strides where it is not contiguous); where the peers
reach it in place, also where: its heap offset (every rank's must be the same), its registration
(``ctx.register``) and offset in it, or the reach the ranks agreed on (``ctx.reach``, the same on
every rank by construction), else "plain" (staged through the heap, whatever its address). That is
what decides the protocol each rank's kernel follows (which staging, which workspace): two ranks
whose placements differ would follow different ones. Options (op, root, config) are as passed.
"""

from __future__ import annotations

import contextlib
import dataclasses

import torch


def host_calls(ctx, label: str):
    """A context manager naming, in the watchdog's reports, the host collectives made inside it
    (``Iris.host_call``; nothing for a stand-in context without it)."""
    named = getattr(ctx, "host_call", None)
    return named(label) if named is not None else contextlib.nullcontext()


def _where(ctx, t: torch.Tensor, reach) -> tuple:
    if reach is not None:
        return reach.ident
    registration = ctx.registration_of(t)
    if registration is not None:
        return ("registered", registration.serial, t.data_ptr() - registration.addresses[ctx.rank])
    if ctx.is_symmetric(t):
        return ("heap", ctx.offset_of(t))
    return ("plain",)


def _where_text(where: tuple) -> str:
    kind = where[0]
    if kind == "heap":
        return f" on the heap at offset {where[1]}" if len(where) > 1 else " on the heap"
    if kind == "registered":
        detail = where[1:] if len(where) > 2 else (where[1] if len(where) > 1 else ())
        return f" registered {tuple(detail)}" if detail else " registered"
    if kind == "staged":
        return " (staged)"
    return ""


def _tensor(ctx, t, placed: bool, reach) -> tuple:
    # (shape, dtype, strides or None, where or None) of a tensor; a text for anything else. The
    # shape stays a torch.Size (hashed and compared as the tuple): the fused ops build this per call.
    if t.__class__ is torch.Tensor or isinstance(t, torch.Tensor):
        strides = None if t.is_contiguous() else t.stride()
        return (t.shape, t.dtype, strides, _where(ctx, t, reach) if placed else None)
    return ("None",) if t is None else (f"a {type(t).__name__}",)


def _tensor_text(sig: tuple) -> str:
    if len(sig) == 1:
        return sig[0]
    shape, dtype, strides, where = sig
    text = f"{str(dtype).removeprefix('torch.')}[{', '.join(map(str, shape))}]"
    if strides is not None:
        text += f" (strides {strides})"
    return text + (_where_text(where) if where is not None else "")


def _value_text(value) -> str:
    # An option as the caller would write it: a config with only the fields it sets.
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = ", ".join(f"{f.name}={getattr(value, f.name)!r}" for f in dataclasses.fields(value)
                           if getattr(value, f.name) is not None)
        return f"{type(value).__name__}({fields})"
    return repr(value)


def out_place(ctx, t: torch.Tensor) -> tuple:
    """Where ``t`` is, for a signature: its heap offset, its registration, or "plain"."""
    return _where(ctx, t, None)


class _Written(str):
    """An option's text that the agreement writes as is (no quotes)."""

    def __repr__(self) -> str:
        return str(self)


def rows_of(t: torch.Tensor, rows: str = "*") -> str:
    """``t``'s dtype and shape with its row count (dim 0) written ``rows``: for a signature where
    ranks may pass different numbers of rows (tokens, a capacity of their own), compared by the
    rest of the shape alone."""
    rest = "".join(f", {d}" for d in t.shape[1:])
    return _Written(f"{str(t.dtype).removeprefix('torch.')}[{rows}{rest}]")


def agree_fused(ctx, call: str, signature: tuple, tensors, **options) -> int:
    """:func:`agree` for a call whose checks have already fixed what its signature needs in a few
    values (``signature``: e.g. a fused op's ``M, N, K``, dtypes and chosen config, which with the
    checks passed determine every shape): built per call, it costs a tuple and a lookup, and the
    text of ``tensors`` and ``options`` is written only when the call is new."""
    def describe() -> str:
        texts = [f"{name}={_tensor_text(_tensor(ctx, value, False, None))}" for name, value in tensors]
        texts += [f"{name}={_value_text(value)}" for name, value in options.items()]
        return f"{call}({', '.join(texts)})"

    return ctx.agree_call((call, signature), describe, call)


def agree(ctx, call: str, tensors, placed=(), reach=None, always=False, **options) -> int:
    """The fingerprint of ``call`` (e.g. ``"iris.collectives.ccl.all_reduce"``) on ``tensors``
    (``(name, value)`` pairs, in the call's order; a value that is an earlier tensor of the call is
    written ``name=other``), agreed with every rank if new (see ``iris.runtime.Iris.agree_call``).
    ``placed``: names of the tensors the peers reach in place, whose placement is compared too;
    ``reach``: their agreed :class:`iris.runtime.Reach`, by name, where the call agreed on one.
    ``always``: exchange on every call, not only a new one (see ``Iris.agree_call``).
    ``options``: the call's other arguments, by name (hashable, or compared by their text)."""
    parts = []
    for i, (name, value) in enumerate(tensors):
        for other, earlier in tensors[:i]:
            if earlier is value and value is not None:
                parts.append((name, ("=", other)))
                break
        else:
            parts.append((name, _tensor(ctx, value, name in placed, reach.get(name) if reach else None)))
    items = tuple(options.items())
    signature = (call, tuple(parts), items)

    def describe() -> str:
        texts = [f"{name}={sig[1]} (in place)" if sig[0] == "=" else f"{name}={_tensor_text(sig)}"
                 for name, sig in parts]
        texts += [f"{name}={_value_text(value)}" for name, value in items]
        return f"{call}({', '.join(texts)})"

    # (an unhashable option, a bad config which the call's checks report, is agreed by its text)
    return ctx.agree_call(signature, describe, call, always)
