"""Checks that need no launch: argument errors raised before MPI is touched, the error
hierarchy, and the public names."""

from __future__ import annotations

import contextlib
import io
import mmap
import os
import signal
import sys
import threading

import pytest
import torch

import iris.runtime
from iris.runtime import IrisBackendError, IrisError, IrisUsageError, testing
from iris.runtime._backend import gpu_usable


@pytest.mark.skipif(gpu_usable(), reason="a CUDA GPU is usable here, so backend='cuda' is valid; "
                                         "the no-GPU error can only be seen on a machine without one")
def test_cuda_backend_without_gpu_names_the_fix():
    with pytest.raises(IrisBackendError) as info:
        iris.runtime.iris(heap_size=1 << 20, backend="cuda")
    text = str(info.value)
    assert "backend='cuda'" in text and "no usable CUDA GPU" in text and "backend='cpu'" in text
    assert isinstance(info.value, IrisError)


@pytest.mark.skipif(gpu_usable(), reason="a CUDA GPU is usable here; the no-GPU error needs a machine without one")
def test_nvshmem_backend_without_gpu_names_the_fix():
    with pytest.raises(IrisBackendError, match=r"backend='nvshmem'.*no usable CUDA GPU.*backend='cpu'"):
        iris.runtime.iris(heap_size=1 << 20, backend="nvshmem")


def test_missing_nvshmem4py_names_the_install_command(monkeypatch):
    import builtins

    from iris.runtime._heap_nvshmem import nvshmem_modules

    real_import = builtins.__import__

    def no_nvshmem(name, *args, **kwargs):
        if name.startswith("nvshmem"):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_nvshmem)
    with pytest.raises(IrisBackendError, match=r"nvshmem4py is not installed.*pip install 'iris-runtime\[nvshmem\]'"):
        nvshmem_modules()


def test_force_remote_switch(monkeypatch):
    from iris.device._nvshmem import force_remote_selected

    assert not force_remote_selected({})
    assert force_remote_selected({"IRIS_NVSHMEM_FORCE_REMOTE": "1"})


@pytest.mark.parametrize("backend", ["gpu", "CUDA", "rocm"])
def test_unknown_backend(backend):
    with pytest.raises(IrisUsageError, match=rf"backend={backend!r}.*one of \('auto', 'cuda', 'nvshmem', 'cpu'\)"):
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
    assert iris.runtime.DEFAULT_BACKEND in ("cpu", "cuda", "nvshmem", "auto")
    for method in ("barrier", "broadcast", "get_heap_bases", "get_device_context", "get_rank", "get_num_ranks",
                   "as_symmetric", "is_symmetric", "free", "close", "empty", "zeros", "ones", "full", "arange",
                   "linspace", "rand", "randn", "randint", "uniform", "empty_like", "zeros_like", "ones_like",
                   "full_like", "rand_like", "randn_like", "randint_like"):
        assert getattr(iris.runtime.Iris, method).__doc__, method


def test_fit_per_sm_takes_the_tightest_limit():
    from types import SimpleNamespace

    from iris.runtime._residency import fit_per_sm

    h200 = SimpleNamespace(regs_per_multiprocessor=65536, max_threads_per_multi_processor=2048,
                           shared_memory_per_multiprocessor=233472)
    assert fit_per_sm(32, 4, 0, h200) == 16          # threads: 2048 / 128
    assert fit_per_sm(255, 4, 0, h200) == 2          # registers: 255 -> 256 per thread, 32 K per program
    assert fit_per_sm(40, 4, 0, h200) == 12          # 40 -> 1280 per warp (units of 256)
    assert fit_per_sm(32, 1, 0, h200) == 32          # the hardware's 32 blocks per SM
    assert fit_per_sm(32, 4, 100 * 1024, h200) == 2  # shared memory, 1 KiB reserved per block
    assert fit_per_sm(128, 8, 0, h200) == 2


def test_programs_per_sm_rejects_what_is_not_compiled():
    from iris.runtime._residency import programs_per_sm

    with pytest.raises(IrisUsageError, match=r"programs_per_sm\(\): got function, not a compiled Triton kernel"):
        programs_per_sm(lambda: None, None)


class _NotYetLoaded:
    """Like the CompiledKernel that ``kernel.warmup`` returns: ``n_regs`` appears only once the
    module is loaded (Triton does that at the first launch)."""

    def __init__(self, regs, warps):
        from types import SimpleNamespace

        self.metadata = SimpleNamespace(num_warps=warps, shared=0)
        self._regs = regs

    def _init_handles(self):
        self.n_regs = self._regs


@pytest.fixture
def h200(monkeypatch):
    from types import SimpleNamespace

    import torch

    props = SimpleNamespace(regs_per_multiprocessor=65536, max_threads_per_multi_processor=2048,
                            shared_memory_per_multiprocessor=233472, multi_processor_count=132)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: props)
    return props


def test_programs_per_sm_loads_a_kernel_that_never_ran(h200):
    from iris.runtime._residency import programs_per_sm

    assert programs_per_sm(_NotYetLoaded(255, 4), None) == 2


def test_resident_grid_shares_the_gpu_between_ranks(h200):
    from iris.runtime._residency import resident_grid

    # one rank per GPU: as many programs as every SM holds (2 per SM of 4 warps x 255 registers)
    assert resident_grid(_NotYetLoaded(255, 4), 10**6, None, 1) == 2 * 132
    assert resident_grid(_NotYetLoaded(32, 4), 10**6, None, 1) == 16 * 132
    # ranks sharing the GPU: one waiting program per SM among all of them, whatever fits per SM
    assert resident_grid(_NotYetLoaded(255, 4), 10**6, None, 4) == 132 // 4
    assert resident_grid(_NotYetLoaded(32, 4), 10**6, None, 8) == 132 // 8
    assert resident_grid(_NotYetLoaded(32, 4), 10**6, None, 132) == 1
    assert resident_grid(_NotYetLoaded(255, 4), 10, None, 4) == 10
    with pytest.raises(IrisUsageError, match=r"resident_grid\(\): got object, not a compiled Triton kernel"):
        resident_grid(object(), 5, None, 1)
    # 16 warps of 255 registers do not fit on an SM at all
    with pytest.raises(IrisUsageError, match=r"resident_grid\(\): 2 ranks share None \(132 SMs, 0 programs"):
        resident_grid(_NotYetLoaded(255, 16), 5, None, 2)
    with pytest.raises(IrisUsageError,
                       match=r"resident_grid\(\): 133 ranks share None .* fewer ranks per GPU \(at most one per SM\)"):
        resident_grid(_NotYetLoaded(32, 4), 5, None, 133)


@pytest.mark.parametrize("timeout_s", [-1, "300", True, float("nan")])
def test_bad_watchdog_timeout(timeout_s):
    with pytest.raises(IrisUsageError, match=r"timeout_s=.*seconds >= 0 \(0 switches the watchdog off"):
        iris.runtime.iris(heap_size=1 << 20, timeout_s=timeout_s)


def test_bad_watchdog_timeout_in_the_environment(monkeypatch):
    from iris.device._watchdog import timeout_from_env

    monkeypatch.setenv("IRIS_TIMEOUT_S", "five minutes")
    with pytest.raises(IrisUsageError, match=r"IRIS_TIMEOUT_S='five minutes'.*seconds >= 0"):
        timeout_from_env()
    monkeypatch.setenv("IRIS_TIMEOUT_S", "0")
    assert timeout_from_env() == 0.0
    monkeypatch.delenv("IRIS_TIMEOUT_S")
    assert timeout_from_env() == 60.0


class _WordHeap:
    """A heap of int32 words at made-up addresses, read and written like a real heap's host words;
    ``unreadable`` addresses answer None (a word that could not be read in time)."""

    def __init__(self, bases, words, unreadable=()):
        self.bases, self.words, self.unreadable, self.writes = bases, dict(words), set(unreadable), []

    def read_int32(self, address, timeout_s=1.0):
        return None if address in self.unreadable else self.words.get(address, 0)

    def write_int32(self, address, value, timeout_s=1.0):
        self.writes.append((address, value))
        self.words[address] = value
        return True


def test_watchdog_names_the_ranks_whose_call_counter_is_behind():
    # The device reports the address of its call counter for the tile; the host reads every
    # rank's counter at the same offset of its heap and names those below this rank's.
    from iris.runtime._watchdog import Watchdog

    bases = [0x10000, 0x20000, 0x30000, 0x40000]
    counter = 0x120  # the same offset on every rank
    heap = _WordHeap(bases, {b + counter: calls for b, calls in zip(bases, (5, 4, 5, 3))})
    dog = Watchdog(rank=2, world_size=4, device=torch.device("cpu"), timeout_s=0, heap=heap, heap_size=0x1000)
    assert dog.ranks_behind(bases[2] + counter) == 0b1010  # ranks 1 and 3 made fewer calls than rank 2
    assert dog.ranks_behind(0) == 0  # the wait had no counter
    heap.unreadable = {bases[3] + counter}
    assert dog.ranks_behind(bases[2] + counter) == 0b0010  # an unreadable peer is not named
    heap.unreadable = {bases[2] + counter}
    assert dog.ranks_behind(bases[2] + counter) == 0  # nothing to compare with
    dog.close()


def test_watchdog_drains_every_rank_and_never_lowers_a_drain_word():
    from iris.device import _watchdog as device_watchdog
    from iris.runtime._watchdog import Watchdog

    bases, size = [0x100000, 0x200000, 0, 0x400000], 0x1000  # rank 2: another node's heap (nvshmem)
    drain = [b + size + device_watchdog.DRAIN_OFFSET for b in bases]
    heap = _WordHeap(bases, {drain[1]: device_watchdog.DRAIN_FAILED})
    dog = Watchdog(rank=0, world_size=4, device=torch.device("cpu"), timeout_s=0, heap=heap, heap_size=size)
    assert dog.drain_all(device_watchdog.DRAIN_TIMED_OUT) == 3
    assert heap.writes == [(drain[0], device_watchdog.DRAIN_TIMED_OUT), (drain[3], device_watchdog.DRAIN_TIMED_OUT)]
    assert heap.words[drain[1]] == device_watchdog.DRAIN_FAILED  # a failed rank's word stays
    assert dog.drain_all() == 3 and heap.words[drain[0]] == device_watchdog.DRAIN_FAILED  # raised further
    dog.close()


def test_watchdog_report_names_rank_call_flag_tile_values_and_peer():
    from iris.device import _watchdog as device_watchdog
    from iris.runtime._watchdog import Watchdog, describe

    def words(state, call, flag, rank, peer, index, seen, target, waited_ns, calls=0):
        return [state, device_watchdog.WAIT_CALLS.index(call), device_watchdog.WAIT_FLAGS.index(flag), rank, peer,
                index, seen, target, waited_ns, calls, 0, 0]

    timed_out = describe(words(1, "iris.collectives.all_reduce_one_shot", "arrivals", 2, -1, 7, 3, 4, 5_200_000_000),
                         world_size=4, timeout_s=5)
    for text in ("rank 2 waited 5.2 s in iris.collectives.all_reduce_one_shot on flag 'arrivals' of tile/slot 7",
                 "it holds 3, expected >= 4", "still missing: 1 arrival(s) from the other 3 ranks", "(5 s)",
                 "IRIS_TIMEOUT_S"):
        assert text in timed_out, (text, timed_out)
    named = describe(words(1, "iris.collectives.all_reduce_two_shot", "done", 0, -1, 2, 5, 6, 10**9), 4, 5,
                     behind=0b1010)
    assert "still missing: rank(s) 1, 3, which had not made this call on the tile" in named, named
    drained = describe(words(2, "iris.collectives.all_reduce_ring", "credit", 0, 1, 0, 0, 1, 10**9), 2, 5)
    assert "rank 0 stopped waiting after 1.0 s in iris.collectives.all_reduce_ring on flag 'credit'" in drained
    assert "still missing: peer 1" in drained and "a wait timed out on some rank" in drained
    assert "still missing: peer 0" in describe(words(1, "iris.collectives.device_barrier", "arrivals", 1, -1, 0, 1, 2,
                                                     0), 2, 5)
    # check() raises once a report is there; timeout 0 starts no thread, so nothing aborts here
    dog = Watchdog(rank=0, world_size=2, device=torch.device("cpu"), timeout_s=0)
    dog.check("barrier()")
    dog.record.copy_(torch.tensor(words(1, "iris.collectives.reduce_scatter", "done", 0, 1, 3, 0, 1, 3 * 10**9)))
    with pytest.raises(iris.runtime.IrisTimeoutError, match=r"barrier\(\): iris watchdog: rank 0 waited 3.0 s in "
                                                            r"iris.collectives.reduce_scatter on flag 'done'"):
        dog.check("barrier()")
    dog.close()
    # the waiting rank is the watchdog's own, whatever rank word the kernel wrote (read from the
    # table it was passed), and the peer of two follows it
    dog = Watchdog(rank=1, world_size=2, device=torch.device("cpu"), timeout_s=0)
    dog.record.copy_(torch.tensor(words(1, "iris.collectives.device_barrier", "arrivals", 0, -1, 0, 1, 2, 10**9)))
    assert dog.report().startswith("iris watchdog: rank 1 waited 1.0 s") and "still missing: peer 0" in dog.report()
    dog.close()


def test_watchdog_report_names_the_tag_of_a_message_and_a_size_mismatch():
    from iris.device import _watchdog as device_watchdog
    from iris.runtime._watchdog import describe

    def words(state, call, flag, rank, peer, index, seen, target):
        return [state, device_watchdog.WAIT_CALLS.index(call), device_watchdog.WAIT_FLAGS.index(flag), rank, peer,
                index, seen, target, 3 * 10**9, 0]

    recv = describe(words(1, "iris.collectives.ccl.recv", "ready", 2, 1, 5, 0, 1), world_size=4, timeout_s=3)
    for text in ("rank 2 waited 3.0 s in iris.collectives.ccl.recv on flag 'ready' of tag 5", "still missing: peer 1",
                 "Rank 1 did not make the matching send to rank 2 with tag 5", "IRIS_TIMEOUT_S"):
        assert text in recv, (text, recv)
    send = describe(words(1, "iris.collectives.ccl.send", "credit", 0, 3, 0, 2, 3), world_size=4, timeout_s=3)
    assert "Rank 3 did not make the matching recv from rank 0 with tag 0" in send, send
    # a send that waits for its receive names the exchange that waits both ways, and the fix
    for flag in ("credit", "request", "done"):
        text = describe(words(1, "iris.collectives.ccl.send", flag, 0, 1, 0, 0, 5), world_size=2, timeout_s=3)
        assert "ranks that send each other such messages before receiving wait for each other" in text, text
        assert "ccl.batch_isend_irecv" in text, text
    assert "batch_isend_irecv" not in recv, recv
    sent = device_watchdog.message_header(10, "bfloat16")
    expected = device_watchdog.message_header(12, "float32")
    mismatch = describe(words(device_watchdog.STATE_SIZE_MISMATCH, "iris.collectives.ccl.recv", "message size", 1, 0,
                              3, sent, expected), world_size=2, timeout_s=3)
    for text in ("iris watchdog: iris.collectives.ccl.recv: rank 1 received a message from rank 0 with tag 3 of "
                 "10 x bfloat16, but this call expects 12 x float32", "same number of elements and dtype",
                 "Ending the job"):
        assert text in mismatch, (text, mismatch)


def test_watchdog_report_says_which_rows_did_not_fit():
    # A variable-size exchange whose rows do not fit: no wait ran out, the report names the call,
    # the rank, what overflowed (the output, a local expert, the input's splits) and both sizes
    from iris.device import _watchdog as device_watchdog
    from iris.runtime._watchdog import describe

    def words(call, flag, rank, index, seen, target):
        return [device_watchdog.STATE_CAPACITY, device_watchdog.WAIT_CALLS.index(call),
                device_watchdog.WAIT_FLAGS.index(flag), rank, -1, index, seen, target, 0, 0, 0]

    out = describe(words("iris.collectives.ccl.all_to_all_v", "out rows", 2, 0, 70, 64), world_size=4, timeout_s=3)
    for text in ("iris watchdog: iris.collectives.ccl.all_to_all_v: rank 2 receives 70 rows but its output holds 64",
                 "larger output", "Ending the job"):
        assert text in out, (text, out)
    expert = describe(words("iris.collectives.moe.dispatch", "expert rows", 1, 3, 9, 8), world_size=2, timeout_s=3)
    assert "rank 1 receives 9 rows for its local expert 3 but expert_capacity is 8" in expert, expert
    splits = describe(words("iris.collectives.ccl.all_to_all_v", "inp rows", 0, 0, 12, 10), world_size=2, timeout_s=3)
    assert "rank 0's in_splits add up to 12 rows" in splits and "inp has 10 rows" in splits, splits


@pytest.mark.skipif(not os.path.isdir(testing.SHM_DIR), reason="no /dev/shm here: MPICH keeps no segments there")
def test_dead_mpich_segments_are_removed_and_live_ones_kept(monkeypatch):
    monkeypatch.setattr(testing, "_YOUNG_S", 0.3)  # keeps the test short; the rule is the same
    before = set(os.listdir(testing.SHM_DIR))
    names = [f"mpich_shm_iristest{os.getpid()}_{i}" for i in range(3)]
    paths = [os.path.join(testing.SHM_DIR, n) for n in names]
    for path in paths:
        with open(path, "wb") as f:
            f.write(b"\0" * 4096)
    live = open(paths[0], "r+b")
    mapping = mmap.mmap(live.fileno(), 4096)  # a running job's segment: this process maps it
    other = os.path.join(testing.SHM_DIR, f"iris-heap-iristest{os.getpid()}")  # not MPICH's: never touched
    open(other, "wb").close()
    try:
        removed = testing.remove_dead_mpich_segments(before)
        assert sorted(removed) == sorted(paths[1:]), removed
        assert os.path.exists(paths[0]) and os.path.exists(other)
        assert not any(os.path.exists(p) for p in paths[1:])
        assert testing.remove_dead_mpich_segments(set(os.listdir(testing.SHM_DIR))) == []  # nothing new since
    finally:
        mapping.close()
        live.close()
        for path in [*paths, other]:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)


def test_an_interrupted_job_says_how_far_it_got(monkeypatch):
    # A suite ended by an outer deadline (SIGINT, tools/gpu-tests.sh) kills the job it was running
    # and prints the end of that job's output, which pytest would not report.
    shown = io.StringIO()
    monkeypatch.setattr(sys, "__stderr__", shown)
    # Python turns SIGINT into KeyboardInterrupt only where its parent did not ignore the signal (a
    # shell's background job ignores it): set Python's handler for the test's length.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    timer = threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            testing.run_command(["bash", "-c", "echo PASS first_scenario; echo still working >&2; sleep 60"],
                                timeout=30)
    finally:
        timer.cancel()
        signal.signal(signal.SIGINT, previous)
    text = shown.getvalue()
    assert "interrupted after" in text and "PASS first_scenario" in text and "still working" in text, text


def test_gpu_ranks_override_of_the_residency_rule(monkeypatch):
    from iris.runtime._residency import gpu_sharers, waiting_programs_limit

    monkeypatch.delenv("IRIS_GPU_RANKS", raising=False)
    assert gpu_sharers() == 0
    monkeypatch.setenv("IRIS_GPU_RANKS", "16")
    assert gpu_sharers() == 16
    # 132 SMs shared by the 16 ranks of every job: 8 waiting programs per rank, 128 in all
    assert waiting_programs_limit(4, 132, max(4, gpu_sharers())) == 8
    for bad in ("-2", "four", "1.5"):
        monkeypatch.setenv("IRIS_GPU_RANKS", bad)
        with pytest.raises(IrisUsageError, match=r"IRIS_GPU_RANKS='.*': set the number of ranks"):
            gpu_sharers()


def test_compile_lock_lets_one_process_compile_a_kernel_while_the_others_wait(tmp_path, monkeypatch):
    """IRIS_COMPILE_LOCK: a compilation holds the kernel's lock, so a second process asking for the
    same kernel at once waits for it (and then finds it in Triton's cache) instead of compiling
    it again; another kernel does not wait."""
    import fcntl

    from iris.runtime import _compile_lock

    monkeypatch.setattr(_compile_lock, "lock_folder", lambda: str(tmp_path))

    class Source:
        def __init__(self, text):
            self.text = text

        def hash(self):
            return self.text

    held = []

    def fake_compile(src, target=None, options=None, _env_vars=None):
        path = tmp_path / _compile_lock.lock_key(src, target, options)
        fd = os.open(path, os.O_RDWR)
        try:  # another open file description of the same file cannot lock it while we hold it
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            held.append(False)
        except BlockingIOError:
            held.append(True)
        finally:
            os.close(fd)
        return src.text

    import triton.compiler

    monkeypatch.setattr(triton.compiler, "compile", fake_compile)
    monkeypatch.setattr(_compile_lock, "_INSTALLED", False)
    assert _compile_lock.install_from_env("cuda") is False  # off unless asked
    monkeypatch.setenv("IRIS_COMPILE_LOCK", "1")
    assert _compile_lock.install_from_env("cpu") is False  # the interpreter compiles nothing
    assert _compile_lock.install_from_env("cuda") is True
    assert triton.compiler.compile(Source("k1"), target="sm90", options={"num_warps": 4}) == "k1"
    assert held == [True]  # compiled under the kernel's lock
    keys = {_compile_lock.lock_key(Source(s), "sm90", {"num_warps": w}) for s in ("k1", "k2") for w in (4, 8)}
    assert len(keys) == 4  # another source or other options: another lock


def test_call_agreement_exchanges_when_asked_and_names_another_exchange():
    """A cached signature makes no exchange unless ``always`` (init_p2p, whose next step is another
    host exchange); a row that is not an agreement's (another host exchange met this one) is named,
    not unpacked."""
    import types

    from iris.runtime import IrisCallMismatchError, _agreement

    sent, replies = [], []

    class Boot:
        def allgather(self, row):
            sent.append(row)
            return [row, replies.pop(0) if replies else row]

    ctx = types.SimpleNamespace(world_size=2, _boot=Boot(),
                                _host_waits=types.SimpleNamespace(label=lambda text: contextlib.nullcontext()))
    calls = _agreement.CallAgreement(ctx)
    fp = calls.agree(("sig",), lambda: "call(x=1)", "call")
    assert calls.agree(("sig",), lambda: "call(x=1)", "call") == fp and len(sent) == 1  # cached: no exchange
    assert calls.agree(("sig",), lambda: "call(x=1)", "call", always=True) == fp and len(sent) == 2
    assert sent[1] == (2, "call(x=1)") and calls.count == 2 and len(calls) == 1
    replies.append((3, "call(x=2)"))
    with pytest.raises(IrisCallMismatchError, match=r"rank 0 called call\(x=1\) \(agreement #3\); rank 1 called "
                                                    r"call\(x=2\)"):
        calls.agree(("sig",), lambda: "call(x=1)", "call", always=True)
    replies.append(("iris.collectives.ccl.init_p2p", (4, 2)))  # another host exchange met this one
    with pytest.raises(IrisCallMismatchError, match="rank 1 made another host collective call, not the agreement"):
        calls.agree(("new",), lambda: "call(x=3)", "call")


def test_spread_shares_a_product_out_among_the_world_sizes(monkeypatch):
    from iris.runtime.testing import spread

    cases = [(d, op) for d in ("fp32", "bf16", "int32") for op in ("sum", "max")]
    monkeypatch.setenv("IRIS_TEST_WORLD_SIZES", "2,4")
    monkeypatch.delenv("IRIS_TEST_SPREAD_CASES", raising=False)
    assert spread(iter(cases), 2) == cases  # off by default: every case at every world size
    monkeypatch.setenv("IRIS_TEST_SPREAD_CASES", "1")
    two, four = spread(cases, 2), spread(cases, 4)
    assert sorted(two + four) == sorted(cases) and not set(two) & set(four)  # each case once
    assert {d for d, _ in two} == {d for d, _ in four} == {"fp32", "bf16", "int32"}
    assert {op for _, op in two} == {op for _, op in four} == {"sum", "max"}
    assert spread(cases, 3) == cases  # a world size the suite does not list (a test's own) runs all
    monkeypatch.setenv("IRIS_TEST_SPREAD_CASES", "0")
    assert spread(cases, 4) == cases


def test_scenario_params_split_the_scenarios_over_jobs_only_when_asked(monkeypatch):
    from iris.runtime.testing import scenario_params

    names = ["a", "b", "c", "d", "e"]
    monkeypatch.delenv("IRIS_TEST_SCENARIO_PARTS", raising=False)
    whole = scenario_params([2, 4], names)
    assert [(p.id, p.values) for p in whole] == [("2", (2, names)), ("4", (4, names))]  # ids as before
    monkeypatch.setenv("IRIS_TEST_SCENARIO_PARTS", "3")
    parts = scenario_params([2, 4], names)
    assert [p.id for p in parts] == ["2-part1of3", "2-part2of3", "2-part3of3", "4-part1of3", "4-part2of3",
                                     "4-part3of3"]
    assert [p.values[1] for p in parts[:3]] == [["a", "d"], ["b", "e"], ["c"]]  # in turn, each scenario once
    monkeypatch.setenv("IRIS_TEST_SCENARIO_PARTS", "9")  # more parts than scenarios: no empty job
    assert [p.values[1] for p in scenario_params([2], names)] == [[n] for n in names]


def test_scenario_params_keep_only_the_scenarios_named(monkeypatch):
    from iris.runtime.testing import scenario_params

    names = ["a", "b", "c", "d"]
    monkeypatch.delenv("IRIS_TEST_SCENARIO_PARTS", raising=False)
    monkeypatch.setenv("IRIS_TEST_SCENARIOS", "d, b,zz")
    assert [(p.id, p.values) for p in scenario_params([2, 4], names)] == [("2", (2, ["b", "d"])),
                                                                           ("4", (4, ["b", "d"]))]
    monkeypatch.setenv("IRIS_TEST_SCENARIO_PARTS", "2")
    assert [p.values[1] for p in scenario_params([2], names)] == [["b"], ["d"]]
    monkeypatch.setenv("IRIS_TEST_SCENARIOS", "zz")  # a worker with none of them: no job
    assert scenario_params([2, 4], names) == []
    monkeypatch.setenv("IRIS_TEST_SCENARIOS", "")
    assert len(scenario_params([2], names)) == 2


def test_a_job_about_to_reach_the_launchers_limit_prints_every_threads_stack():
    import subprocess
    import sys

    # The launcher's limit as the process sees it once its imports are done (slow on a loaded
    # machine: a fixed MPIEXEC_TIMEOUT of 25 s left no time to arm the dump when they took 5 s):
    # the dump fires 5 s later, both threads asleep.
    code = ("import os, threading, time\n"
            "from iris.runtime.testing import dump_stacks_before_the_launchers_limit, process_age_s\n"
            "os.environ['MPIEXEC_TIMEOUT'] = str(process_age_s() + 25)\n"
            "dump_stacks_before_the_launchers_limit(margin_s=20)\n"
            "threading.Thread(target=time.sleep, args=(7,), name='watchdog-like').start()\n"
            "time.sleep(7)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=90)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count("most recent call first") >= 2, proc.stderr  # the main thread and the other


def test_context_tensor_points_at_the_call_words_in_the_signal_pad():
    # Collective kernels find the call agreement's words at heap_base + call_words_offset, with no
    # other word of the context (iris.device._calls): the runtime writes the offset of the words in
    # the signal pad, which starts at heap_base + heap_size and reserves its last bytes for them.
    from iris.device import _layout as layout
    from iris.runtime._context import build_context

    heap_size, W = 3 << 20, 3
    words = build_context(1, W, [1 << 30, 2 << 30, 3 << 30], heap_size, torch.device("cpu")).tolist()
    pad_words = heap_size + layout.SIGNAL_PAD_BYTES - layout.PAD_RESERVED_BYTES
    assert words[layout.HEAP_BASES + W + layout.CALL_WORDS_OFFSET] == pad_words
    assert words[layout.HEAP_BASES + W + layout.HEAP_SIZE] == heap_size
