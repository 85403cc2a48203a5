"""Where supported Triton versions (3.6 to 3.9) differ, and the one path that serves all of them.

Everything that depends on a Triton internal lives here; the rest of the package does not test
versions.

``aggregate`` (``triton.language.core._aggregate`` is private and changed twice):

- 3.6 and 3.7 build the value class from ``cls.__annotations__`` and copy every method found by
  ``inspect.getmembers`` (inherited ones too), so plain mixin classes with ``@triton.jit`` methods
  worked as bases.
- 3.8 and 3.9 resolve fields over the MRO and refuse any base that is not itself an aggregate
  ("Aggregates can only inherit from other aggregates"); they also freeze fields after
  ``__init__``.

One path works on all four: the class is flattened into a base-less class holding the merged
namespace and annotations of its MRO (subclasses win), and that is what ``_aggregate`` sees.
Mixins such as :class:`~iris.device.DeviceContextMethods` stay plain classes.

Under the interpreter (every version up to 3.9), ``_aggregate`` copies only ``JITCallable``
members, and an ``InterpretedFunction`` is not one: methods are re-attached to the value class
(static ones as they are, instance ones as plain functions that pass ``self`` on, since an
``InterpretedFunction`` is not a descriptor).
"""

from __future__ import annotations

import inspect

from triton.language.core import _aggregate

from ._interpreter import interpreter_enabled

# Attributes of a class object that describe the object itself, not what the aggregate holds.
_CLASS_PLUMBING = frozenset({"__dict__", "__weakref__", "__annotations__", "__annotate__",
                             "__annotate_func__", "__annotations_cache__", "__static_attributes__"})


def aggregate(cls):
    """Make ``cls`` a Triton aggregate (a value passed to and between ``@triton.jit`` functions).

    Like ``triton.language.core._aggregate`` but on every supported Triton and under the
    interpreter: ``cls`` may inherit ``@triton.jit`` methods from plain (non-aggregate) classes.
    Fields are the annotations of ``cls`` and its bases; ``__init__`` is usually a
    ``triton.constexpr_function`` that sets each field once.
    """
    flat = _flatten(cls)
    value_cls = _aggregate(flat)
    if interpreter_enabled():
        _reattach_interpreted_methods(value_cls, flat)
    return value_cls


def _flatten(cls):
    """One class without bases whose namespace is ``cls``'s MRO merged (subclasses win)."""
    if cls.__bases__ == (object,):
        return cls
    namespace = {}
    annotations = {}
    for klass in reversed(cls.__mro__[:-1]):  # object last in the MRO, skipped
        if getattr(klass, "__triton_aggregate__", False):
            raise TypeError(f"aggregate({cls.__qualname__}): base {klass.__qualname__} is already an aggregate; "
                            "put shared @triton.jit methods in a plain mixin class and inherit from that")
        namespace.update((k, v) for k, v in vars(klass).items() if k not in _CLASS_PLUMBING)
        annotations.update(inspect.get_annotations(klass))
    namespace["__annotations__"] = annotations
    namespace["__qualname__"] = cls.__qualname__
    return type(cls.__name__, (), namespace)


def _reattach_interpreted_methods(value_cls, flat) -> None:
    from triton.runtime.interpreter import InterpretedFunction

    for name, member in vars(flat).items():
        if isinstance(member, staticmethod) and isinstance(member.__func__, InterpretedFunction):
            setattr(value_cls, name, member.__func__)
        elif isinstance(member, InterpretedFunction):
            setattr(value_cls, name, _bind_forwarder(member))


def _bind_forwarder(fn):
    def method(self, *args, **kwargs):
        return fn(self, *args, **kwargs)

    method.__name__ = fn.__name__
    method.__doc__ = fn.fn.__doc__
    method.__wrapped__ = fn.fn
    return method
