"""Factory argument handling without MPI: torch's signatures, shapes, dtypes and their errors.

The factories are a mixin over ``_heap_tensor``; here it is backed by a plain buffer and the real
allocator, so these tests need no launch. Values on a real heap are checked by the multi-rank
worker (workers/runtime_worker.py).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from iris.runtime import (
    SUPPORTED_DTYPES,
    IrisError,
    IrisUsageError,
    NotOnHeapError,
    SymmetricAllocator,
    UnsupportedDtypeError,
)
from iris.runtime._factories import TensorFactories, nbytes_of


class BufferHeap(TensorFactories):
    """The factories over a local byte buffer: what Iris does, minus MPI."""

    def __init__(self, size: int = 1 << 16):
        self.device = torch.device("cpu")
        self.allocator = SymmetricAllocator(size)
        self.buffer = torch.zeros(size, dtype=torch.uint8)
        self.calls: list[str] = []

    def _heap_tensor(self, shape, dtype, call):
        self.calls.append(call)
        nbytes = nbytes_of(shape, dtype)
        offset = self.allocator.allocate(nbytes, call)
        return self.buffer[offset:offset + nbytes].view(dtype).view(shape)

    def require_symmetric(self, tensor, call):
        start = self.buffer.data_ptr()
        if not start <= tensor.data_ptr() < start + self.buffer.numel():
            raise NotOnHeapError(f"{call}: not on the heap")
        return tensor


@pytest.fixture
def heap():
    return BufferHeap()


@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128, torch.qint8, torch.quint8])
def test_unsupported_dtype_names_call_dtype_and_alternatives(heap, dtype):
    with pytest.raises(UnsupportedDtypeError) as info:
        heap.zeros(4, dtype=dtype)
    name = str(dtype).replace("torch.", "")
    text = str(info.value)
    assert f"zeros(4, dtype={name})" in text and f"dtype {name}" in text and "float32" in text and "bfloat16" in text
    assert isinstance(info.value, IrisError) and isinstance(info.value, TypeError)
    assert heap.allocator.free_bytes == 1 << 16, "nothing allocated for a rejected call"


def test_unsupported_dtype_in_every_factory(heap):
    c64 = torch.complex64
    calls = {
        "empty": lambda: heap.empty(2, dtype=c64), "ones": lambda: heap.ones(2, dtype=c64),
        "full": lambda: heap.full((2,), 1 + 1j), "rand": lambda: heap.rand(2, dtype=c64),
        "randn": lambda: heap.randn(2, dtype=c64), "arange": lambda: heap.arange(3, dtype=c64),
        "linspace": lambda: heap.linspace(0, 1, 3, dtype=c64),
        "zeros_like": lambda: heap.zeros_like(torch.zeros(2, dtype=c64)),
        "uniform": lambda: heap.uniform(0, 1, (2,), dtype=c64),
    }
    for name, call in calls.items():
        with pytest.raises(UnsupportedDtypeError, match="complex"):
            call()
        assert heap.allocator.free_bytes == 1 << 16, name


def test_every_supported_dtype_allocates(heap):
    for dtype in SUPPORTED_DTYPES:
        t = heap.empty(3, dtype=dtype)
        assert t.dtype == dtype and t.shape == (3,)


@pytest.mark.parametrize("size", [(-1,), (2.5,), ((2, -3),), ("4",), ((2, "x"),), (True,)])
def test_bad_shapes_raise_usage_error_naming_the_call(heap, size):
    with pytest.raises(IrisUsageError, match=r"zeros: size .* must be non-negative ints"):
        heap.zeros(*size)


@pytest.mark.parametrize("size", [(2, 3), ((2, 3),), ([2, 3],), (torch.Size([2, 3]),), (np.int64(2), 3),
                                  (torch.tensor(2), 3)])
def test_shape_spellings_torch_accepts(heap, size):
    assert heap.zeros(*size).shape == (2, 3)


def test_scalar_and_empty_shapes(heap):
    assert heap.zeros(()).shape == () and heap.zeros([]).shape == ()
    assert heap.zeros(0).numel() == 0 and heap.zeros(3, 0).shape == (3, 0)


def test_default_dtypes_follow_torch(heap):
    assert heap.zeros(2).dtype == torch.get_default_dtype()
    assert heap.rand(2).dtype == torch.get_default_dtype()
    assert heap.randint(0, 5, (2,)).dtype == torch.int64
    assert heap.full((2,), 3).dtype == torch.int64
    assert heap.full((2,), 3.0).dtype == torch.float32
    assert heap.full((2,), False).dtype == torch.bool
    assert heap.arange(3).dtype == torch.int64 and heap.arange(0.5, 2).dtype == torch.float32


def test_arange_forms_match_torch(heap):
    for args, kwargs in [((5,), {}), ((2, 9), {}), ((2, 9, 3), {}), ((0, 1, 0.3), {}), ((10, 0, -2), {}),
                         ((4,), {"dtype": torch.float64})]:
        got, want = heap.arange(*args, **kwargs), torch.arange(*args, **kwargs)
        assert got.dtype == want.dtype and torch.equal(got, want), (args, kwargs, got, want)
    # torch rejects arange(end, step=s); here it counts from 0 rather than dropping the step
    assert torch.equal(heap.arange(5, step=2), torch.arange(0, 5, 2))


def test_randint_forms_match_torch(heap):
    for args, kwargs in [((10, (3,)), {}), ((2, 10, (3,)), {}), ((10,), {"size": (3,)}),
                         ((2, 10), {"size": (3,)}), ((), {"low": 2, "high": 10, "size": (3,)})]:
        g1, g2 = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
        got = heap.randint(*args, generator=g1, **kwargs)
        want = torch.randint(*args, generator=g2, **kwargs)
        assert torch.equal(got, want), (args, kwargs)


def test_randint_and_uniform_without_size(heap):
    with pytest.raises(IrisUsageError, match=r"randint.*size="):
        heap.randint(5)
    with pytest.raises(IrisUsageError, match=r"uniform\(low=0, high=1\): pass size="):
        heap.uniform(0, 1)


def test_device_elsewhere_is_refused(heap):
    with pytest.raises(IrisUsageError, match=r"device='meta' but this heap lives on cpu"):
        heap.zeros(2, device="meta")
    with pytest.raises(IrisUsageError, match="leave device= out"):
        heap.arange(3, device="meta")
    assert heap.zeros(2, device="cpu").shape == (2,)


def test_factories_record_torch_style_calls(heap):
    heap.zeros(4, 8, dtype=torch.int32)
    heap.full((2,), 1.5)
    heap.ones_like(torch.zeros(3, dtype=torch.float16))
    assert heap.calls == ["zeros(4, 8, dtype=int32)", "full(2, dtype=float32)", "ones(3, dtype=float16)"]


# Each entry is the arguments of the call: zeros(((2, 3, 4),)), zeros([[5]]), ...
@pytest.mark.parametrize("size,shape", [((((2, 3, 4),),), (2, 3, 4)), (([[5]],), (5,)),
                                        (((((2, 3),),),), (2, 3)), (([[]],), ())])
def test_nested_sizes_unwrap_as_amd_iris_does(heap, size, shape):
    assert heap.zeros(*size).shape == shape
    assert heap.ones(*size, dtype=torch.int8).shape == shape


def test_out_fills_the_given_heap_tensor_in_place(heap):
    t, f = heap.empty(6, dtype=torch.int32), heap.empty(2, 2)
    free = heap.allocator.free_bytes
    for call, want in [(lambda: heap.zeros(2, 3, out=t), torch.zeros(2, 3, dtype=torch.int32)),
                       (lambda: heap.ones((3, 2), out=t), torch.ones(3, 2, dtype=torch.int32)),
                       (lambda: heap.full((6,), 7, out=t), torch.full((6,), 7, dtype=torch.int32)),
                       (lambda: heap.arange(6, out=t), torch.arange(6, dtype=torch.int32)),
                       (lambda: heap.randint(3, 4, (2, 3), out=t), torch.full((2, 3), 3, dtype=torch.int32)),
                       (lambda: heap.empty(6, out=t, dtype=torch.int32), torch.full((6,), 3, dtype=torch.int32))]:
        got = call()
        assert got.data_ptr() == t.data_ptr() and torch.equal(got, want), (got, want)
        assert torch.equal(t.view(-1), want.view(-1))
    assert torch.equal(heap.linspace(0, 3, 4, out=f), torch.linspace(0, 3, 4)) and f[1, 1] == 3
    g1, g2 = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    assert torch.equal(heap.rand(4, out=f, generator=g1), torch.rand(4, generator=g2))
    assert heap.randn(2, 2, out=f).data_ptr() == f.data_ptr()
    assert heap.uniform(-1, 1, (4,), out=f).data_ptr() == f.data_ptr()
    assert heap.allocator.free_bytes == free, "out= allocates nothing"


@pytest.mark.parametrize("bad,fragment", [
    (lambda h: h.zeros(5, out=h.empty(6, dtype=torch.int32)), "with 6 element(s)"),
    (lambda h: h.zeros(6, dtype=torch.int64, out=h.empty(6, dtype=torch.int32)), "must be a contiguous int64"),
    (lambda h: h.zeros(2, 3, out=h.empty(3, 2).t()), "not contiguous"),
    (lambda h: h.ones(3, out=[0, 0, 0]), "out= takes a tensor, got list"),
])
def test_out_that_cannot_hold_the_result_is_refused_naming_the_call(heap, bad, fragment):
    with pytest.raises(IrisUsageError, match=r"^(zeros|ones)\(") as info:
        bad(heap)
    assert fragment in str(info.value) and "out=" in str(info.value)


def test_out_must_be_on_the_heap(heap):
    with pytest.raises(NotOnHeapError, match=r"zeros\(4, dtype=float32\) with out="):
        heap.zeros(4, out=torch.empty(4))


def test_layout_strided_is_accepted_and_any_other_refused(heap):
    assert heap.zeros(2, layout=torch.strided).layout == torch.strided
    assert heap.zeros_like(torch.zeros(2, 2).to_sparse()).layout == torch.strided
    assert heap.arange(3, layout=torch.strided).shape == (3,)
    with pytest.raises(IrisUsageError, match=r"ones\(2, dtype=float32\): layout=torch.sparse_coo .*torch.strided"):
        heap.ones(2, layout=torch.sparse_coo)
    with pytest.raises(IrisUsageError, match="layout="):
        heap.full_like(torch.zeros(2), 1.0, layout=torch.sparse_csr)
