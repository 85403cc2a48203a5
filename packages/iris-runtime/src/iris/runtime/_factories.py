"""Tensor factories on the symmetric heap, with torch's signatures.

Every factory allocates from the heap (same offset on every rank when called in the same order)
and fills the tensor in place. Values follow torch exactly: the fill is done by torch itself.
``out=`` fills a heap tensor the caller already has instead of allocating (AMD Iris's factories
take it too); ``layout=`` accepts ``torch.strided``, the only layout a heap tensor has.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence

import torch

from ._errors import IrisUsageError, UnsupportedDtypeError

#: dtypes Triton kernels can read and write.
SUPPORTED_DTYPES = (
    torch.float16, torch.bfloat16, torch.float32, torch.float64,
    torch.int8, torch.int16, torch.int32, torch.int64,
    torch.uint8, torch.uint16, torch.uint32, torch.uint64,
    torch.bool, torch.float8_e4m3fn, torch.float8_e5m2,
)


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def check_dtype(dtype: torch.dtype, call: str) -> torch.dtype:
    """``dtype`` if Triton supports it, else :class:`UnsupportedDtypeError` naming the call."""
    if dtype not in SUPPORTED_DTYPES:
        names = ", ".join(dtype_name(d) for d in SUPPORTED_DTYPES)
        raise UnsupportedDtypeError(
            f"{call}: dtype {dtype_name(dtype)} cannot live on the symmetric heap (Triton kernels cannot use it); "
            f"use one of {names}"
        )
    return dtype


def _one_sequence(size: tuple) -> bool:
    return len(size) == 1 and isinstance(size[0], (Sequence, torch.Size)) and not isinstance(size[0], (str, bytes))


def parse_shape(size: tuple, call: str) -> tuple[int, ...]:
    """torch's ``*size`` convention: ints, or one sequence of ints; a sequence nested in
    one-element sequences is unwrapped (``zeros(((2, 3),))`` is ``zeros(2, 3)``, as in AMD Iris)."""
    while _one_sequence(size):
        size = tuple(size[0])
    shape = []
    for dim in size:
        if isinstance(dim, torch.Tensor) and dim.numel() == 1:
            dim = int(dim.item())
        try:
            # operator.index accepts what torch accepts as a size (int, numpy ints), not floats or strings
            value = operator.index(dim) if not isinstance(dim, bool) else -1
        except TypeError:
            value = -1
        if value < 0:
            raise IrisUsageError(f"{call}: size {size!r} must be non-negative ints; e.g. zeros(4, 8) or zeros((4, 8))")
        shape.append(value)
    return tuple(shape)


class TensorFactories:
    """Mixin for :class:`iris.runtime.Iris`; needs ``self.device``, ``self._heap_tensor`` and
    ``self.require_symmetric``."""

    device: torch.device

    def _heap_tensor(self, shape: tuple[int, ...], dtype: torch.dtype, call: str) -> torch.Tensor:
        raise NotImplementedError

    def require_symmetric(self, tensor: torch.Tensor, call: str) -> torch.Tensor:
        raise NotImplementedError

    def _check_device(self, device, call: str) -> None:
        if device is not None and torch.device(device).type != self.device.type:
            raise IrisUsageError(
                f"{call}: device={device!r} but this heap lives on {self.device}; leave device= out"
            )

    def _new(self, size, dtype, device, name: str, default=None, out=None, layout=torch.strided) -> torch.Tensor:
        if dtype is None:
            dtype = out.dtype if isinstance(out, torch.Tensor) else (default or torch.get_default_dtype())
        shape = parse_shape(size, name)
        call = f"{name}({', '.join(map(str, shape))}, dtype={dtype_name(dtype)})"
        self._check_device(device, call)
        self._check_layout(layout, call)
        check_dtype(dtype, call)
        if out is not None:
            return self._reuse(out, shape, dtype, call)
        return self._heap_tensor(shape, dtype, call)

    def _check_layout(self, layout, call: str) -> None:
        if layout is not None and layout != torch.strided:
            raise IrisUsageError(f"{call}: layout={layout} but heap tensors are dense (torch.strided); "
                                 f"leave layout= out, or convert the result yourself (e.g. t.to_sparse())")

    def _reuse(self, out, shape: tuple[int, ...], dtype: torch.dtype, call: str) -> torch.Tensor:
        """``out`` seen as ``shape``, for a factory to fill in place: it must already be a contiguous
        heap tensor of ``dtype`` with as many elements (the heap cannot grow a tensor as torch
        resizes ``out``)."""
        if not isinstance(out, torch.Tensor):
            raise IrisUsageError(f"{call}: out= takes a tensor, got {type(out).__name__}")
        self.require_symmetric(out, f"{call} with out=")
        want = math.prod(shape)
        if out.dtype != dtype or out.numel() != want or not out.is_contiguous():
            raise IrisUsageError(
                f"{call}: out= is {dtype_name(out.dtype)} with {out.numel()} element(s)"
                f"{'' if out.is_contiguous() else ', not contiguous'}; it must be a contiguous {dtype_name(dtype)} "
                f"heap tensor of {want} element(s): allocate it with the same call, or leave out= out")
        return out.view(shape)

    def empty(self, *size, out=None, dtype=None, layout=torch.strided, device=None,
              requires_grad=False) -> torch.Tensor:
        """Uninitialised tensor on the heap (``torch.empty``)."""
        return self._new(size, dtype, device, "empty", out=out, layout=layout).requires_grad_(requires_grad)

    def zeros(self, *size, out=None, dtype=None, layout=torch.strided, device=None,
              requires_grad=False) -> torch.Tensor:
        """Tensor of zeros on the heap (``torch.zeros``)."""
        return self._new(size, dtype, device, "zeros", out=out, layout=layout).zero_().requires_grad_(requires_grad)

    def ones(self, *size, out=None, dtype=None, layout=torch.strided, device=None,
             requires_grad=False) -> torch.Tensor:
        """Tensor of ones on the heap (``torch.ones``)."""
        return self._new(size, dtype, device, "ones", out=out, layout=layout).fill_(1).requires_grad_(requires_grad)

    def full(self, size, fill_value, *, out=None, dtype=None, layout=torch.strided, device=None,
             requires_grad=False) -> torch.Tensor:
        """Tensor filled with ``fill_value`` (``torch.full``; dtype inferred from the value, or
        taken from ``out``)."""
        if dtype is None and out is None:
            dtype = torch.full((), fill_value).dtype
        t = self._new((size,), dtype, device, "full", out=out, layout=layout)
        return t.fill_(fill_value).requires_grad_(requires_grad)

    def _from_torch(self, values: torch.Tensor, name: str, requires_grad: bool, out, layout) -> torch.Tensor:
        t = self._new((values.shape,), values.dtype, None, name, out=out, layout=layout)
        return t.copy_(values).requires_grad_(requires_grad)

    def arange(self, start, end=None, step=1, *, out=None, dtype=None, layout=torch.strided, device=None,
               requires_grad=False) -> torch.Tensor:
        """Evenly spaced values (``torch.arange``)."""
        self._check_device(device, "arange")
        if dtype is None and out is not None:
            dtype = getattr(out, "dtype", None)
        if dtype is not None:
            check_dtype(dtype, f"arange(dtype={dtype_name(dtype)})")
        # arange(end) and arange(end, step=s) count from 0, as torch does
        start, end = (0, start) if end is None else (start, end)
        return self._from_torch(torch.arange(start, end, step, dtype=dtype), "arange", requires_grad, out, layout)

    def linspace(self, start, end, steps, *, out=None, dtype=None, layout=torch.strided, device=None,
                 requires_grad=False) -> torch.Tensor:
        """``steps`` values from ``start`` to ``end`` (``torch.linspace``)."""
        self._check_device(device, "linspace")
        if dtype is None and out is not None:
            dtype = getattr(out, "dtype", None)
        if dtype is not None:
            check_dtype(dtype, f"linspace(dtype={dtype_name(dtype)})")
        return self._from_torch(torch.linspace(start, end, steps, dtype=dtype), "linspace", requires_grad, out,
                                layout)

    def rand(self, *size, generator=None, out=None, dtype=None, layout=torch.strided, device=None,
             requires_grad=False) -> torch.Tensor:
        """Uniform ``[0, 1)`` samples (``torch.rand``)."""
        t = self._new(size, dtype, device, "rand", out=out, layout=layout)
        return t.uniform_(0, 1, generator=generator).requires_grad_(requires_grad)

    def randn(self, *size, generator=None, out=None, dtype=None, layout=torch.strided, device=None,
              requires_grad=False) -> torch.Tensor:
        """Standard normal samples (``torch.randn``)."""
        t = self._new(size, dtype, device, "randn", out=out, layout=layout)
        return t.normal_(generator=generator).requires_grad_(requires_grad)

    def randint(self, low, high=None, size=None, *, generator=None, out=None, dtype=None, layout=torch.strided,
                device=None, requires_grad=False) -> torch.Tensor:
        """Integers in ``[low, high)`` (``torch.randint``; ``randint(high, size)`` works too)."""
        if size is None:
            if high is None:
                raise IrisUsageError("randint: pass size=, e.g. randint(0, 10, (4, 4))")
            low, high, size = 0, low, high      # randint(high, size)
        elif high is None:
            low, high = 0, low                  # randint(high, size=...)
        t = self._new((size,), dtype, device, "randint", default=torch.int64, out=out, layout=layout)
        return t.random_(low, high, generator=generator).requires_grad_(requires_grad)

    def uniform(self, low=0.0, high=1.0, size=None, *, generator=None, out=None, dtype=None, layout=torch.strided,
                device=None) -> torch.Tensor:
        """Uniform samples in ``[low, high)``."""
        if size is None:
            raise IrisUsageError(f"uniform(low={low}, high={high}): pass size=, e.g. uniform(-1, 1, (4, 4))")
        t = self._new((size,), dtype, device, "uniform", out=out, layout=layout)
        return t.uniform_(low, high, generator=generator)

    def _like(self, t: torch.Tensor, dtype) -> tuple[tuple[int, ...], torch.dtype]:
        return tuple(t.shape), dtype if dtype is not None else t.dtype

    # layout=None: the model's layout, as torch's *_like; a heap tensor is strided whatever the model is.
    def empty_like(self, t, *, dtype=None, layout=None, device=None, requires_grad=False) -> torch.Tensor:
        """``empty`` with ``t``'s shape and dtype."""
        shape, dtype = self._like(t, dtype)
        return self.empty(shape, dtype=dtype, layout=layout, device=device, requires_grad=requires_grad)

    def zeros_like(self, t, *, dtype=None, layout=None, device=None, requires_grad=False) -> torch.Tensor:
        """``zeros`` with ``t``'s shape and dtype."""
        shape, dtype = self._like(t, dtype)
        return self.zeros(shape, dtype=dtype, layout=layout, device=device, requires_grad=requires_grad)

    def ones_like(self, t, *, dtype=None, layout=None, device=None, requires_grad=False) -> torch.Tensor:
        """``ones`` with ``t``'s shape and dtype."""
        shape, dtype = self._like(t, dtype)
        return self.ones(shape, dtype=dtype, layout=layout, device=device, requires_grad=requires_grad)

    def full_like(self, t, fill_value, *, dtype=None, layout=None, device=None, requires_grad=False) -> torch.Tensor:
        """``full`` with ``t``'s shape and dtype."""
        shape, dtype = self._like(t, dtype)
        return self.full(shape, fill_value, dtype=dtype, layout=layout, device=device, requires_grad=requires_grad)

    def rand_like(self, t, *, dtype=None, layout=None, device=None, requires_grad=False) -> torch.Tensor:
        """``rand`` with ``t``'s shape and dtype."""
        shape, dtype = self._like(t, dtype)
        return self.rand(shape, dtype=dtype, layout=layout, device=device, requires_grad=requires_grad)

    def randn_like(self, t, *, dtype=None, layout=None, device=None, requires_grad=False) -> torch.Tensor:
        """``randn`` with ``t``'s shape and dtype."""
        shape, dtype = self._like(t, dtype)
        return self.randn(shape, dtype=dtype, layout=layout, device=device, requires_grad=requires_grad)

    def randint_like(self, t, low, high=None, *, dtype=None, layout=None, device=None) -> torch.Tensor:
        """``randint`` with ``t``'s shape and dtype."""
        shape, dtype = self._like(t, dtype)
        if high is None:
            low, high = 0, low
        return self.randint(low, high, shape, dtype=dtype, layout=layout, device=device)


def nbytes_of(shape: tuple[int, ...], dtype: torch.dtype) -> int:
    """Bytes needed by a contiguous tensor."""
    return math.prod(shape) * torch.empty((), dtype=dtype).element_size()
