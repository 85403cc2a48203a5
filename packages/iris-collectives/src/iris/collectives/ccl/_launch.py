"""The host path of a collective call: a cache of launch plans, and building a plan on a miss.

A call's *key* (collective, op, config, and each tensor's address, shape, dtype and contiguity;
see :func:`call_key`) decides everything the launch needs: the checks it
passed, the chosen :class:`Config`, the workspace (lock records and staging buffers, from the
per-context cache shared with the fused ops, :mod:`iris.collectives._workspace`), the grid and the
compile-time arguments. A hit therefore costs a dict lookup and the kernel launch; only a miss
validates, chooses and allocates. Plans hold no per-call values (the call counters are in the
lock records on the device), so launching one again, or replaying a CUDA graph of it, is a new
call.
"""

from __future__ import annotations

import os
import weakref

import torch

from iris.runtime import _agreement

from .. import _workspace
from .._agree import host_calls
from .._errors import unwrapped
from ._config import REGISTER_FROM

#: ``IRIS_CCL_DIRECT_LAUNCH=0`` sends every GPU launch through Triton's launcher (see DirectLaunch).
DIRECT_LAUNCH = os.environ.get("IRIS_CCL_DIRECT_LAUNCH", "1") != "0"

# ctx -> (the workspace generation the plans were made in, {key: plan}, the context's
# registrations generation then). Plans made before clear_workspaces() freed their buffers, or
# before a tensor was registered or unregistered, are dropped: a generation has moved on.
_PLANS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
# The context looked up last (a weak reference) and its entry: most programs have one context,
# and a weak dictionary lookup costs more than the rest of a hit.
_LAST: list = [None, None]


def agreed_reach(ctx, config, *tensors, message=None):
    """How the peers reach ``tensors`` (a call's tensors the peers read or write), agreed with them
    (``ctx.reach``: collective, one allgather; plain tensors registered on the fly), when the call
    asks for it: ``config.register`` True, or None on the ``cuda`` backend for a message of at
    least :data:`REGISTER_FROM` bytes (``message``, the call's larger buffer, when it is not the
    first tensor: all_gather's peers read ``inp``, a ``W``-th of its message ``out``), when the
    host's allgather is quick (MPI; under torchrun gloo's takes milliseconds: only
    ``register=True`` agrees there). Else None (each rank decides alone: the heap's
    translation for heap tensors, ``ctx.register``'s registrations, staging for the rest). What
    decides is the same on every rank (the config, the backend, the message size), so every rank
    takes part in the allgather or none does."""
    register = None if config is None else getattr(config, "register", None)
    try:
        if register is False or ctx.world_size == 1:
            return None
        if register is None:
            sized = tensors[0] if message is None else message
            if ctx.device.type != "cuda" or sized.numel() * sized.element_size() < REGISTER_FROM:
                return None
            if not ctx.quick_allgather:  # gloo (torchrun): the agreement would cost milliseconds
                return None
        elif register is not True:
            return None  # a bad value: the checks of the plan report it
    except (AttributeError, TypeError, IndexError):
        return None  # not a tensor: the checks of the plan say what is wrong
    # a rank's bad tensor is reached by staging (ctx.reach), and then the checks of its plan say why
    return tuple(ctx.reach(tensors))


def call_key(name, config, out, inp, reach=None):
    """The key of a call (see the module docstring), or None when an argument is not a tensor (the
    checks of a miss then say what is wrong). ``name`` names the collective (with its op).

    It holds what the caller passed as it is (addresses, shapes, dtypes, contiguity; the device
    is implied by the address, since CUDA gives every device and the host their own ranges),
    not what the plan derives from it (which tensors are on the heap, how ``out`` and ``inp``
    alias, their 16-byte alignment, which Triton specialises the kernel on): those are functions
    of the addresses and sizes, so the same key always derives the same, and building the key
    costs a few attribute reads instead of the derivations (about 13 of a call's host
    microseconds before). The price: each new address is a miss, which is why the plans of a
    context are capped (:data:`MAX_PLANS`); a miss re-derives, and finds its workspace cached."""
    try:
        key = (name, config, inp.data_ptr(), inp.shape, inp.dtype, inp.is_contiguous(), out.data_ptr(), out.shape,
               out.dtype, out.is_contiguous())
    except (AttributeError, TypeError):
        return None
    # agreed with the peers: the plan depends on the agreement (which registration, or staging)
    return key if reach is None else (*key, tuple(r.ident for r in reach))


#: Plans kept per context; past it the oldest are dropped (their workspaces stay cached). A
#: program that passes new tensors every call (fresh activations) misses until its caching
#: allocator repeats addresses, and never grows without bound.
MAX_PLANS = 1024


def call(ctx, key, make, *args) -> None:
    """Run the plan cached for ``key`` with ``args``; on a miss ``make()`` builds it first."""
    plan = lookup(ctx, key)
    if plan is None:
        plan = plan_for(ctx, key, make)
    plan(*args)


def plan_for(ctx, key, make):
    """The plan cached for ``key``, else ``make()`` (which checks the call and builds the plan),
    cached under ``key`` unless it is None."""
    plan = lookup(ctx, key) if key is not None else None
    if plan is None:
        # the host collectives of a plan's making (agreement, grid, workspace), named in the watchdog's reports
        name = key[0] if key is not None else "a call"
        with host_calls(ctx, f"a new plan of iris.collectives.ccl {name if isinstance(name, str) else name[0]}"):
            plan = make()
        if key is not None:
            remember(ctx, key, plan)
    return plan


def _entry(ctx):
    # The (generation, plans) entry of ctx if it is current, else None.
    last = _LAST
    if last[0] is not None and last[0]() is ctx:
        entry = last[1]
    else:
        entry = _PLANS.get(ctx)
        if entry is not None:
            last[0], last[1] = weakref.ref(ctx), entry
    # registering or unregistering a tensor changes where the peers reach it: new plans
    if entry is None or entry[0] != _workspace.generation or entry[2] != ctx.registrations_generation:
        return None
    return entry


def lookup(ctx, key):
    """The plan cached for ``key`` on ``ctx`` (a callable), or None."""
    entry = _entry(ctx)
    if entry is None:
        return None
    try:
        return entry[1].get(key)
    except TypeError:  # an unhashable argument (a bad config): the checks of a miss report it
        return None


def remember(ctx, key, plan) -> None:
    """Cache ``plan`` for ``key`` on ``ctx`` (after its workspace exists), in place of what was
    cached for it."""
    entry = _entry(ctx)
    if entry is None:
        entry = _PLANS[ctx] = (_workspace.generation, {}, ctx.registrations_generation)
        _LAST[0], _LAST[1] = weakref.ref(ctx), entry
    plans = entry[1]
    try:
        plans[key] = plan
    except TypeError:
        return
    if len(plans) > MAX_PLANS:
        del plans[next(iter(plans))]  # the oldest (dicts keep insertion order)


def promote(ctx, key, launch) -> None:
    """After a plan's launch has run once: cache its fast form (``launch.fast``, when there is
    one) for ``key`` in place of the plan, so that later calls enqueue with no Python between
    the lookup and the launcher."""
    if launch.fast is not None and key is not None:
        remember(ctx, key, launch.fast)


def forget(ctx) -> None:
    """Drop every plan of ``ctx``."""
    _PLANS.pop(ctx, None)
    _LAST[0] = _LAST[1] = None


# The call agreement drops its oldest signatures on every rank at once when it has too many; the
# plans built on them must go too, or a rank whose plan is cached would skip the agreement that a
# rank with a new tensor makes (iris.runtime._agreement).
_agreement.FORGET_HOOKS.append(forget)


def capacity(tiles: int) -> int:
    """Tiles a workspace holds for a call of ``tiles`` tiles: the next power of two, so that calls
    of similar sizes share one workspace (fewer heap allocations), and ranks that pass different
    sizes still share lock records, which debug mode's signatures then report."""
    return 1 << (tiles - 1).bit_length()


def peer_reach(ctx, t: torch.Tensor, agreed=None) -> tuple[bool, torch.Tensor]:
    """Whether the peers can read ``t`` in place, and the table that translates it to them:
    ``agreed`` (the :class:`iris.runtime.Reach` of ``t`` from :func:`agreed_reach`) when the call
    agreed on it, else a registered tensor's registration (``ctx.register``: a heap tensor too,
    which is how heap tensors at different offsets on different ranks are reached), else the
    heap's bases, in place when ``t`` is on the heap (else the call stages it, and the staging
    buffer is on the heap)."""
    if agreed is not None:
        return agreed.in_place, agreed.bases
    registration = ctx.registration_of(t)
    if registration is not None:
        return True, registration.bases
    return ctx.is_symmetric(t), ctx.get_heap_bases()


def round_elements(cfg, n: int, staged: bool) -> int:
    """Elements per round of a call moving ``n`` (per chunk): ``cfg.chunk`` when it stages,
    ``cfg.heap_chunk`` when the peers read its tensors in place, at most ``n``; ``n`` (one round)
    when the one that applies is None."""
    rounds = cfg.chunk if staged else cfg.heap_chunk
    return n if rounds is None else min(rounds, n)


def grid_key(cfg) -> tuple:
    """What, besides the compiled kernel, decides the grid of a call: for the workspace key of the
    buffered variants, whose every call must give each program the same tiles (their launches
    then size the grid for the workspace's capacity, not for the call's tiles)."""
    return cfg.num_warps, cfg.grid


def workspace(ctx, key: tuple, make):
    """The per-context workspace for ``key``, shared with the fused ops (see ``_workspace.workspace``)."""
    return _workspace.workspace(ctx, key, make)


def launcher(ctx, ws, kernel, tiles: int, cap_tiles: int, cfg, args: tuple, constexprs: dict, root_last=False,
             fixed_grid: int | None = None):
    """The launch of ``kernel`` for a call of ``tiles`` tiles whose run-time arguments are
    ``args`` (the call's own tensors and values, in the kernel's order), with ``constexprs``: a
    persistent grid of at most ``cfg.grid`` programs, the tiles, and what is resident
    (``ctx.resident_grid``, collective and compiling on the GPU, found once per workspace and
    compiled variant, for its capacity).

    The result is called with the arguments of each call (``launch(*args)``). Once that has
    compiled the kernel, its ``fast`` attribute (on the GPU) is a callable that enqueues the same
    launch again from ``fast(out, inp)``, ignoring them (a plan's key fixes every address), or
    with ``root_last``, from ``fast(out, inp, root)``, with ``root`` as the kernel's last argument:
    the plans replace themselves with it.

    ``fixed_grid``: the programs of the launch, agreed with the peers beforehand (point-to-point
    calls, which only two ranks make: no collective step here)."""
    options = dict(constexprs, num_warps=cfg.num_warps)
    if fixed_grid is not None:
        grid = fixed_grid
    else:
        variant = tuple(sorted(constexprs.items()))
        resident = ws.grids.get(variant)
        if resident is None:
            compiled = kernel.warmup(*args, grid=(1,), **options) if ctx.device.type == "cuda" else None
            resident = ws.grids[variant] = ctx.resident_grid(cap_tiles, compiled)
        grid = min(resident, tiles, cfg.grid or tiles)
    if ctx.device.type == "cuda" and DIRECT_LAUNCH:
        addresses = tuple(a.data_ptr() if isinstance(a, torch.Tensor) else a for a in args)
        return DirectLaunch(kernel, grid, options, ctx.device, addresses, root_last)
    return TritonLaunch(kernel, grid, options)


class TritonLaunch:
    """``kernel[(grid,)](*args, **options)``: every call through Triton's launcher (the cpu
    backend's interpreter, or ``IRIS_CCL_DIRECT_LAUNCH=0``)."""

    fast = None

    def __init__(self, kernel, grid: int, options: dict):
        self.run, self.options = kernel[(grid,)], options

    def __call__(self, *args):
        try:
            self.run(*args, **self.options)
        except Exception as exc:
            error = unwrapped(exc)
            if error is exc:
                raise
            raise error from None  # the call mismatch the kernel found, not the interpreter's wrapping


class DirectLaunch:
    """``kernel[(grid,)](*args, **options)`` for a plan's fixed arguments, cheaper from the second
    call on.

    Through Triton's launcher a launch binds and specialises every argument, looks the compiled
    kernel up, and for each tensor asks the driver what its pointer is: tens of microseconds of
    host time, more than a 4 KiB collective takes on the GPU. The first call goes through it
    (compiling); then ``fast`` hands the same compiled kernel to the launcher's C entry point
    directly, with the arguments as integers (``addresses``: the plan's tensors' addresses, which
    its key fixes), on torch's current stream of the moment (so a CUDA graph capture records it
    on the capture stream). That is only right while the arguments specialise the same way: a
    plan's key fixes every address and size, the buffers are the plan's own, and ``root`` is not
    specialised (``do_not_specialize``). Launch hooks (profilers) send every call through
    Triton's launcher."""

    def __init__(self, kernel, grid: int, options: dict, device, addresses: tuple, root_last: bool = False):
        self.kernel, self.grid, self.options, self.device = kernel, grid, options, device
        self.addresses, self.root_last = addresses, root_last
        self.fast = None

    def __call__(self, *args):
        compiled = self.kernel[(self.grid,)](*args, **self.options)
        try:
            self.fast = self._fast(compiled, len(args))
        except Exception:  # another Triton: keep its launcher
            self.fast = None

    def _fast(self, compiled, given: int):
        from triton import knobs
        from triton.runtime import driver

        hooks = (knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook)
        if any(h is not None and getattr(h, "calls", True) for h in hooks):  # Triton 3.9: empty HookChains
            return None
        # the compile-time values, in parameter order after the run-time arguments
        tail = tuple(self.options[p.name] for p in self.kernel.params[given:])
        run, function, packed = compiled.run, compiled.function, compiled.packed_metadata
        stream_of, index, grid = driver.active.get_current_stream, self.device.index or 0, self.grid
        c_launch = _c_entry(run)
        if c_launch is not None:
            # the launcher's C function itself: no scratch buffers to allocate, no Python frame
            coop, pdl = run.launch_cooperative_grid, run.launch_pdl
            head = (grid, 1, 1)
            middle = (function, coop, pdl, None, None, packed, None, None, None)
            if self.root_last:
                front = (*middle, *self.addresses[:-1])

                def fast(out, inp, root):
                    c_launch(*head, stream_of(index), *front, root, *tail)
            else:
                rest = (*middle, *self.addresses, *tail)

                def fast(out, inp):
                    c_launch(*head, stream_of(index), *rest)
        elif self.root_last:
            front = self.addresses[:-1]

            def fast(out, inp, root):
                run(grid, 1, 1, stream_of(index), function, packed, None, None, None, *front, root, *tail)
        else:
            rest = (*self.addresses, *tail)

            def fast(out, inp):
                run(grid, 1, 1, stream_of(index), function, packed, None, None, None, *rest)

        return fast


def _c_entry(run):
    """The C entry point behind Triton's ``CudaLauncher`` ``run`` when calling it directly is what
    ``run`` would do (Triton 3.6's layout: no global or profile scratch to allocate), else None."""
    import triton

    if not triton.__version__.startswith("3.6."):
        return None
    if getattr(run, "global_scratch_size", 1) or getattr(run, "profile_scratch_size", 1):
        return None
    if not all(hasattr(run, name) for name in ("launch", "launch_cooperative_grid", "launch_pdl")):
        return None
    return run.launch
