"""What the front doors of :mod:`.ccl` and :mod:`.ops` ask before they run: is ``torch.compile``
tracing this call? Then they hand it to the torch operators (:mod:`.functional._front`), which the
compiler records as graph nodes; in eager mode they launch their kernels directly."""

from __future__ import annotations

from torch.compiler import is_compiling

__all__ = ["is_compiling", "traced"]


def traced():
    """The front doors' compiled form, :mod:`iris.collectives.functional._front` (imported on first
    use: importing it registers the operators, and it imports the front doors' modules)."""
    from .functional import _front

    return _front
