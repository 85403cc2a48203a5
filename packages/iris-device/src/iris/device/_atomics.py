"""Remote atomics: ``atomic_add``, ``atomic_sub``, ``atomic_cas``, ``atomic_xchg``, ``atomic_xor``,
``atomic_and``, ``atomic_or``, ``atomic_min``, ``atomic_max``.

Every function translates ``pointer`` from ``from_rank`` (the current rank) to ``to_rank`` and
performs one read-modify-write there, returning the old values. Docstrings share one template.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ._errors import IrisUnsupportedError
from ._interpreter import INTERPRETER
from ._nvshmem import NVSHMEM, amo_supported, network_rmw, refusal, refuse_if_unmapped, unmapped
from ._options import checked_scope, checked_sem
from ._translate import translate_masked

_ATOMIC_DOC = """Atomically {what} at ``to_rank``'s memory and return the old values.

``pointer`` is in the current rank's (``from_rank``) address space and is translated to
``to_rank``'s; same rank: a local atomic.

Granularity: per element of the pointer block, one read-modify-write each{mask_note}.
Memory semantics: ``sem`` is ``"acquire"``, ``"release"``, ``"acq_rel"`` or ``"relaxed"``
(``None`` = ``"acq_rel"``), for the whole program: a releasing atomic orders every earlier
access of the program's threads before it, an acquiring one every later access after it.
Scope: ``scope`` is ``"cta"``, ``"gpu"`` or ``"sys"`` (``None`` = ``"gpu"``); use ``"sys"`` for
anything another process or GPU observes.
Types: {types}.

Example::

    {example}
"""

_ALL_TYPES = "int32, int64, uint32, uint64, fp32, fp64"
_WIDE = ("int32", "int64", "uint32", "uint64", "fp32", "fp64")
_INTEGER = ("int32", "int64", "uint32", "uint64")


def _doc(what, types, example, mask_note=" (masked-out lanes are skipped)"):
    def attach(fn):
        fn.__doc__ = _ATOMIC_DOC.format(what=what, types=types, example=example, mask_note=mask_note)
        return fn

    return attach


@triton.constexpr_function
def checked_atomic_type(call, op, pointer_ty, interpreter):
    """The pointee type of an atomic, or an error saying where that combination fails."""
    elem = pointer_ty.element_ty
    name = elem.name
    if op in ("and", "or", "xor"):
        ok = name in _INTEGER
    elif name in _WIDE:
        ok = True
    elif name in ("fp16", "bf16") and op in ("add", "sub"):
        ok = True
    elif name in ("fp16", "bf16", "int16", "uint16") and op == "cas":
        ok = True
    else:
        ok = False
    if not ok:
        raise IrisUnsupportedError(
            f"{call} on {name} pointers: atomic_{op} does not exist for {name} on NVIDIA GPUs; "
            f"use a 32- or 64-bit type (int32, int64, uint32, uint64"
            f"{'' if op in ('and', 'or', 'xor') else ', fp32, fp64'})"
        )
    if interpreter and name in ("fp16", "bf16"):
        if name == "bf16" or op != "cas":
            raise IrisUnsupportedError(
                f"{call} on {name} pointers under the CPU backend (Triton's interpreter): "
                f"{name} atomic_{op} is not atomic across processes there (updates would be lost); "
                f"accumulate in fp32 on the heap instead, or run on the cuda backend"
            )
    return elem


@triton.constexpr_function
def _xchg_bits_type(elem, interpreter):
    # Triton's interpreter has no float atomic exchange ("Unsupported data type"); an exchange
    # of the same bits as an integer of the same width is the same operation.
    if interpreter and elem.is_floating():
        return tl.int64 if elem.primitive_bitwidth == 64 else tl.int32
    return None


# Program-wide ordering. On a GPU a program's lanes are many threads, but a release orders only the
# writes of the thread that issues it, and a scalar atomic is issued by one thread. Without a
# barrier before it, the spec's pattern (store a block, then atomic_cas(flag, ..., sem="release"))
# could publish the flag before other warps' stores land; symmetrically, other threads' loads after
# an acquire are ordered only through a barrier after it. tl.debug_barrier() is a CTA barrier on
# the GPU and a no-op under the interpreter. (Written inline in each atomic, not as a helper: every
# nested jit call costs the interpreter a re-patch of triton.language.)


@triton.constexpr_function
def _releases(sem):
    # None means "acq_rel".
    return sem in (None, "release", "acq_rel")


@triton.constexpr_function
def _acquires(sem):
    return sem in (None, "acquire", "acq_rel")


#: NVSHMEM's fetching AMO for each iris atomic (NVSHMEM has no min/max).
_NETWORK_OPS = {"add": "fetch_add", "sub": "fetch_add", "xchg": "swap", "and": "fetch_and", "or": "fetch_or",
                "xor": "fetch_xor", "cas": "compare_swap"}


@triton.constexpr_function
def _network_op(op):
    return _NETWORK_OPS[op] if op in _NETWORK_OPS else "none"


@triton.constexpr_function
def _what(pointer_ty):
    # For the refusal message: "on int32 blocks", "on fp32".
    kind = "blocks" if pointer_ty.is_block() else "scalars"
    return f"on {pointer_ty.element_ty.name} {kind}"


@triton.jit
def _rmw(op: tl.constexpr, pointer, val, from_rank, to_rank, heap_bases, mask, sem: tl.constexpr,
         scope: tl.constexpr, hint: tl.constexpr):
    call: tl.constexpr = "iris.device.atomic_" + op
    elem: tl.constexpr = checked_atomic_type(call, op, pointer.dtype, INTERPRETER)
    sem_v: tl.constexpr = checked_sem(call, sem)
    scope_v: tl.constexpr = checked_scope(call, scope)
    if NVSHMEM:
        nv_op: tl.constexpr = _network_op(op)
        if amo_supported(nv_op, pointer.type):
            # Another node's heap: NVSHMEM's AMO.
            if unmapped(heap_bases, to_rank):
                operand = -val if op == "sub" else val
                old = network_rmw(nv_op, pointer, operand, 0, from_rank, to_rank, heap_bases, mask, _releases(sem_v))
                if _acquires(sem_v):
                    tl.debug_barrier()
            else:
                old = _rmw_mapped(op, elem, pointer, val, from_rank, to_rank, heap_bases, mask, sem_v, scope_v, hint,
                                  call)
        else:
            refuse_if_unmapped(heap_bases, to_rank, refusal(call, _what(pointer.type)))
            old = _rmw_mapped(op, elem, pointer, val, from_rank, to_rank, heap_bases, mask, sem_v, scope_v, hint, call)
    else:
        old = _rmw_mapped(op, elem, pointer, val, from_rank, to_rank, heap_bases, mask, sem_v, scope_v, hint, call)
    return old


@triton.jit
def _rmw_mapped(op: tl.constexpr, elem: tl.constexpr, pointer, val, from_rank, to_rank, heap_bases, mask,
                sem_v: tl.constexpr, scope_v: tl.constexpr, hint: tl.constexpr, call: tl.constexpr):
    # The translated-pointer path of every atomic but cas.
    remote = translate_masked(pointer, from_rank, to_rank, heap_bases, mask, hint, call)
    if _releases(sem_v):
        tl.debug_barrier()
    if op == "add":
        old = tl.atomic_add(remote, val, mask=mask, sem=sem_v, scope=scope_v)
    elif op == "sub":
        old = tl.atomic_add(remote, -val, mask=mask, sem=sem_v, scope=scope_v)
    elif op == "xchg":
        bits: tl.constexpr = _xchg_bits_type(elem, INTERPRETER)
        if bits is None:
            old = tl.atomic_xchg(remote, val, mask=mask, sem=sem_v, scope=scope_v)
        else:
            as_bits = tl.cast(remote, tl.pointer_type(bits), bitcast=True)
            new_bits = tl.cast(tl.cast(val, elem), bits, bitcast=True)
            old_bits = tl.atomic_xchg(as_bits, new_bits, mask=mask, sem=sem_v, scope=scope_v)
            old = tl.cast(old_bits, elem, bitcast=True)
    elif op == "and":
        old = tl.atomic_and(remote, val, mask=mask, sem=sem_v, scope=scope_v)
    elif op == "or":
        old = tl.atomic_or(remote, val, mask=mask, sem=sem_v, scope=scope_v)
    elif op == "xor":
        old = tl.atomic_xor(remote, val, mask=mask, sem=sem_v, scope=scope_v)
    elif op == "min":
        old = tl.atomic_min(remote, val, mask=mask, sem=sem_v, scope=scope_v)
    else:
        tl.static_assert(op == "max", "iris.device internal: unknown atomic op")
        old = tl.atomic_max(remote, val, mask=mask, sem=sem_v, scope=scope_v)
    if _acquires(sem_v):
        tl.debug_barrier()
    return old


@triton.jit
@_doc("add ``val``", _ALL_TYPES + "; fp16 and bf16 on the cuda backend only",
      "old = iris.device.atomic_add(counter, 1, cur_rank, peer, heap_bases, sem='relaxed')")
def atomic_add(pointer, val, from_rank, to_rank, heap_bases, mask=None, sem: tl.constexpr = None,
               scope: tl.constexpr = None, hint: tl.constexpr = None):
    return _rmw("add", pointer, val, from_rank, to_rank, heap_bases, mask, sem, scope, hint)


@triton.jit
@_doc("subtract ``val``", _ALL_TYPES + "; fp16 and bf16 on the cuda backend only",
      "old = iris.device.atomic_sub(counter, 1, cur_rank, peer, heap_bases)")
def atomic_sub(pointer, val, from_rank, to_rank, heap_bases, mask=None, sem: tl.constexpr = None,
               scope: tl.constexpr = None, hint: tl.constexpr = None):
    return _rmw("sub", pointer, val, from_rank, to_rank, heap_bases, mask, sem, scope, hint)


@triton.jit
@_doc("swap in ``val`` where the value equals ``cmp``", _ALL_TYPES + "; 16-bit types too (bf16 on cuda only)",
      "old = iris.device.atomic_cas(flag, 0, 1, cur_rank, peer, heap_bases, sem='release', scope='sys')",
      mask_note=" (no mask: every lane takes part)")
def atomic_cas(pointer, cmp, val, from_rank, to_rank, heap_bases, sem: tl.constexpr = None,
               scope: tl.constexpr = None, hint: tl.constexpr = None):
    call: tl.constexpr = "iris.device.atomic_cas"
    elem: tl.constexpr = checked_atomic_type(call, "cas", pointer.dtype, INTERPRETER)
    sem_v: tl.constexpr = checked_sem(call, sem)
    scope_v: tl.constexpr = checked_scope(call, scope)
    # cmp and val in the pointee's type: a 16-bit CAS given 32-bit operands would compare and
    # write 4 bytes under the interpreter.
    cmp_v = tl.cast(cmp, elem)
    val_v = tl.cast(val, elem)
    if NVSHMEM:
        if amo_supported("compare_swap", pointer.type):
            if unmapped(heap_bases, to_rank):
                old = network_rmw("compare_swap", pointer, val_v, cmp_v, from_rank, to_rank, heap_bases, None,
                                  _releases(sem_v))
                if _acquires(sem_v):
                    tl.debug_barrier()
            else:
                old = _cas_mapped(pointer, cmp_v, val_v, from_rank, to_rank, heap_bases, sem_v, scope_v, hint, call)
        else:
            refuse_if_unmapped(heap_bases, to_rank, refusal(call, _what(pointer.type)))
            old = _cas_mapped(pointer, cmp_v, val_v, from_rank, to_rank, heap_bases, sem_v, scope_v, hint, call)
    else:
        old = _cas_mapped(pointer, cmp_v, val_v, from_rank, to_rank, heap_bases, sem_v, scope_v, hint, call)
    return old


@triton.jit
def _cas_mapped(pointer, cmp_v, val_v, from_rank, to_rank, heap_bases, sem_v: tl.constexpr, scope_v: tl.constexpr,
                hint: tl.constexpr, call: tl.constexpr):
    remote = translate_masked(pointer, from_rank, to_rank, heap_bases, None, hint, call)
    if _releases(sem_v):
        tl.debug_barrier()
    old = tl.atomic_cas(remote, cmp_v, val_v, sem=sem_v, scope=scope_v)
    if _acquires(sem_v):
        tl.debug_barrier()
    return old


@triton.jit
@_doc("replace the value with ``val``", _ALL_TYPES,
      "old = iris.device.atomic_xchg(slot, v, cur_rank, peer, heap_bases, sem='acq_rel', scope='sys')")
def atomic_xchg(pointer, val, from_rank, to_rank, heap_bases, mask=None, sem: tl.constexpr = None,
                scope: tl.constexpr = None, hint: tl.constexpr = None):
    return _rmw("xchg", pointer, val, from_rank, to_rank, heap_bases, mask, sem, scope, hint)


@triton.jit
@_doc("XOR ``val`` into the value", "int32, int64, uint32, uint64",
      "old = iris.device.atomic_xor(bits, mask_bits, cur_rank, peer, heap_bases)")
def atomic_xor(pointer, val, from_rank, to_rank, heap_bases, mask=None, sem: tl.constexpr = None,
               scope: tl.constexpr = None, hint: tl.constexpr = None):
    return _rmw("xor", pointer, val, from_rank, to_rank, heap_bases, mask, sem, scope, hint)


@triton.jit
@_doc("AND ``val`` into the value", "int32, int64, uint32, uint64",
      "old = iris.device.atomic_and(bits, ~clear_bits, cur_rank, peer, heap_bases)")
def atomic_and(pointer, val, from_rank, to_rank, heap_bases, mask=None, sem: tl.constexpr = None,
               scope: tl.constexpr = None, hint: tl.constexpr = None):
    return _rmw("and", pointer, val, from_rank, to_rank, heap_bases, mask, sem, scope, hint)


@triton.jit
@_doc("OR ``val`` into the value", "int32, int64, uint32, uint64",
      "old = iris.device.atomic_or(bits, 1 << cur_rank, cur_rank, peer, heap_bases, scope='sys')")
def atomic_or(pointer, val, from_rank, to_rank, heap_bases, mask=None, sem: tl.constexpr = None,
              scope: tl.constexpr = None, hint: tl.constexpr = None):
    return _rmw("or", pointer, val, from_rank, to_rank, heap_bases, mask, sem, scope, hint)


@triton.jit
@_doc("keep the minimum of the value and ``val``", _ALL_TYPES,
      "old = iris.device.atomic_min(best, candidate, cur_rank, 0, heap_bases)")
def atomic_min(pointer, val, from_rank, to_rank, heap_bases, mask=None, sem: tl.constexpr = None,
               scope: tl.constexpr = None, hint: tl.constexpr = None):
    return _rmw("min", pointer, val, from_rank, to_rank, heap_bases, mask, sem, scope, hint)


@triton.jit
@_doc("keep the maximum of the value and ``val``", _ALL_TYPES,
      "old = iris.device.atomic_max(best, candidate, cur_rank, 0, heap_bases)")
def atomic_max(pointer, val, from_rank, to_rank, heap_bases, mask=None, sem: tl.constexpr = None,
               scope: tl.constexpr = None, hint: tl.constexpr = None):
    return _rmw("max", pointer, val, from_rank, to_rank, heap_bases, mask, sem, scope, hint)
