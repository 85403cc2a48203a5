"""Whether kernels run through Triton's interpreter.

Triton decides at decoration time: with ``TRITON_INTERPRET=1`` set, ``@triton.jit`` returns an
``InterpretedFunction`` instead of a ``JITFunction``. ``iris.runtime`` sets the variable for the
CPU backend before it imports this package, so reading it once at import is enough.
"""

from __future__ import annotations

import triton
import triton.language as tl


def interpreter_enabled() -> bool:
    """True when ``@triton.jit`` builds interpreted functions (``TRITON_INTERPRET=1``)."""
    return bool(triton.knobs.runtime.interpret)


#: Compile-time flag, readable from ``@triton.jit`` code: kernels run in Triton's interpreter.
INTERPRETER: tl.constexpr = tl.constexpr(interpreter_enabled())


_launch_patched: set[int] | None = None  # ids of the language modules the running launch patched


def patch_nested_calls_once() -> bool:
    """Make Triton's interpreter patch ``triton.language`` once per launch instead of once per
    device-function call. Returns whether it did (False where the interpreter's internals are not
    the ones this was written against: Triton 3.6 to 3.9; nothing is changed then).

    Why: the interpreter's ``InterpretedFunction.__call__`` (every call of a ``@triton.jit``
    function from a kernel) runs ``_patch_lang`` again, which scans ``triton.language`` with
    ``inspect.getmembers`` to re-patch builtins that the launch (``GridExecutor.__call__``) has
    already patched. That rescan was half of the time of an interpreted collective (cProfile of a
    3-rank all-reduce: 24.7 of 49.5 s). A call whose function sees only language modules that the
    running launch has patched now skips it; any other call (one outside a launch, or one whose
    module sees another language module) still patches as Triton does, and the launch restores
    what it patched exactly as before.
    """
    try:
        from triton.runtime import interpreter as ti

        original_patch, original_launch = ti._patch_lang, ti.GridExecutor.__call__
        empty_scope = ti._LangPatchScope
    except AttributeError:
        return False
    if getattr(original_patch, "_iris_once", False):
        return True
    languages = (tl, tl.core)

    def language_ids(fn) -> frozenset:
        # ids of the language modules among fn's globals. Scanning a module's globals at every
        # call cost 7 of 54 s of an interpreted back-to-back all-reduce test (cProfile, 4 ranks):
        # kept on the function, and scanned again only when its module's globals grew.
        names = fn.__globals__
        cached = getattr(fn, "_iris_language_ids", None)
        if cached is not None and cached[0] == len(names):
            return cached[1]
        seen = frozenset(id(v) for v in names.values() if any(v is lang for lang in languages))
        try:
            fn._iris_language_ids = (len(names), seen)
        except (AttributeError, TypeError):  # not a plain function: scan at every call
            pass
        return seen

    def _patch_lang(fn):
        global _launch_patched
        seen = language_ids(fn)
        if _launch_patched is not None and seen and seen <= _launch_patched:
            return empty_scope()  # the running launch patched these; its restore undoes them
        scope = original_patch(fn)
        if _launch_patched is not None:
            _launch_patched |= seen
        return scope

    def launch(self, *args, **kwargs):
        global _launch_patched
        outer, _launch_patched = _launch_patched, set()
        try:
            return original_launch(self, *args, **kwargs)
        finally:
            _launch_patched = outer

    _patch_lang._iris_once = True
    ti._patch_lang = _patch_lang
    ti.GridExecutor.__call__ = launch
    return True



def skip_overflow_checks_that_cannot_fire() -> bool:
    """Stop Triton's interpreter from computing int32 overflow checks whose result it throws away.
    Returns whether it could (False where the interpreter has no shared builder with options:
    nothing is changed then).

    Why: the interpreter checks every int32 add, subtract and multiply of every kernel (it widens
    both operands to int64, redoes the operation and compares with the limits), then hands the
    result to its ``device_assert``, which returns at once unless the builder's ``debug`` option is
    on, and nothing turns it on (``TRITON_DEBUG`` does not reach the interpreter: Triton 3.6 to
    3.9). That dead work was 9 of the 54 s of an interpreted back-to-back all-reduce test
    (cProfile, 4 ranks). The checks stay where the asserts could fire (``debug`` on); results do
    not change either way (int32 arithmetic wraps, as on the GPU).
    """
    import dataclasses

    try:
        from triton.runtime import interpreter as ti

        builder = ti.interpreter_builder
        builder.options = dataclasses.replace(builder.options, sanitize_overflow=bool(builder.options.debug))
    except (AttributeError, TypeError):
        return False
    return True


def surface_iris_errors() -> bool:
    """Make an :class:`~iris.device.IrisError` that a kernel raises under Triton's interpreter reach
    the caller of the launch as itself, with its one-line message. Returns whether it could (False
    where the interpreter's internals are not the ones this was written against: nothing is
    changed then).

    Why: the interpreter wraps whatever a kernel raises in an ``InterpreterError`` carrying the
    ``repr`` of the error, once for the launch and once more for every ``@triton.jit`` function it
    went through, so a message of one line came out as seven nested reprs. Now the launch re-raises
    the innermost IrisError (its traceback still runs down into the kernel); anything else is
    wrapped as Triton wraps it. An error of the heap check (``iris.device._heap_check``) is also
    told which kernel argument its address lies in, so that it names the tensor.
    """
    try:
        from triton.runtime import interpreter as ti
        from triton.runtime.errors import InterpreterError

        original = ti.GridExecutor.__call__
    except (ImportError, AttributeError):
        return False
    if getattr(original, "_iris_surfaces", False):
        return True
    from ._errors import IrisError

    def launch(self, *args, **kwargs):
        try:
            return original(self, *args, **kwargs)
        except InterpreterError as wrapped:
            error = _innermost(wrapped, IrisError)
            if error is None:
                raise
            _name_the_tensor(error, self, args, kwargs)
            raise error from None

    launch._iris_surfaces = True
    ti.GridExecutor.__call__ = launch
    return True


def _innermost(exc: BaseException, kind: type):
    # The innermost exception of ``exc``'s chain of causes that is a ``kind``, or None.
    found, seen = None, set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, kind):
            found = exc
        exc = exc.__cause__
    return found


def _name_the_tensor(error: BaseException, executor, args: tuple, kwargs: dict) -> None:
    # A heap-check error whose address lies in a tensor argument that is not on the heap (a plain
    # torch tensor): its message names that argument instead of a heap offset.
    facts = getattr(error, "iris_off_heap", None)
    names = getattr(executor, "arg_names", None)
    if facts is None or names is None:
        return
    from ._heap_check import off_heap_message
    from ._layout import SIGNAL_PAD_BYTES

    address = facts["address"]
    heap = range(address - facts["offset"], address - facts["offset"] + facts["heap_size"] + SIGNAL_PAD_BYTES)
    for name, value in [*zip(names, args), *kwargs.items()]:
        if not (hasattr(value, "data_ptr") and hasattr(value, "untyped_storage")):
            continue  # not a tensor (duck-typed: iris.device does not import torch)
        storage = value.untyped_storage()
        start = storage.data_ptr()
        if start <= address < start + storage.nbytes() and value.data_ptr() not in heap:
            dtype = str(value.dtype).removeprefix("torch.")
            tensor = (f"argument '{name}' of {getattr(executor.fn, '__name__', 'the kernel')} (a {dtype} tensor of "
                      f"shape {tuple(value.shape)})")
            error.args = (off_heap_message(**{k: v for k, v in facts.items() if k != "address"}, tensor=tensor),)
            return
