"""The host path of a collective call: a cache of launch plans, and building a plan on a miss.

A call's *key* (collective, op, config, and each tensor's address, shape, dtype, device and
contiguity; see :func:`call_key`) decides everything the launch needs: the checks it
passed, the chosen :class:`Config`, the workspace (lock records and staging buffers, from the
fused ops' per-context cache, :mod:`iris.collectives.ops._workspace`), the grid and the
compile-time arguments. A hit therefore costs a dict lookup and the kernel launch; only a miss
validates, chooses and allocates. Plans hold no per-call values (the call counters are in the
lock records on the device), so launching one again, or replaying a CUDA graph of it, is a new
call.
"""

from __future__ import annotations

import os
import weakref

import torch

from ..ops import _workspace

#: ``IRIS_CCL_DIRECT_LAUNCH=0`` sends every GPU launch through Triton's launcher (see DirectLaunch).
DIRECT_LAUNCH = os.environ.get("IRIS_CCL_DIRECT_LAUNCH", "1") != "0"

# ctx -> (the context's workspace dict when the plans were made, {key: plan}). A plan made
# before clear_workspaces() freed its buffers is dropped: the workspace dict is then another one.
_PLANS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def call_key(name, config, out, inp):
    """The key of a call (see the module docstring), or None when an argument is not a tensor (the
    checks of a miss then say what is wrong). ``name`` names the collective (with its op).

    It holds what the caller passed as it is (addresses, shapes, dtypes, devices, contiguity),
    not what the plan derives from it (which tensors are on the heap, how ``out`` and ``inp``
    alias, their 16-byte alignment, which Triton specialises the kernel on): those are functions
    of the addresses and sizes, so the same key always derives the same, and building the key
    costs a few attribute reads instead of the derivations (about 13 of a call's host
    microseconds before). The price: each new address is a miss, which is why the plans of a
    context are capped (:data:`MAX_PLANS`); a miss re-derives, and finds its workspace cached."""
    try:
        return (name, config, inp.data_ptr(), inp.shape, inp.dtype, inp.device, inp.is_contiguous(), out.data_ptr(),
                out.shape, out.dtype, out.device, out.is_contiguous())
    except (AttributeError, TypeError):
        return None


#: Plans kept per context; past it the oldest are dropped (their workspaces stay cached). A
#: program that passes new tensors every call (fresh activations) misses until its caching
#: allocator repeats addresses, and never grows without bound.
MAX_PLANS = 1024


def plan_for(ctx, key, make):
    """The plan cached for ``key``, else ``make()`` (which checks the call and builds the plan),
    cached under ``key`` unless it is None."""
    plan = lookup(ctx, key) if key is not None else None
    if plan is None:
        plan = make()
        if key is not None:
            remember(ctx, key, plan)
    return plan


def lookup(ctx, key):
    """The plan cached for ``key`` on ``ctx`` (a callable), or None."""
    entry = _PLANS.get(ctx)
    if entry is None or _workspace._CACHES.get(ctx) is not entry[0]:
        return None
    try:
        return entry[1].get(key)
    except TypeError:  # an unhashable argument (a bad config): the checks of a miss report it
        return None


def remember(ctx, key, plan) -> None:
    """Cache ``plan`` for ``key`` on ``ctx`` (after its workspace exists)."""
    caches = _workspace._CACHES.get(ctx)
    entry = _PLANS.get(ctx)
    if entry is None or entry[0] is not caches:
        entry = _PLANS[ctx] = (caches, {})
    plans = entry[1]
    try:
        plans[key] = plan
    except TypeError:
        return
    if len(plans) > MAX_PLANS:
        del plans[next(iter(plans))]  # the oldest (dicts keep insertion order)


def forget(ctx) -> None:
    """Drop every plan of ``ctx``."""
    _PLANS.pop(ctx, None)


def capacity(tiles: int) -> int:
    """Tiles a workspace holds for a call of ``tiles`` tiles: the next power of two, so that calls
    of similar sizes share one workspace (fewer heap allocations), and ranks that pass different
    sizes still share lock records, which debug mode's signatures then report."""
    return 1 << (tiles - 1).bit_length()


def workspace(ctx, key: tuple, make):
    """The fused ops' per-context workspace for ``key`` (see ``ops._workspace.workspace``)."""
    return _workspace.workspace(ctx, key, make)


def launcher(ctx, ws, kernel, tiles: int, cap_tiles: int, cfg, args: tuple, constexprs: dict):
    """The launch of ``kernel`` for a call of ``tiles`` tiles whose run-time arguments are
    ``args`` (the call's own tensors and values, in the kernel's order), with ``constexprs``: a
    persistent grid of at most ``cfg.grid`` programs, the tiles, and what is resident
    (``ctx.resident_grid``, collective and compiling on the GPU, found once per workspace and
    compiled variant, for its capacity).

    The result is called with the arguments of each call (``launch(*args)``); once its ``fast``
    attribute is set (on the GPU, from the second call on), ``launch.fast()`` enqueues the same
    launch with no arguments at all: a plan's arguments are fixed by its key."""
    options = dict(constexprs, num_warps=cfg.num_warps)
    variant = tuple(sorted(constexprs.items()))
    resident = ws.grids.get(variant)
    if resident is None:
        compiled = kernel.warmup(*args, grid=(1,), **options) if ctx.device.type == "cuda" else None
        resident = ws.grids[variant] = ctx.resident_grid(cap_tiles, compiled)
    grid = min(resident, tiles, cfg.grid or tiles)
    if ctx.device.type == "cuda" and DIRECT_LAUNCH:
        addresses = tuple(a.data_ptr() if isinstance(a, torch.Tensor) else a for a in args)
        return DirectLaunch(kernel, grid, options, ctx.device, addresses)
    return TritonLaunch(kernel, grid, options)


class TritonLaunch:
    """``kernel[(grid,)](*args, **options)``: every call through Triton's launcher (the cpu
    backend's interpreter, or ``IRIS_CCL_DIRECT_LAUNCH=0``)."""

    fast = fast_with = None

    def __init__(self, kernel, grid: int, options: dict):
        self.run, self.options = kernel[(grid,)], options

    def __call__(self, *args):
        self.run(*args, **self.options)


class DirectLaunch:
    """``kernel[(grid,)](*args, **options)`` for a plan's fixed arguments, cheaper from the second
    call on.

    Through Triton's launcher a launch binds and specialises every argument, looks the compiled
    kernel up, and for each tensor asks the driver what its pointer is: tens of microseconds of
    host time, more than a 4 KiB collective takes on the GPU. The first call goes through it
    (compiling); then ``fast()`` hands the same compiled kernel to the launcher's C entry point
    directly, with the arguments as integers (``addresses``: the plan's tensors' addresses, which
    its key fixes), on torch's current stream of the moment (so a CUDA graph capture records it
    on the capture stream). That is only right while the arguments specialise the same way: a
    plan's key fixes every address and size, the buffers are the plan's own, and ``root`` is not
    specialised (``do_not_specialize``; broadcast passes it per call, see ``fast_with``). Launch
    hooks (profilers) send every call through Triton's launcher."""

    def __init__(self, kernel, grid: int, options: dict, device, addresses: tuple):
        self.kernel, self.grid, self.options, self.device = kernel, grid, options, device
        self.addresses = addresses
        self.fast = self.fast_with = None

    def __call__(self, *args):
        compiled = self.kernel[(self.grid,)](*args, **self.options)
        try:
            self.fast_with = self._fast(compiled, len(args))
        except Exception:  # another Triton: keep its launcher
            self.fast_with = None
        if self.fast_with is not None:
            enqueue, addresses = self.fast_with, self.addresses
            self.fast = lambda: enqueue(addresses)

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

            def fast(args):
                c_launch(grid, 1, 1, stream_of(index), function, coop, pdl, None, None, packed, None, None, None,
                         *args, *tail)
        else:
            def fast(args):
                run(grid, 1, 1, stream_of(index), function, packed, None, None, None, *args, *tail)

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
