"""Compile-time validation of the string options the spec defines (sem, scope, cache modifiers).

Each checker runs while a kernel is compiled (or interpreted) and either returns the value Triton
should receive or raises :class:`IrisUsageError` naming the call, the bad value and the accepted
ones. Defaults are ``None`` because Triton 3.6 cannot compile a string default on a constexpr.

Cache modifiers, spec value -> what is emitted on NVIDIA (PTX ``ld``/``st`` qualifier):

=========  ==========================  ==========================================
kind       spec value                  NVIDIA
=========  ==========================  ==========================================
load       ``None`` (default)          no qualifier: cached in L1 and L2 (= .ca)
load       ``".ca"``                   ``ld.global.ca``: cache at all levels
load       ``".cg"``                   ``ld.global.cg``: L2 only, bypass L1
load       ``".cv"``                   ``ld.volatile.global``: not kept in L1, re-read
                                       from the coherence point on every access (*)
store      ``None`` (default)          no qualifier: write-back (= .wb)
store      ``".wb"``                   ``st.global.wb``: write-back
store      ``".cg"``                   ``st.global.cg``: L2 only
store      ``".cs"``                   ``st.global.cs``: streaming, evict first
store      ``".wt"``                   ``st.global.wt``: write-through to memory
=========  ==========================  ==========================================

(*) Triton's NVIDIA backend accepts ``".cv"`` but emits no qualifier for it (a plain cached
load), which would silently lose the spec's "fetch from memory, globally coherent" meaning. A
volatile load gives that meaning on NVIDIA (PTX treats ``ld.volatile`` on global memory as a
relaxed load at system scope), and it still vectorizes (``ld.volatile.global.v4``).

``".ca"`` or ``".cg"`` together with ``volatile=True`` is rejected: ptxas has no volatile load
with a caching qualifier.
Under the interpreter the modifiers are accepted and have no effect (host memory has no GPU
caches).
"""

from __future__ import annotations

import triton

from ._errors import IrisUsageError

SEMANTICS = ("acquire", "release", "acq_rel", "relaxed")
SCOPES = ("gpu", "cta", "sys")
# ".cv" becomes a volatile load (see the table), not a qualifier.
LOAD_CACHE_MODIFIERS = {None: "", ".ca": ".ca", ".cg": ".cg", ".cv": ""}
STORE_CACHE_MODIFIERS = {None: "", ".wb": ".wb", ".cg": ".cg", ".cs": ".cs", ".wt": ".wt"}


@triton.constexpr_function
def checked_sem(call, sem):
    """``sem`` as Triton takes it, or an error naming ``call`` and the accepted values."""
    if sem is not None and sem not in SEMANTICS:
        raise IrisUsageError(
            f"{call}(sem={sem!r}): sem must be one of {SEMANTICS} or None (= 'acq_rel'); "
            f"pass e.g. sem='release' on the writer and sem='acquire' on the reader"
        )
    return sem


@triton.constexpr_function
def checked_scope(call, scope):
    """``scope`` as Triton takes it, or an error naming ``call`` and the accepted values."""
    if scope is not None and scope not in SCOPES:
        raise IrisUsageError(
            f"{call}(scope={scope!r}): scope must be one of {SCOPES} or None (= 'gpu'); "
            f"use scope='sys' for flags that another GPU or process reads"
        )
    return scope


@triton.constexpr_function
def ld_modifier(call, modifier, volatile=False, param="cache_modifier"):
    """The PTX load qualifier for a spec cache modifier (see the module table).

    ``param`` is the name the caller gave the option (``cache_modifier`` for ``load``,
    ``load_cache_modifier`` for ``get``/``put``/``copy``), so the message names what to change.
    """
    if modifier not in LOAD_CACHE_MODIFIERS:
        accepted = tuple(k for k in LOAD_CACHE_MODIFIERS if k is not None)
        raise IrisUsageError(
            f"{call}({param}={modifier!r}): a load accepts None or one of {accepted}; "
            f"'.cv' re-reads memory on every access, '.cg' skips L1"
        )
    if volatile and modifier in (".ca", ".cg"):
        raise IrisUsageError(
            f"{call}({param}={modifier!r}, volatile=True): NVIDIA has no volatile load that is also cached "
            f"({modifier!r}); ptxas rejects it. Use {param}=None or '.cv' with volatile=True"
        )
    return LOAD_CACHE_MODIFIERS[modifier]


@triton.constexpr_function
def ld_volatile(modifier, volatile):
    """Whether the load is emitted volatile: asked for, or implied by ``".cv"`` (module table)."""
    return bool(volatile) or modifier == ".cv"


@triton.constexpr_function
def st_modifier(call, modifier, param="cache_modifier"):
    """The PTX store qualifier for a spec cache modifier (see the module table); ``param`` as in
    :func:`ld_modifier`."""
    if modifier not in STORE_CACHE_MODIFIERS:
        accepted = tuple(k for k in STORE_CACHE_MODIFIERS if k is not None)
        raise IrisUsageError(
            f"{call}({param}={modifier!r}): a store accepts None or one of {accepted}; "
            f"'.cs' streams (evict first), '.wt' writes through"
        )
    return STORE_CACHE_MODIFIERS[modifier]
