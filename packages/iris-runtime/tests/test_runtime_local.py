"""Checks that need no launch: argument errors raised before MPI is touched, the error
hierarchy, and the public names."""

from __future__ import annotations

import pytest

import iris.runtime
from iris.runtime import IrisBackendError, IrisError, IrisUsageError
from iris.runtime._backend import gpu_usable


@pytest.mark.skipif(gpu_usable(), reason="a CUDA GPU is usable here, so backend='cuda' is valid; "
                                         "the no-GPU error can only be seen on a machine without one")
def test_cuda_backend_without_gpu_names_the_fix():
    with pytest.raises(IrisBackendError) as info:
        iris.runtime.iris(heap_size=1 << 20, backend="cuda")
    text = str(info.value)
    assert "backend='cuda'" in text and "no usable CUDA GPU" in text and "backend='cpu'" in text
    assert isinstance(info.value, IrisError)


@pytest.mark.parametrize("backend", ["gpu", "CUDA", "rocm"])
def test_unknown_backend(backend):
    with pytest.raises(IrisUsageError, match=rf"backend={backend!r}.*one of \('auto', 'cuda', 'cpu'\)"):
        iris.runtime.iris(heap_size=1 << 20, backend=backend)


@pytest.mark.parametrize("heap_size", [0, -4096, 1.5, "1G", None])
def test_bad_heap_size(heap_size):
    with pytest.raises(IrisUsageError, match=rf"heap_size={heap_size!r}.*positive number of bytes"):
        iris.runtime.iris(heap_size=heap_size)


def test_bad_log_level_is_a_usage_error():
    with pytest.raises(IrisUsageError, match=r"set_log_level\('LOUD'\).*DEBUG, INFO, WARNING or ERROR"):
        iris.runtime.set_log_level("LOUD")


def test_error_hierarchy():
    from iris.runtime import (
        HeapExhaustedError,
        IrisUnsupportedError,
        NotOnHeapError,
        RankError,
        SymmetryError,
        UnsupportedDtypeError,
    )

    for cls in (HeapExhaustedError, IrisBackendError, IrisUnsupportedError, IrisUsageError, NotOnHeapError,
                RankError, SymmetryError, UnsupportedDtypeError):
        assert issubclass(cls, IrisError), cls
    assert issubclass(NotOnHeapError, ValueError) and issubclass(RankError, ValueError)
    assert issubclass(UnsupportedDtypeError, TypeError) and issubclass(HeapExhaustedError, MemoryError)
    import iris.device

    assert iris.runtime.IrisError is iris.device.IrisError, "one hierarchy across the packages"


def test_public_names_exist_and_are_documented():
    for name in iris.runtime.__all__:
        obj = getattr(iris.runtime, name)
        if callable(obj) and not isinstance(obj, type(iris.runtime.logger)):
            assert obj.__doc__, f"iris.runtime.{name} has no docstring"
    assert iris.runtime.DEFAULT_BACKEND in ("cpu", "cuda", "auto")
    for method in ("barrier", "broadcast", "get_heap_bases", "get_device_context", "get_rank", "get_num_ranks",
                   "as_symmetric", "is_symmetric", "free", "close", "empty", "zeros", "ones", "full", "arange",
                   "linspace", "rand", "randn", "randint", "uniform", "empty_like", "zeros_like", "ones_like",
                   "full_like", "rand_like", "randn_like", "randint_like"):
        assert getattr(iris.runtime.Iris, method).__doc__, method
