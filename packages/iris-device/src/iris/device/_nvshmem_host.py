"""Host side of the network path: NVSHMEM's device bitcode into the kernels that call it, and
NVSHMEM's device state into every module loaded with it.

Two Triton hooks, installed once by the runtime's ``nvshmem`` heap (:func:`install`):

- a compiler-stages hook: for a kernel whose IR calls an ``nvshmem`` function, the LLVM stage
  links ``libnvshmem_device.bc`` besides libdevice (Triton links only what is used). Kernels are
  launched as usual: no ``extern_libs`` argument for the user to remember;
- a module-load hook: a loaded module that holds NVSHMEM's device state
  (``nvshmemi_device_state_d``) is initialised with ``nvshmemx_cumodule_init`` before its first
  launch; without it the device functions would read an empty state.

Nothing here is imported unless the ``nvshmem`` backend starts.
"""

from __future__ import annotations

import dataclasses
import glob
import hashlib
import os
import sys

import triton

from ._errors import IrisBackendError

#: Name under which the bitcode is passed to Triton's ``extern_libs``.
LIBRARY_NAME = "libnvshmem_device"
#: The global NVSHMEM's device code keeps its state in; its presence marks a module to initialise.
STATE_SYMBOL = b"nvshmemi_device_state_d"


def device_bitcode() -> str:
    """Path of NVSHMEM's device bitcode: ``IRIS_NVSHMEM_BITCODE`` if set, else the file of the
    installed ``nvidia-nvshmem`` wheel (``nvidia/nvshmem/lib/libnvshmem_device.bc``)."""
    path = os.environ.get("IRIS_NVSHMEM_BITCODE")
    if path:
        if not os.path.isfile(path):
            raise IrisBackendError(f"IRIS_NVSHMEM_BITCODE={path!r}: no such file; point it at libnvshmem_device.bc")
        return path
    for entry in sys.path:
        found = sorted(glob.glob(os.path.join(entry, "nvidia", "nvshmem", "lib", "libnvshmem_device*.bc")))
        # The arch-neutral entry point, when there are per-arch files beside it.
        plain = [f for f in found if os.path.basename(f) == "libnvshmem_device.bc"]
        if plain or found:
            return (plain or found)[0]
    raise IrisBackendError(
        "nvshmem backend: NVSHMEM's device bitcode (nvidia/nvshmem/lib/libnvshmem_device.bc) was not found on "
        "sys.path; pip install nvidia-nvshmem-cu13 (a dependency of nvshmem4py-cu13), or set IRIS_NVSHMEM_BITCODE")


_installed: dict | None = None


def installed() -> bool:
    """Whether :func:`install` has run in this process."""
    return _installed is not None


def install(bitcode: str, module_init) -> None:
    """Install the two hooks (once per process). ``module_init(handle) -> status`` initialises
    a loaded module (``nvshmem.bindings.cumodule_init``; a status of None or 0 is success)."""
    global _installed
    if _installed is not None:
        # A new NVSHMEM runtime in the same process (a heap closed, another opened): the modules
        # Triton already loaded keep their handles, but their device state is the old one.
        _installed["module_init"] = module_init
        for module, name in sorted(_installed["modules"].items()):
            _init_module(module, name)
        return
    _installed = {"bitcode": bitcode, "module_init": module_init, "modules": {},
                  "previous_stages": triton.knobs.runtime.add_stages_inspection_hook}
    triton.knobs.runtime.add_stages_inspection_hook = _add_stages
    triton.knobs.runtime.kernel_load_end_hook.add(_on_load)


def _add_stages(*args):
    previous = _installed["previous_stages"]
    if not args:
        # Triton 3.8+ also calls the hook with no arguments, for a key and a hash that it adds to
        # its cache keys: kernels built with the bitcode linked are cached apart.
        key = f"iris-nvshmem-bitcode:{_installed['bitcode']}"
        if previous is not None:
            previous_key, previous_hash = previous()
            key = f"{previous_key}|{previous_hash}|{key}"
        return key, hashlib.sha256(key.encode()).hexdigest()
    backend, stages, options, language, capability = args
    if previous is not None:
        previous(backend, stages, options, language, capability)
    if "llir" not in stages or not hasattr(options, "extern_libs"):
        return
    make_llir = stages["llir"]
    libs = dict(options.extern_libs)
    libs[LIBRARY_NAME] = _installed["bitcode"]
    linked = dataclasses.replace(options, extern_libs=libs)

    def llir(src, metadata):
        # Parsing the 30 MB bitcode costs time: link it only into kernels that call NVSHMEM.
        if "nvshmem" not in str(src):
            return make_llir(src, metadata)
        return backend.make_llir(src, metadata, linked, capability)

    stages["llir"] = llir


def _on_load(module, function, name, metadata_group, hash):
    if _installed is None or not module:
        return
    from cuda.bindings import driver

    status, _, _ = driver.cuModuleGetGlobal(driver.CUmodule(int(module)), STATE_SYMBOL)
    if int(status) != 0:
        return  # no NVSHMEM in this kernel
    _installed["modules"][int(module)] = name
    _init_module(int(module), name)


def _init_module(module: int, name: str) -> None:
    result = _installed["module_init"](module)
    if result not in (None, 0):
        raise IrisBackendError(
            f"nvshmem backend: nvshmemx_cumodule_init failed ({result!r}) for kernel {name}; "
            f"was the nvshmem heap closed before this launch?")
