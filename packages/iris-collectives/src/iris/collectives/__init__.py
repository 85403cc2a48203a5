"""iris.collectives: tiles, tensor views and tile-level collectives for ``@triton.jit`` kernels."""

from ._version import __version__

__all__ = ["__version__"]
