"""What the front doors of :mod:`.ccl` and :mod:`.ops` ask before they run: is ``torch.compile``
tracing this call? Then they hand it to the torch operators (:mod:`.functional._front`), which the
compiler records as graph nodes; in eager mode they launch their kernels directly."""

from __future__ import annotations

from torch.compiler import is_compiling

__all__ = ["is_compiling", "traced", "use_front"]

_FRONT = None


def use_front(module) -> None:
    """Called once by :mod:`iris.collectives.functional._front` as it is imported (the package's
    ``__init__`` imports it): the module whose functions the front doors call while tracing."""
    global _FRONT
    _FRONT = module


def traced():
    """The front doors' compiled form, :mod:`iris.collectives.functional._front`: registered here
    by that module, so that the front doors' modules, which it imports, do not import it back."""
    return _FRONT
