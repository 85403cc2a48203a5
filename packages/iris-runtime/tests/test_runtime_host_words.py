"""The host's word access to a GPU heap (``HostWordAccess``), with a stand-in for the CUDA runtime.

The watchdog thread and the main thread both read peers' call counters when a wait runs out; both
go through one pinned host word on one private stream. On an H200 the two threads read each
other's values, and the watchdog named no rank for a skipped collective. The stand-in below copies
only when the stream is queried, after a pause, as a real asynchronous copy may complete late.
"""

from __future__ import annotations

import ctypes
import threading
import time

import pytest
import torch

from iris.runtime import _heap_cuda

NOT_READY = 600


class FakeRuntime:
    """The few cuda-bindings runtime calls ``HostWordAccess`` makes; copies run at query time."""

    class cudaMemcpyKind:
        cudaMemcpyDeviceToHost = 2
        cudaMemcpyHostToDevice = 1

    class cudaError_t:
        cudaErrorNotReady = NOT_READY

    cudaStreamNonBlocking = 1

    def __init__(self):
        self.pending: list[tuple[int, int]] = []
        self.lock = threading.Lock()

    def cudaStreamCreateWithFlags(self, flags):
        return 0, "stream"

    def cudaMemcpyAsync(self, dst, src, size, kind, stream):
        with self.lock:
            self.pending.append((dst, src))
        return (0,)

    def cudaStreamQuery(self, stream):
        time.sleep(0.0005)  # the copy takes a while; another thread runs meanwhile
        with self.lock:
            for dst, src in self.pending:
                ctypes.memmove(dst, src, 4)
            self.pending.clear()
        return (0,)


class Words(_heap_cuda.HostWordAccess):
    def __init__(self):
        self._word_stream = "stream"
        self._word_host = torch.zeros(1, dtype=torch.int32)  # pinned on a GPU machine; any host word here


@pytest.fixture
def fake_cuda(monkeypatch):
    runtime = FakeRuntime()
    monkeypatch.setattr(_heap_cuda, "_cuda", lambda: (None, runtime))
    return runtime


def test_two_threads_read_their_own_words(fake_cuda):
    words = Words()
    device_words = torch.tensor([111, 222], dtype=torch.int32)  # stand-ins for two ranks' counters
    addresses = [device_words.data_ptr(), device_words.data_ptr() + 4]
    wrong: list[tuple[int, int | None]] = []

    def reader(i):
        for _ in range(200):
            got = words.read_int32(addresses[i])
            if got != int(device_words[i]):
                wrong.append((i, got))

    threads = [threading.Thread(target=reader, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not wrong, f"{len(wrong)} of 400 reads returned another thread's word, e.g. {wrong[:3]}"


def test_writes_and_reads_from_two_threads(fake_cuda):
    words = Words()
    device_words = torch.zeros(2, dtype=torch.int32)
    addresses = [device_words.data_ptr(), device_words.data_ptr() + 4]

    def writer(i):
        for n in range(1, 101):
            assert words.write_int32(addresses[i], 1000 * (i + 1) + n)
            assert words.read_int32(addresses[i]) == 1000 * (i + 1) + n

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert device_words.tolist() == [1100, 2100]


def test_a_copy_that_never_completes_gives_none_within_the_timeout(fake_cuda, monkeypatch):
    words = Words()
    monkeypatch.setattr(fake_cuda, "cudaStreamQuery", lambda stream: (NOT_READY,))
    word = torch.tensor([7], dtype=torch.int32)
    start = time.monotonic()
    assert words.read_int32(word.data_ptr(), timeout_s=0.2) is None
    assert time.monotonic() - start < 2.0


def test_the_copies_stream_is_made_with_the_heap_not_by_the_watchdog(fake_cuda, monkeypatch):
    # Made on first use, by the watchdog thread after a kernel timed out, the stream's creation
    # waited for that spinning kernel on the GPU: the watchdog hung and never reported. Now the
    # heap makes it (and the pinned word) when it is created, and a read makes no stream.
    made = []
    monkeypatch.setattr(fake_cuda, "cudaStreamCreateWithFlags", lambda flags: made.append(flags) or (0, "stream"))
    monkeypatch.setattr(_heap_cuda, "_pinned_word", lambda: torch.zeros(1, dtype=torch.int32))

    class Heap(_heap_cuda.HostWordAccess):
        def __init__(self):
            self._prepare_word_copies()

    words = Heap()
    assert made == [FakeRuntime.cudaStreamNonBlocking]

    def hangs(flags):
        raise AssertionError("a stream made while a kernel may spin")

    monkeypatch.setattr(fake_cuda, "cudaStreamCreateWithFlags", hangs)
    word = torch.tensor([41], dtype=torch.int32)
    assert words.read_int32(word.data_ptr()) == 41
    assert words.write_int32(word.data_ptr(), 42) and int(word[0]) == 42


def test_a_copy_call_that_blocks_gives_none_and_later_copies_do_not_wait(fake_cuda, monkeypatch):
    # On the GPU cudaMemcpyAsync itself did not return while the main thread sat in a synchronous
    # copy (x.tolist()) waiting for a kernel that spun until the watchdog acknowledged its report:
    # the watchdog thread, reading a word for that report, hung with it. Now the copy gives None
    # within its timeout, later copies give None at once while it is held up, and once the call
    # returns copies work again.
    words = Words()
    release = threading.Event()
    copy = fake_cuda.cudaMemcpyAsync

    def blocks(dst, src, size, kind, stream):
        release.wait()
        return copy(dst, src, size, kind, stream)

    monkeypatch.setattr(fake_cuda, "cudaMemcpyAsync", blocks)
    word = torch.tensor([7], dtype=torch.int32)
    start = time.monotonic()
    assert words.read_int32(word.data_ptr(), timeout_s=0.2) is None
    assert time.monotonic() - start < 1.5
    start = time.monotonic()
    assert words.read_int32(word.data_ptr(), timeout_s=0.2) is None
    assert words.write_int32(word.data_ptr(), 8, timeout_s=0.2) is False
    assert time.monotonic() - start < 0.1, "a copy waited behind one that is held up"
    release.set()
    deadline = time.monotonic() + 5
    while words.read_int32(word.data_ptr(), timeout_s=0.5) != 7:
        assert time.monotonic() < deadline, "copies never worked again after the held-up call returned"
        time.sleep(0.01)
    assert words.write_int32(word.data_ptr(), 9) and int(word[0]) == 9
