"""Remote loads and stores: ``load``, ``store``, ``get``, ``put``, ``copy``.

Free-function form: each names both ends and the heap; the current rank is one of them. All are
per element of the pointer block, weak (non-atomic) accesses with no ordering of their own: order
them against flags with an atomic ``sem="release"``/``"acquire"`` at ``scope="sys"``.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ._layout import CUR_RANK_AT_C
from ._nvshmem import NVSHMEM, network_load, network_store, refusal, refuse_if_unmapped, rma_supported, unmapped
from ._options import ld_modifier, ld_volatile, st_modifier
from ._translate import translate_masked

# The two accesses every primitive below is made of. On the nvshmem backend (NVSHMEM true) a peer
# whose heap is not mapped here is reached through NVSHMEM's device API instead; everywhere else
# the branch is not compiled in.


@triton.jit
def _load_from(pointer, cur_rank, peer, heap_bases, mask, other, modifier: tl.constexpr, volatile: tl.constexpr,
               hint: tl.constexpr, call: tl.constexpr):
    if NVSHMEM:
        if rma_supported(pointer.dtype):
            if unmapped(heap_bases, peer):
                result = network_load(pointer, cur_rank, peer, heap_bases, mask, other)
            else:
                remote = translate_masked(pointer, cur_rank, peer, heap_bases, mask, hint, call)
                result = tl.load(remote, mask=mask, other=other, cache_modifier=modifier, volatile=volatile)
        else:
            refuse_if_unmapped(heap_bases, peer, refusal(call, pointer.dtype.element_ty.name))
            remote = translate_masked(pointer, cur_rank, peer, heap_bases, mask, hint, call)
            result = tl.load(remote, mask=mask, other=other, cache_modifier=modifier, volatile=volatile)
    else:
        remote = translate_masked(pointer, cur_rank, peer, heap_bases, mask, hint, call)
        result = tl.load(remote, mask=mask, other=other, cache_modifier=modifier, volatile=volatile)
    return result


@triton.jit
def _store_to(pointer, value, cur_rank, peer, heap_bases, mask, modifier: tl.constexpr, hint: tl.constexpr,
              call: tl.constexpr):
    if NVSHMEM:
        if rma_supported(pointer.dtype):
            if unmapped(heap_bases, peer):
                network_store(pointer, value, cur_rank, peer, heap_bases, mask)
            else:
                remote = translate_masked(pointer, cur_rank, peer, heap_bases, mask, hint, call)
                tl.store(remote, value, mask=mask, cache_modifier=modifier)
        else:
            refuse_if_unmapped(heap_bases, peer, refusal(call, pointer.dtype.element_ty.name))
            remote = translate_masked(pointer, cur_rank, peer, heap_bases, mask, hint, call)
            tl.store(remote, value, mask=mask, cache_modifier=modifier)
    else:
        remote = translate_masked(pointer, cur_rank, peer, heap_bases, mask, hint, call)
        tl.store(remote, value, mask=mask, cache_modifier=modifier)


@triton.jit
def load(pointer, to_rank, from_rank, heap_bases, mask=None, other=None, cache_modifier: tl.constexpr = None,
         volatile: tl.constexpr = False, hint: tl.constexpr = None):
    """Read ``from_rank``'s memory into registers of the current rank (``to_rank``).

    ``pointer`` is in ``to_rank``'s address space and is translated to ``from_rank``'s. Same rank:
    a plain local load.

    Granularity: per element of the pointer block. Memory semantics: a weak load, no ordering;
    ``volatile=True`` keeps the compiler from merging or dropping it (use it, or ``".cv"``, when
    polling). Scope: not applicable. ``cache_modifier``: ``None``/``".ca"``/``".cg"``/``".cv"``
    (mapping in :mod:`iris.device._options`). ``hint`` adds alignment facts on the translated
    pointer.

    Returns the loaded block; masked-out lanes hold ``other`` (undefined without it).

    Example::

        x = iris.device.load(buf + offs, cur_rank, peer, heap_bases, mask=offs < n, other=0.0)
    """
    modifier: tl.constexpr = ld_modifier("iris.device.load", cache_modifier, volatile)
    return _load_from(pointer, to_rank, from_rank, heap_bases, mask, other, modifier,
                      ld_volatile(cache_modifier, volatile), hint, "iris.device.load")


@triton.jit
def store(pointer, value, from_rank, to_rank, heap_bases, mask=None, cache_modifier: tl.constexpr = None,
          hint: tl.constexpr = None):
    """Write ``value`` from the current rank (``from_rank``) into ``to_rank``'s memory.

    ``pointer`` is in ``from_rank``'s address space and is translated to ``to_rank``'s. Same rank:
    a plain local store.

    Granularity: per element of the pointer block. Memory semantics: a weak store, no ordering;
    publish it with a later ``atomic_*(..., sem="release", scope="sys")``. ``cache_modifier``:
    ``None``/``".wb"``/``".cg"``/``".cs"``/``".wt"``.

    Example::

        iris.device.store(buf + offs, x, cur_rank, peer, heap_bases, mask=offs < n)
    """
    modifier: tl.constexpr = st_modifier("iris.device.store", cache_modifier)
    _store_to(pointer, value, from_rank, to_rank, heap_bases, mask, modifier, hint, "iris.device.store")


@triton.jit
def get(from_ptr, to_ptr, from_rank, to_rank, heap_bases, mask=None, other=None,
        load_cache_modifier: tl.constexpr = None, store_cache_modifier: tl.constexpr = None,
        hint: tl.constexpr = None):
    """Copy the other rank's data at ``from_ptr`` into the current rank's ``to_ptr``.

    A get always lands in the current rank, so of ``from_rank`` and ``to_rank`` the one that is
    not the current rank is the source: ``get(buf, local, peer, cur_rank, ...)`` (the spec's
    order) and ``get(buf, local, cur_rank, peer, ...)`` (AMD Iris's tests) both read ``peer``.
    The current rank should be one of the two (the spec leaves anything else undefined). It is
    read from the context header just before ``heap_bases`` (one scalar load per call), so
    ``heap_bases`` must be ``Iris.get_heap_bases()`` or ``DeviceContext.heap_bases``.

    ``from_ptr`` is in the current rank's address space and is translated to the source's;
    ``to_ptr`` is local. Granularity: per element of the block. Memory semantics: weak load then
    weak store, no ordering. ``mask`` applies to both; ``other`` fills masked-out loads.

    Example::

        iris.device.get(buf + offs, local + offs, peer, cur_rank, heap_bases, mask=m)
    """
    cur_rank = tl.load(heap_bases + CUR_RANK_AT_C)
    source = tl.where(from_rank == cur_rank, to_rank, from_rank)
    get_from(from_ptr, to_ptr, source, cur_rank, heap_bases, mask, other, load_cache_modifier, store_cache_modifier,
             hint)


@triton.jit
def get_from(from_ptr, to_ptr, source, cur_rank, heap_bases, mask, other, load_cache_modifier: tl.constexpr,
             store_cache_modifier: tl.constexpr, hint: tl.constexpr):
    """The get itself, the source rank already chosen: the free :func:`get` and
    ``DeviceContext.get`` (which knows the current rank at compile time) both end here."""
    load_modifier: tl.constexpr = ld_modifier("iris.device.get", load_cache_modifier, False, "load_cache_modifier")
    store_modifier: tl.constexpr = st_modifier("iris.device.get", store_cache_modifier, "store_cache_modifier")
    data = _load_from(from_ptr, cur_rank, source, heap_bases, mask, other, load_modifier,
                      ld_volatile(load_cache_modifier, False), hint, "iris.device.get")
    tl.store(to_ptr, data, mask=mask, cache_modifier=store_modifier)


@triton.jit
def put(from_ptr, to_ptr, from_rank, to_rank, heap_bases, mask=None, other=None,
        load_cache_modifier: tl.constexpr = None, store_cache_modifier: tl.constexpr = None,
        hint: tl.constexpr = None):
    """Copy the current rank's (``from_rank``) data at ``from_ptr`` into ``to_rank``'s ``to_ptr``.

    ``from_ptr`` is local; ``to_ptr`` is in the current rank's address space and is translated to
    ``to_rank``'s. Granularity: per element of the block. Memory semantics: weak load then weak
    store, no ordering; follow with a release atomic to publish.

    Example::

        iris.device.put(local + offs, buf + offs, cur_rank, peer, heap_bases, mask=m)
    """
    load_modifier: tl.constexpr = ld_modifier("iris.device.put", load_cache_modifier, False, "load_cache_modifier")
    store_modifier: tl.constexpr = st_modifier("iris.device.put", store_cache_modifier, "store_cache_modifier")
    data = tl.load(from_ptr, mask=mask, other=other, cache_modifier=load_modifier,
                   volatile=ld_volatile(load_cache_modifier, False))
    _store_to(to_ptr, data, from_rank, to_rank, heap_bases, mask, store_modifier, hint, "iris.device.put")


@triton.jit
def copy(src_ptr, dst_ptr, from_rank, to_rank, cur_rank, heap_bases, mask=None, other=None,
         load_cache_modifier: tl.constexpr = None, store_cache_modifier: tl.constexpr = None,
         hint: tl.constexpr = None):
    """Copy ``from_rank``'s data at ``src_ptr`` to ``to_rank``'s memory at ``dst_ptr``.

    Both pointers are in ``cur_rank``'s address space; ``src_ptr`` is translated to ``from_rank``
    and ``dst_ptr`` to ``to_rank``. ``cur_rank`` should be one of the two ends (the spec leaves
    anything else undefined). Granularity: per element of the block. Memory semantics: weak load
    then weak store, no ordering.

    Example::

        # pull a peer's block into my buffer, or push mine to a peer: same call
        iris.device.copy(src + offs, dst + offs, peer, cur_rank, cur_rank, heap_bases, mask=m)
    """
    load_modifier: tl.constexpr = ld_modifier("iris.device.copy", load_cache_modifier, False, "load_cache_modifier")
    store_modifier: tl.constexpr = st_modifier("iris.device.copy", store_cache_modifier, "store_cache_modifier")
    data = _load_from(src_ptr, cur_rank, from_rank, heap_bases, mask, other, load_modifier,
                      ld_volatile(load_cache_modifier, False), hint, "iris.device.copy")
    _store_to(dst_ptr, data, cur_rank, to_rank, heap_bases, mask, store_modifier, hint, "iris.device.copy")

