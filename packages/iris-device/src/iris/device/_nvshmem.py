"""The network path: NVSHMEM's device API, for peers whose heap this process cannot map.

On the ``nvshmem`` backend the heap is one NVSHMEM symmetric allocation. A peer that NVSHMEM can
map into this process (same node, NVLink or PCIe peer access) has its heap base in the context
tensor, and every primitive takes the translated-pointer path as on the ``cuda`` backend. A peer
it cannot map (another node) has heap base 0 there; for such a peer the primitives call
NVSHMEM's device functions instead (``nvshmem_<type>_p``/``_g`` per element, the AMOs), which
NVSHMEM carries over InfiniBand/RoCE.

Compile-time switch: :data:`NVSHMEM`, decided when ``iris.device`` is imported
(:func:`network_path_selected`: with ``IRIS_BACKEND=nvshmem``, on when the job spans nodes). Off,
none of this is compiled in: the instructions are the same as before the network path existed.
On, each remote primitive tests its peer's base (already loaded for the translation) and branches
uniformly, keeping the pointer path for mapped peers.

The functions of NVSHMEM's device bitcode are declared through Triton's extern mechanism; the
runtime links the bitcode into kernels that call them and initialises their modules
(:mod:`iris.device._nvshmem_host`). Addresses are passed as int64 (NVSHMEM's ``void *``; the
symmetric address is this process's own address of the heap location, what NVSHMEM expects), and
functions returning ``void`` are declared returning an int32 that is never read.

Masked-out lanes must not touch the network, but an extern call is made for every lane of the
block: they are pointed at a scratch word of this rank's own signal pad instead (a local access).
"""

from __future__ import annotations

import os

import triton
import triton.language as tl
from triton.language import core

from . import _layout
from ._errors import IrisUnsupportedError

# What launchers tell each process: (ranks on this node, ranks in the job). Open MPI, MPICH's
# Hydra, Slurm, torchrun.
_LAUNCHER_SIZES = (("OMPI_COMM_WORLD_LOCAL_SIZE", "OMPI_COMM_WORLD_SIZE"), ("MPI_LOCALNRANKS", "PMI_SIZE"),
                   ("SLURM_NTASKS_PER_NODE", "SLURM_NTASKS"), ("LOCAL_WORLD_SIZE", "WORLD_SIZE"))


def launcher_spans_nodes(env=os.environ) -> bool:
    """True when the launcher's variables say the job has fewer ranks on this node than in all."""
    for local, world in _LAUNCHER_SIZES:
        try:
            return int(env[local]) < int(env[world])
        except (KeyError, ValueError):
            continue
    return False


def network_path_selected(env=os.environ) -> bool:
    """Whether the network path is compiled in. Only with ``IRIS_BACKEND=nvshmem``; then
    ``IRIS_NVSHMEM_NETWORK`` (``1``/``0``) decides, and by default (``auto``) it is on when the
    job spans nodes (from the launcher's variables) or ``IRIS_NVSHMEM_FORCE_REMOTE=1`` asks for it.
    Off on one node, so kernels there compile exactly as on the cuda backend, without linking
    NVSHMEM's 30 MB bitcode into each."""
    if env.get("IRIS_BACKEND", "") != "nvshmem":
        return False
    choice = env.get("IRIS_NVSHMEM_NETWORK", "auto")
    if choice in ("0", "1"):
        return choice == "1"
    return force_remote_selected(env) or launcher_spans_nodes(env)


def force_remote_selected(env=os.environ) -> bool:
    """``IRIS_NVSHMEM_FORCE_REMOTE``: the runtime treats every other rank as unmapped (to test the
    network path on one node), so the path must be compiled in."""
    return env.get("IRIS_NVSHMEM_FORCE_REMOTE", "0") not in ("", "0")


#: Compile-time flag: remote primitives handle unmapped peers through NVSHMEM's device API.
NVSHMEM: tl.constexpr = tl.constexpr(network_path_selected())

#: Byte offset, in every rank's signal pad, of the 64-byte scratch area that masked-out lanes of
#: network calls use (below the watchdog's words, above the ring's flags).
SCRATCH_OFFSET = _layout.SIGNAL_PAD_BYTES - _layout.PAD_RESERVED_BYTES + _layout.NETWORK_SCRATCH_AT
_SCRATCH_OFFSET_C: tl.constexpr = tl.constexpr(SCRATCH_OFFSET)
_NUM_RANKS_AT: tl.constexpr = tl.constexpr(_layout.NUM_RANKS - _layout.HEAP_BASES)

_I32 = core.dtype("int32")
_I64 = core.dtype("int64")

# Triton element type name -> NVSHMEM's type name in nvshmem_<T>_p / _g. fp16 and bf16 travel as
# their int16 bits: NVSHMEM's half/bfloat16 functions take CUDA's struct types, which LLVM's NVPTX
# back end cannot match with Triton's half/bfloat values (it asserts).
_RMA_TYPES = {"fp32": "float", "fp64": "double", "int8": "int8", "int16": "int16", "int32": "int32",
              "int64": "int64", "uint8": "uint8", "uint16": "uint16", "uint32": "uint32", "uint64": "uint64"}
_AS_BITS = {"fp16": "int16", "bf16": "int16"}
# NVSHMEM's atomic memory operations, per op: Triton element type name -> NVSHMEM type name.
# (NVSHMEM 3.4 has no int64_atomic_fetch_add; its "long" is the same 64-bit type on Linux.)
_AMO_TYPES = {
    "fetch_add": {"int32": "int32", "uint32": "uint32", "int64": "long", "uint64": "uint64"},
    "compare_swap": {"int32": "int32", "uint32": "uint32", "int64": "int64", "uint64": "uint64"},
    "swap": {"int32": "int32", "uint32": "uint32", "int64": "int64", "uint64": "uint64", "fp32": "float",
             "fp64": "double"},
    "fetch_and": {"int32": "int32", "uint32": "uint32", "int64": "int64", "uint64": "uint64"},
    "fetch_or": {"int32": "int32", "uint32": "uint32", "int64": "int64", "uint64": "uint64"},
    "fetch_xor": {"int32": "int32", "uint32": "uint32", "int64": "int64", "uint64": "uint64"},
}


def _extern(symbol: str, args, arg_types: tuple, result=_I32, _semantic=None):
    """A call of NVSHMEM's ``symbol`` (impure: it touches memory), per element of the arguments,
    each converted to its C type first (a literal ``1`` would otherwise be an int32)."""
    args = [core.cast(a, t, _semantic=_semantic) for a, t in zip(args, arg_types)]
    return core.extern_elementwise("", "", args, {arg_types: (symbol, result)}, is_pure=False,
                                   _semantic=_semantic)


# --- NVSHMEM device functions --------------------------------------------------------------------


@core.extern
def my_pe(_semantic=None):
    """This process's NVSHMEM PE (``nvshmem_my_pe``); equal to the iris rank. Scalar int32."""
    return _extern("nvshmem_my_pe", [], (), _semantic=_semantic)


@core.extern
def n_pes(_semantic=None):
    """The number of PEs (``nvshmem_n_pes``); equal to the world size. Scalar int32."""
    return _extern("nvshmem_n_pes", [], (), _semantic=_semantic)


@core.extern
def quiet(_semantic=None):
    """``nvshmem_quiet``: every put, AMO and signal this thread issued has completed (is visible
    at its target) when it returns. Per thread; call it from every thread that issued one."""
    return _extern("nvshmem_quiet", [], (), _semantic=_semantic)


@core.extern
def fence(_semantic=None):
    """``nvshmem_fence``: this thread's puts, AMOs and signals to each PE are delivered in order
    around it (no completion). Per thread."""
    return _extern("nvshmem_fence", [], (), _semantic=_semantic)


@core.extern
def p(address, value, pe, _semantic=None):
    """``nvshmem_<T>_p``: store ``value`` at symmetric ``address`` (int64) on ``pe``. Per element,
    fire and forget (complete after :func:`quiet`)."""
    value = _semantic.to_tensor(value)
    return _extern(f"nvshmem_{_RMA_TYPES[value.dtype.name]}_p", [address, value, pe], (_I64, value.dtype, _I32),
                   _semantic=_semantic)


@core.extern
def g(address, pe, like, _semantic=None):
    """``nvshmem_<T>_g``: the value at symmetric ``address`` (int64) on ``pe``, of ``like``'s type
    (``like`` only selects the function). Per element, blocking."""
    dtype = like.dtype
    return _extern(f"nvshmem_{_RMA_TYPES[dtype.name]}_g", [address, pe], (_I64, _I32), dtype, _semantic=_semantic)


@core.extern
def amo(op, address, value, compare, pe, _semantic=None):
    """``nvshmem_<T>_atomic_<op>`` with a fetched result: ``op`` (a compile-time string) is one
    of ``fetch_add``, ``compare_swap``, ``swap``, ``fetch_and``, ``fetch_or``, ``fetch_xor``;
    ``compare`` is read by ``compare_swap`` only. Per element, blocking, relaxed at the target."""
    op = core._unwrap_if_constexpr(op)
    dtype = value.dtype
    name = _AMO_TYPES[op].get(dtype.name)
    if name is None:
        raise IrisUnsupportedError(
            f"iris.device atomic {op} on {dtype.name} to a peer reached through NVSHMEM: NVSHMEM has no "
            f"{dtype.name} {op}; use {', '.join(_AMO_TYPES[op])}")
    symbol = f"nvshmem_{name}_atomic_{op}"
    if op == "compare_swap":
        return _extern(symbol, [address, compare, value, pe], (_I64, dtype, dtype, _I32), dtype, _semantic=_semantic)
    return _extern(symbol, [address, value, pe], (_I64, dtype, _I32), dtype, _semantic=_semantic)


@core.extern
def putmem_nbi_block(dest, source, nbytes, pe, _semantic=None):
    """``nvshmemx_putmem_nbi_block``: copy ``nbytes`` (int64) from local ``source`` to symmetric
    ``dest`` on ``pe`` (addresses as int64). Called by every thread of the program with the same
    scalars; returns before the data has left (complete after :func:`quiet`)."""
    return _extern("nvshmemx_putmem_nbi_block", [dest, source, nbytes, pe], (_I64, _I64, _I64, _I32),
                   _semantic=_semantic)


@core.extern
def putmem_signal_nbi_block(dest, source, nbytes, signal, signal_value, signal_op, pe, _semantic=None):
    """``nvshmemx_putmem_signal_nbi_block``: :func:`putmem_nbi_block`, then update the uint64
    word ``signal`` on ``pe`` (``signal_op`` 0 = set, 5 = add) once the data is delivered: the
    receiver waits on the signal, not on a separate flag. Program-wide, like the put."""
    return _extern("nvshmemx_putmem_signal_nbi_block", [dest, source, nbytes, signal, signal_value, signal_op, pe],
                   (_I64, _I64, _I64, _I64, _I64, _I32, _I32), _semantic=_semantic)


@core.extern
def getmem_block(dest, source, nbytes, pe, _semantic=None):
    """``nvshmemx_getmem_block``: copy ``nbytes`` from symmetric ``source`` on ``pe`` to local
    ``dest``; complete on return. Program-wide."""
    return _extern("nvshmemx_getmem_block", [dest, source, nbytes, pe], (_I64, _I64, _I64, _I32),
                   _semantic=_semantic)


@core.extern
def signal_wait_until(signal, cmp, value, _semantic=None):
    """``nvshmem_signal_wait_until``: wait until the local uint64 word ``signal`` compares
    ``cmp`` (0 eq, 1 ne, 2 gt, 3 ge, 4 lt, 5 le) to ``value``; returns the word. Per thread."""
    return _extern("nvshmem_signal_wait_until", [signal, cmp, value], (_I64, _I32, _I64), _I64, _semantic=_semantic)


# --- the network path of the element-wise primitives ---------------------------------------------


@triton.jit
def unmapped(heap_bases, rank):
    """True (a scalar) when ``rank``'s heap is not mapped here: the network path must be taken."""
    return tl.load(heap_bases + rank) == 0


@triton.jit
def _address(pointer, mask, cur_rank, heap_bases):
    # int64 symmetric addresses; masked-out lanes point at this rank's scratch word instead.
    address = tl.cast(pointer, tl.int64)
    if mask is not None:
        num_ranks = tl.load(heap_bases + _NUM_RANKS_AT)
        heap_size = tl.load(heap_bases + num_ranks + _layout.HEAP_SIZE_C)
        scratch = tl.load(heap_bases + cur_rank) + heap_size + _SCRATCH_OFFSET_C
        address = tl.where(mask, address, scratch)
    return address


@triton.jit
def _pe(peer, mask, cur_rank):
    # Per-lane PE: the peer, or this rank for masked-out lanes (their scratch word is local).
    pe = peer
    if mask is not None:
        pe = tl.where(mask, peer, cur_rank)
    return pe.to(tl.int32)


@triton.constexpr_function
def _wire_type(elem):
    # The type a value crosses the network as: its own, or its int16 bits for fp16/bf16.
    return core.dtype(_AS_BITS[elem.name]) if elem.name in _AS_BITS else elem


@triton.jit
def network_load(pointer, cur_rank, peer, heap_bases, mask, other):
    """Per element: the value at ``pointer`` (this rank's address) on ``peer``, through
    ``nvshmem_<T>_g``; masked-out lanes give ``other`` (0 when None)."""
    address = _address(pointer, mask, cur_rank, heap_bases)
    elem: tl.constexpr = pointer.dtype.element_ty
    wire: tl.constexpr = _wire_type(elem)
    like = tl.zeros_like(address).to(wire)  # picks nvshmem_<T>_g
    value = tl.cast(g(address, _pe(peer, mask, cur_rank), like), elem, bitcast=True)
    if mask is not None:
        if other is not None:
            value = tl.where(mask, value, other)
    return value


@triton.jit
def network_store(pointer, value, cur_rank, peer, heap_bases, mask):
    """Per element: store ``value`` at ``pointer`` (this rank's address) on ``peer`` through
    ``nvshmem_<T>_p``; fire and forget, ordered by a later release atomic (:func:`fence`)."""
    address = _address(pointer, mask, cur_rank, heap_bases)
    elem: tl.constexpr = pointer.dtype.element_ty
    wire: tl.constexpr = _wire_type(elem)
    bits = tl.cast(tl.cast(value, elem) + tl.zeros_like(address).to(elem), wire, bitcast=True)
    p(address, bits, _pe(peer, mask, cur_rank))


@triton.jit
def _thread_index(anchor):
    # %tid.x of the calling thread (``anchor`` only gives the asm an operand).
    return tl.inline_asm_elementwise("mov.u32 $0, %tid.x;", "=r,r", [anchor], dtype=tl.int32, is_pure=True, pack=1)


# Threads of a program all hold a scalar, and an extern call is made by every one of them: an AMO
# must be issued by one thread, and its old value shared with the others. Element 0 of a block of
# _SHARE lanes lives in thread 0 for every num_warps (at most 1024 threads), so a sum over such a
# block that keeps only element 0 hands every thread thread 0's value.
_SHARE: tl.constexpr = tl.constexpr(1024)


@triton.jit
def network_rmw(op: tl.constexpr, pointer, value, compare, cur_rank, peer, heap_bases, mask, releases: tl.constexpr):
    """NVSHMEM's fetching AMO ``op`` at scalar ``pointer`` on ``peer``, issued once by the
    program's thread 0; returns the old value to every thread. A releasing atomic first completes
    every thread's earlier puts (``nvshmem_quiet``, then a CTA barrier)."""
    if releases:
        # Each thread completes its own puts (NVSHMEM orders and completes per thread), then the
        # barrier makes all of them happen before thread 0's AMO.
        quiet()
        tl.debug_barrier()
    address = _address(pointer, mask, cur_rank, heap_bases)
    elem: tl.constexpr = pointer.dtype.element_ty
    old = tl.cast(0, elem)
    if _thread_index(cur_rank) == 0:
        old = amo(op, address, tl.cast(value, elem), tl.cast(compare, elem), _pe(peer, mask, cur_rank))
    lanes = tl.arange(0, _SHARE)
    picked = tl.where(lanes == 0, tl.zeros([_SHARE], elem) + old, tl.zeros([_SHARE], elem))
    return tl.sum(picked, axis=0)


@triton.constexpr_function
def rma_supported(pointer_ty):
    """Whether NVSHMEM has a ``_p``/``_g`` for ``pointer_ty``'s element type (fp16/bf16 as bits)."""
    name = pointer_ty.element_ty.name
    return name in _RMA_TYPES or name in _AS_BITS


@triton.constexpr_function
def amo_supported(op, pointer_ty):
    """Whether the network path can do NVSHMEM AMO ``op`` on ``pointer_ty``: a scalar pointer
    (flags, counters, locks; one AMO per program) of a type NVSHMEM has that AMO for."""
    return (not pointer_ty.is_block()) and op in _AMO_TYPES and pointer_ty.element_ty.name in _AMO_TYPES[op]


@triton.constexpr_function
def refusal(call, what):
    """The message printed when a kernel reaches a peer on another node with what NVSHMEM lacks."""
    return (f"iris: {call} {what} to a peer on another node: NVSHMEM's device API has no such operation "
            f"(network atomics: scalar int32/int64 add, sub, xchg, cas, and, or, xor; put/get: 8- to 64-bit "
            f"types); the job stops here. Peer rank:")


@triton.jit
def _trap(anchor):
    return tl.inline_asm_elementwise("trap; mov.u32 $0, $1;", "=r,r", [anchor], dtype=tl.int32, is_pure=False,
                                     pack=1)


@triton.jit
def refuse_if_unmapped(heap_bases, peer, message: tl.constexpr):
    """Compiled where an access NVSHMEM cannot carry is made: a mapped peer goes on through the
    pointer path; an unmapped one prints ``message`` and the peer, then stops the kernel (a trap
    ends the CUDA context, and with it the job). Kernels compile on every backend, and nothing is
    silently wrong across nodes."""
    if unmapped(heap_bases, peer):
        tl.device_print(message, peer)
        _trap(peer)
