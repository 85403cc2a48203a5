"""How the peers reach each tensor of a collective call, agreed by every rank, with plain tensors
registered on the fly and the registrations cached.

A collective reads (or writes) its tensors on the peers. A tensor at the same heap offset on every
rank is reached by the heap's translation; one that ``ctx.register`` registered, through its
registration; any other must be staged through the heap, a full extra pass over the data. Which
of these applies must be the same on every rank, yet each rank knows only its own tensor. So a call
that wants plain tensors read in place asks :meth:`RegistrationCache.reach`: one allgather of what
each rank knows of its tensor, and from it the same decision on every rank:

- every rank's tensor at the same heap offset: the heap;
- every rank's tensor in the same registration (``ctx.register``, or one made here before): that
  registration;
- a rank whose tensor cannot be registered (not contiguous, not on a 256-byte boundary, memory
  that CUDA IPC cannot share, or a backend that shares only the heap): staged, on every rank;
- otherwise the ranks register their tensors together, now (collective, a few milliseconds), and
  the registration is cached for the next call that passes the same tensors.

A cached registration is found again only when every rank passes a tensor at the same address,
of the same size, in the same allocation (CUDA's buffer id: an allocation freed and made again
at the same address is a different one), and every rank found the same registration: the ranks'
caches hold the same registrations in the same order because every change to them is made by all
ranks in the same call. The cache does not keep the tensors alive (a registration made with
``ctx.register`` does): when a tensor is freed, its cached registration is no longer found, and
goes once the cache holds more than :data:`CAPACITY`, least recently used first. Registrations
used while a rank captures a CUDA graph stay until the context closes, since the graph keeps
their addresses; none is made during a capture (the tensors are staged): make the calls once
before capturing them, as CUDA graphs want anyway.
"""

from __future__ import annotations

import collections
import weakref
from typing import NamedTuple

import numpy as np
import torch

from ._logging import logger
from ._registration import ALIGNMENT, Registration, _export_cuda, close_cuda, peer_addresses

#: Cached registrations kept (not counting those a CUDA graph uses); past it the least recently
#: used is closed (collective, as the decision to close it is taken on every rank alike).
CAPACITY = 64

# What a rank tells its peers of each tensor of a call: WORDS integers (see RegistrationCache._status)
HEAP, REGISTERED, NEW = 0, 1, 2
WORDS = 5


class Reach(NamedTuple):
    """How every rank's copy of one tensor of a call is reached by the peers (the same on every rank)."""

    #: the peers read (or write) the tensor where it is; False: the call stages it through the heap
    in_place: bool
    #: the table that translates the tensor's addresses to the peers (``heap_bases`` layout): the
    #: heap's bases, or a registration's ``bases``; the heap's when staged (staging buffers are there)
    bases: torch.Tensor
    #: what the decision depends on, for keys of launch plans: ("heap",), ("registered", (serial, offset)), ("staged",)
    ident: tuple


class RegistrationCache:
    """The registrations that :meth:`reach` made for plain tensors of collective calls (see the
    module docstring). One per context; :meth:`close` (collective) closes them."""

    def __init__(self, ctx, capacity: int = CAPACITY):
        self._ctx = ctx
        self.capacity = capacity
        # serial -> [registration, pinned]: the same serials in the same order on every rank
        self._entries: collections.OrderedDict[int, list] = collections.OrderedDict()
        self._by_key: dict[tuple, int] = {}  # this rank's tensor key -> serial of its registration
        # this rank's plain tensor keys tried for export: why they cannot be registered, or None
        self._exportable: dict[tuple, str | None] = {}
        self._seen: dict[int, tuple] = {}  # address -> (weak reference to its storage, its buffer id)
        #: Changes whenever this cache registers or closes a registration (what a rank remembers of
        #: its tensors compares it, with ``ctx.registrations_generation`` for the explicit ones).
        self.generation = 0
        # (address, size, fit) -> (weak reference to its storage, both generations, status)
        self._memo: dict[tuple, tuple] = {}
        self._heap_bases = ctx.get_heap_bases()
        self._heap_reach = Reach(True, self._heap_bases, ("heap",))
        self._staged_reach = Reach(False, self._heap_bases, ("staged",))  # staging buffers are on the heap

    def __len__(self) -> int:
        return len(self._entries)

    def reach(self, tensors) -> list[Reach]:
        """How the peers reach each of ``tensors`` (this rank's, contiguous, on the context's device)
        in a collective call: the same answer on every rank. Collective: every rank passes its
        tensors of the call, in the same order; one allgather, and a registration when the ranks'
        tensors are plain and registered in no common registration yet."""
        ctx = self._ctx
        capturing = ctx.device.type == "cuda" and torch.cuda.is_current_stream_capturing()
        words = []
        for t in tensors:
            words.extend(self._status(t))
        words.append(int(capturing))
        # a few int64 words per rank, not a pickled object: this runs on every call from
        # ccl.REGISTER_FROM bytes, and the pickled allgather was most of its host time
        rows = ctx._boot.allgather_int64(np.array(words, dtype=np.int64)).tolist()
        first = rows[0]
        identical = all(row == first for row in rows)  # the usual call: one comparison per rank
        pin = any(row[-1] for row in rows)
        result = []
        grew = False
        for i, tensor in enumerate(tensors):
            kind, where, offset, nbytes, fit = first[WORDS * i:WORDS * (i + 1)]
            if identical:
                same, fit_everywhere = True, fit
            else:
                statuses = [row[WORDS * i:WORDS * (i + 1)] for row in rows]
                same = all(s[:4] == statuses[0][:4] for s in statuses)
                fit_everywhere = all(s[4] for s in statuses) and all(s[3] == nbytes for s in statuses)
            if kind != NEW and same:
                if kind == HEAP:  # every rank's tensor at the same heap offset
                    result.append(self._heap_reach)
                else:  # every rank's tensor in the same registration, at the same place
                    result.append(Reach(True, self._registration(where, pin).bases, ("registered", (where, offset))))
            elif fit_everywhere and not pin:
                # (not while a rank captures a CUDA graph: a registration's table is filled by
                # copies on the stream, which a capture would record instead of running)
                registration = self._register(tensor, pin)
                result.append(Reach(True, registration.bases, ("registered", (registration.serial, 0))))
                grew = True
            else:
                # a rank's tensor cannot be registered, or the sizes differ (a call that the
                # kernels' checks report, as they would without this agreement): staged everywhere
                result.append(self._staged_reach)
        if grew:
            self._evict()
        return result

    def _status(self, t: torch.Tensor) -> tuple:
        # What this rank knows of its tensor, as WORDS integers: (kind, where, offset, nbytes, fit),
        # kind HEAP (where: its heap offset), REGISTERED (where: the registration's serial, offset:
        # the tensor's offset in it; by ctx.register or cached here) or NEW; fit: whether it could
        # be registered now. Remembered per storage while no registration changes: a tensor passed
        # again costs a dictionary lookup (the derivation below was a third of a call's host time).
        ctx = self._ctx
        if not isinstance(t, torch.Tensor) or t.device != ctx.device:
            return (NEW, 0, 0, -1, 0)  # staged on every rank; the call's own checks say why
        nbytes = t.numel() * t.element_size()
        ptr = t.data_ptr()
        fit = int(t.is_contiguous() and nbytes > 0 and ptr % ALIGNMENT == 0)
        storage = t.untyped_storage()
        memo_key = (ptr, nbytes, fit)
        memo = self._memo.get(memo_key)
        generations = (ctx.registrations_generation, self.generation)
        if memo is not None and memo[0]() is storage and memo[1] == generations:
            return memo[2]
        status = self._derive_status(t, ptr, nbytes, fit)
        if len(self._memo) > 4096:  # fresh tensors every call: forget, start again
            self._memo.clear()
        try:
            self._memo[memo_key] = (weakref.ref(storage), generations, status)
        except TypeError:  # a storage without weak references: derived every call
            pass
        return status

    def _derive_status(self, t: torch.Tensor, ptr: int, nbytes: int, fit: int) -> tuple:
        ctx = self._ctx
        explicit = ctx.registration_of(t)
        if explicit is not None:
            return (REGISTERED, explicit.serial, ptr - explicit.addresses[ctx.rank], nbytes, fit)
        on_heap = ctx.is_symmetric(t)
        key = self._key(t, nbytes, on_heap) if fit else None
        serial = self._by_key.get(key)
        if serial is not None and serial in self._entries:
            return (REGISTERED, serial, 0, nbytes, fit)
        if on_heap:
            return (HEAP, ptr - ctx._base, 0, nbytes, fit)
        if key is None:
            return (NEW, 0, 0, nbytes, 0)
        if key not in self._exportable:
            if len(self._exportable) > 4096:  # fresh tensors every call: forget, try again
                self._exportable.clear()
            why = self._exportable[key] = self._why_unfit(t)
            if why is not None:
                logger.info("rank %d: collectives stage a tensor of %d B at %#x: %s", ctx.rank, nbytes, ptr, why)
        return (NEW, 0, 0, nbytes, int(self._exportable[key] is None))

    def _key(self, t: torch.Tensor, nbytes: int, on_heap: bool) -> tuple | None:
        # This rank's tensor as the cache knows it: its address, size and allocation; None when it
        # has no allocation that could be shared.
        ptr = t.data_ptr()
        if on_heap:
            return (ptr, nbytes, "heap")  # the heap outlives every cached registration of it
        if self._ctx.backend != "cuda" or not t.is_cuda:
            return None
        # Asking the driver for the buffer id costs microseconds; while the storage that had it
        # lives, its allocation cannot have changed (a live storage holds its block, and the block
        # its segment), so a tensor passed again finds it here (torch keeps one Python object per
        # storage)
        storage = t.untyped_storage()
        seen = self._seen.get(ptr)
        if seen is not None and seen[0]() is storage:
            return (ptr, nbytes, seen[1])
        try:
            buffer_id = _buffer_id(ptr)
        except Exception as exc:  # memory the driver does not know: staged
            logger.info("rank %d: no CUDA buffer id for %#x (%s); collectives stage it", self._ctx.rank, ptr, exc)
            return None
        if len(self._seen) > 4096:  # fresh tensors every call: start again
            self._seen.clear()
        try:
            self._seen[ptr] = (weakref.ref(storage), buffer_id)
        except TypeError:  # a storage without weak references: ask the driver every call
            pass
        return (ptr, nbytes, buffer_id)

    def _why_unfit(self, t: torch.Tensor) -> str | None:
        # Why this rank's plain (contiguous, aligned) tensor cannot be registered, or None: an export
        # that fails here would fail in the registration, on every rank.
        try:
            _export_cuda(t.data_ptr())
        except Exception as exc:
            return f"CUDA IPC cannot share its memory ({exc})"
        return None

    def _registration(self, serial: int, pin: bool) -> Registration:
        explicit = next((r for r in self._ctx._registrations if r.serial == serial), None)
        if explicit is not None:
            return explicit
        entry = self._entries[serial]
        self._entries.move_to_end(serial)  # every rank uses it in this call: the same order everywhere
        entry[1] = entry[1] or pin
        return entry[0]

    def _register(self, tensor: torch.Tensor, pin: bool) -> Registration:
        ctx = self._ctx
        call = "collective call: registering plain tensors on the fly"
        addresses, opened = peer_addresses(ctx, ctx._heap, tensor, call)
        try:
            registration = Registration(ctx, tensor, addresses, opened, serial=ctx._next_serial(), keep=False)
        except BaseException:
            close_cuda(opened)
            raise
        nbytes = registration.nbytes
        key = self._key(tensor, nbytes, ctx.is_symmetric(tensor))
        self._entries[registration.serial] = [registration, pin]
        if key is not None:
            self._by_key[key] = registration.serial
        self.generation += 1
        logger.info("rank %d: registered %d B at %#x for collectives (serial %d, %d cached)", ctx.rank, nbytes,
                    tensor.data_ptr(), registration.serial, len(self._entries))
        return registration

    def _evict(self) -> None:
        # Close the least recently used registrations past the capacity (never those a graph uses).
        unpinned = [serial for serial, (_, pinned) in self._entries.items() if not pinned]
        for serial in unpinned[:max(0, len(unpinned) - self.capacity)]:
            self._close(serial)

    def _close(self, serial: int) -> None:
        registration, _ = self._entries.pop(serial)
        for key in [k for k, s in self._by_key.items() if s == serial]:
            del self._by_key[key]
        self.generation += 1
        registration.close()

    def close(self) -> None:
        """Close every cached registration (collective: the same ones, in the same order, on every rank)."""
        for serial in list(self._entries):
            self._close(serial)

    def unmap(self) -> None:
        """Unmap the peers' tensors of every cached registration on this rank alone, with no barrier:
        for an owner whose close waits for every rank before and after (a group's registrations at
        its context's close, where the groups' order differs between ranks)."""
        for registration, _ in self._entries.values():
            close_cuda(registration._opened)
            registration.closed = True
        self._entries.clear()
        self._by_key.clear()
        self.generation += 1


def _buffer_id(ptr: int) -> int:
    """CUDA's id of the allocation holding ``ptr``: unique in the process, so an allocation freed
    and made again at the same address has another."""
    from ._heap_cuda import _check, _cuda

    driver, _ = _cuda()
    return int(_check(driver.cuPointerGetAttribute(driver.CUpointer_attribute.CU_POINTER_ATTRIBUTE_BUFFER_ID, ptr),
                      "cuPointerGetAttribute(BUFFER_ID)"))
