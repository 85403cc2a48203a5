"""The ``iris`` backend of torch.distributed (``iris.collectives.distributed``).

Two launches run every scenario of workers/torch_backend_worker.py (torch's documented collective
semantics, object collectives, works and futures, new_group, the cpu:gloo configuration, the
errors, DDP bit-identical to gloo, and on the GPU stream order and CUDA graphs): one under
torchrun, one under mpirun, where the backend sets torch's rendezvous variables from MPI and makes
its context over MPI. On the cpu backend at 2 ranks; on the GPU (``tools/gpu-tests.sh``) at the
world sizes of ``IRIS_TEST_WORLD_SIZES``, torchrun with ``"cuda:iris,cpu:gloo"``. The other tests
here check the pieces that need no launch.
"""

from __future__ import annotations

import datetime
import os
import re

import pytest
import torch
import torch.distributed as dist

import iris.collectives.distributed as idist
from iris.collectives.distributed import _backend, _context, _convert, _rendezvous
from iris.runtime import IrisUnsupportedError, IrisUsageError
from iris.runtime.testing import expect_error, run_ranks, run_torchrun, world_sizes

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "workers", "torch_backend_worker.py")
with open(WORKER) as _f:
    SCENARIOS = re.findall(r"^def scenario_(\w+)\(", _f.read(), re.M)
ON_GPU = os.environ.get("IRIS_BACKEND") in ("cuda", "nvshmem")
ENV = {"IRIS_DIST_HEAP_SIZE": "64M", "MPIEXEC_TIMEOUT": "580"}


def check_run(proc, nranks: int, bootstrap: str) -> None:
    out = proc.stdout + proc.stderr
    assert re.findall(r"^PASS (\w+) \(", proc.stdout, re.M) == SCENARIOS, out
    assert f", {nranks} ranks, " in proc.stdout and f", {bootstrap})" in proc.stdout, out
    assert f"CHECK heap-size {64 << 20} bootstrap {bootstrap}" in proc.stdout, out  # IRIS_DIST_HEAP_SIZE
    # bit-identical where every sum is exact: cpu gradients at a power of two ranks (the worker's docstring)
    assert "CHECK ddp bit-identical to gloo" in proc.stdout or ON_GPU or nranks & (nranks - 1), out
    assert "CHECK ddp close to gloo" in proc.stdout or "CHECK ddp bit-identical to gloo" in proc.stdout, out
    assert "CHECK context-closed True" in proc.stdout, out


@pytest.mark.multirank
@pytest.mark.once  # the adapter does not depend on Triton; ccl's kernels are tested on every line
@pytest.mark.parametrize("nranks", world_sizes() if ON_GPU else [2])
def test_backend_under_torchrun(nranks):
    backend = "cuda:iris,cpu:gloo" if ON_GPU else "iris"
    proc = run_torchrun(nranks, WORKER, backend, *SCENARIOS, timeout=600, env=ENV)
    check_run(proc, nranks, "torch")
    assert f"CHECK backend-config {'cuda:iris,cpu:gloo' if ON_GPU else 'cpu:iris,cuda:iris'}" in proc.stdout


@pytest.mark.multirank
@pytest.mark.once
@pytest.mark.parametrize("nranks", world_sizes() if ON_GPU else [2])
def test_backend_under_mpirun(nranks):
    # no torchrun variables: importing iris.collectives.distributed sets them from MPI
    assert not any(name in os.environ for name in ("RANK", "MASTER_PORT", "TORCHELASTIC_RUN_ID"))
    proc = run_ranks(nranks, WORKER, "iris", *SCENARIOS, timeout=600, env=ENV)
    check_run(proc, nranks, "mpi")


@pytest.mark.multirank
@pytest.mark.once
@pytest.mark.skipif(ON_GPU, reason="on the GPU every scenario runs at each of IRIS_TEST_WORLD_SIZES (2 and 4)")
@pytest.mark.parametrize("launcher", ["torchrun", "mpirun"])
def test_sub_groups_of_four_ranks(launcher):
    # tensor x data parallel groups (2 x 2) need 4 ranks; the launches above run at 2 (groups of one)
    run = run_torchrun if launcher == "torchrun" else run_ranks
    proc = run(4, WORKER, "iris", "sub_groups", "new_group", timeout=600, env=ENV)
    out = proc.stdout + proc.stderr
    assert re.findall(r"^PASS (\w+) \(", proc.stdout, re.M) == ["sub_groups", "new_group"], out
    assert "CHECK sub-groups tp 2 dp 2 ddp bit-identical" in proc.stdout, out
    assert f", 4 ranks, cpu, {'torch' if launcher == 'torchrun' else 'mpi'})" in proc.stdout, out


# --- pieces, no launch ----------------------------------------------------------------------------------

def test_heap_size_from_options_and_environment(monkeypatch):
    monkeypatch.delenv(idist.HEAP_SIZE_ENV, raising=False)
    import iris.runtime

    assert _context.heap_size_of(None) == iris.runtime.DEFAULT_HEAP_SIZE
    monkeypatch.setenv(idist.HEAP_SIZE_ENV, "512M")
    assert _context.heap_size_of(None) == 512 << 20
    assert _context.heap_size_of(idist.Options(heap_size=1 << 20)) == 1 << 20  # the option wins
    for text, size in (("1073741824", 1 << 30), ("2G", 2 << 30), ("1.5GiB", 3 << 29), ("64k", 64 << 10)):
        assert _context.parse_size(text) == size, text
    for bad in ("", "-1", "lots", "0"):
        expect_error(lambda bad=bad: _context.parse_size(bad), IrisUsageError, "IRIS_DIST_HEAP_SIZE", "512M")
    expect_error(lambda: _context.heap_size_of(idist.Options(heap_size=-5)), IrisUsageError, "heap_size=-5")
    expect_error(lambda: _context.check_options("big"), IrisUsageError, "pg_options must be")


def test_reductions_by_name():
    names = {dist.ReduceOp.SUM: "sum", dist.ReduceOp.AVG: "avg", dist.ReduceOp.MAX: "max",
             dist.ReduceOp.MIN: "min", dist.ReduceOp.PRODUCT: "prod"}
    for op, name in names.items():
        options = dist.AllreduceOptions()
        options.reduceOp = op
        assert _convert.op_name("x", options.reduceOp) == name
        assert _convert.op_name("x", op) == name
    for op in (dist.ReduceOp.BAND, dist.ReduceOp.BOR, dist.ReduceOp.BXOR):
        expect_error(lambda op=op: _convert.op_name("call", op), IrisUnsupportedError, "call", "gloo")


def test_any_dtype_moves_as_words():
    # whole aligned words are moved in place (a view); other byte counts through a padded buffer
    t = torch.arange(8, dtype=torch.uint8)
    view = _convert.words(t)
    assert view.dtype == torch.int32 and view.numel() == 2 and view.data_ptr() == t.data_ptr()
    assert _convert.words(torch.ones(3, dtype=torch.float32)).dtype == torch.float32  # ccl's own dtype
    assert _convert.words(torch.arange(7, dtype=torch.uint8)) is None
    assert _convert.words(torch.arange(9, dtype=torch.uint8)[1:]) is None  # not on a word boundary
    for t in (torch.arange(7, dtype=torch.uint8), torch.tensor([True, False, True]), torch.arange(5, dtype=torch.int8)):
        buffer = _convert.padded(t)
        assert buffer.dtype == torch.int32 and buffer.numel() == -(-t.numel() // 4)
        back = torch.zeros_like(t)
        _convert.unpad(buffer, back)
        assert torch.equal(back, t)


def test_registered_once_and_groups_of_some_ranks_know_their_members(monkeypatch):
    assert "IRIS" in dist.Backend._plugins and dist.Backend.IRIS == "iris"
    idist.register()  # again: nothing happens (older torch raised on a second registration)
    assert dist.Backend.backend_capability["iris"] == ["cpu", "cuda"]

    class BackendOptions:  # what torch passes (_DistributedBackendOptions)
        store, group_rank, group_size, timeout = None, 0, 2, datetime.timedelta(seconds=30)
        global_ranks_in_group = [0, 2]

    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 4)
    some = _backend.create(BackendOptions(), None)
    assert isinstance(some, idist.IrisProcessGroup) and some._members == (0, 2) and some.size() == 2
    # its context is made over the members through the group's store: without one, a clear error
    expect_error(lambda: _context.make_member_context(None, (0, 2), 0, None, None, "call"), IrisUsageError,
                 "ranks [0, 2]", "no store")
    BackendOptions.global_ranks_in_group = [0, 1, 2, 3]
    group = _backend.create(BackendOptions(), idist.Options(heap_size=1 << 20))
    assert isinstance(group, idist.IrisProcessGroup) and group.size() == 2 and group.getBackendName() == "iris"
    assert group._members is None  # all ranks: the default group's context
    group._set_group_name("7")  # torch names it; destroy_process_group(group) reads it back
    assert group.group_name == "7"


def test_a_member_that_never_comes_is_named_within_the_limit(monkeypatch):
    # the members of a group of some of the ranks meet through the group's store first: a member
    # that skips the group's first call is named after IRIS_TIMEOUT_S, not waited for forever
    from iris.runtime import IrisBootstrapError

    store = dist.HashStore()
    store.set("iris-member/1", "7")  # group rank 1 (default-group rank 2) came; rank 2 (5) did not
    monkeypatch.setenv("IRIS_TIMEOUT_S", "0.5")
    expect_error(lambda: _context.meet(store, (0, 2, 5), 0, "3", "the call"), IrisBootstrapError,
                 "the call", "0.5 s", "ranks [0, 2, 5]", "rank(s) [5]")
    store.set("iris-member/2", "9")
    assert _context.meet(store, (0, 2, 5), 0, "3", "the call") == ["3", "7", "9"]


def test_rendezvous_from_mpi_only_when_an_mpi_launcher_left_it_out():
    assert not _rendezvous.needs_mpi({})  # plain python
    assert not _rendezvous.needs_mpi({"PMI_RANK": "0", "PMI_SIZE": "2", "TORCHELASTIC_RUN_ID": "x"})
    assert _rendezvous.needs_mpi({"PMI_RANK": "0", "PMI_SIZE": "2"})
    assert _rendezvous.needs_mpi({"OMPI_COMM_WORLD_SIZE": "2", "RANK": "0", "WORLD_SIZE": "2"})
    full = {"OMPI_COMM_WORLD_SIZE": "2", "RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "1"}
    assert not _rendezvous.needs_mpi(full)
    env = dict(full)
    assert _rendezvous.fill_from_mpi(env) is False and env == full
