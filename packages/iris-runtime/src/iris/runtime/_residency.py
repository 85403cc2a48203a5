"""Grid sizes for kernels whose programs wait for programs of other ranks.

A program that spins on a flag raised by a program of another rank only finishes if that program
runs at the same time. A GPU starts the programs of a launch as resources free up, so every
program that waits must be resident together with every program it waits for, on every rank
that shares the GPU. These helpers compute that limit from a compiled kernel's registers, warps
and shared memory and the device's per-SM limits.
"""

from __future__ import annotations

import torch

from ._errors import IrisUsageError

KiB = 1024

# Hardware limits of a multiprocessor that torch does not report on every version (H100/H200).
_DEFAULT_REGS_PER_SM = 65536
_DEFAULT_THREADS_PER_SM = 2048
_DEFAULT_SMEM_PER_SM = 228 * KiB
_MAX_BLOCKS_PER_SM = 32
_REG_ALLOCATION_UNIT = 256  # registers are handed to a warp in units of this many
_SMEM_RESERVED_PER_BLOCK = KiB  # the driver keeps 1 KiB of shared memory per resident block


def _compiled_resources(compiled, call: str) -> tuple[int, int, int]:
    """(registers per thread, warps, shared bytes) of a Triton ``CompiledKernel``."""
    metadata = getattr(compiled, "metadata", None)
    if metadata is None or not hasattr(metadata, "num_warps"):
        raise IrisUsageError(
            f"{call}: got {type(compiled).__name__}, not a compiled Triton kernel; pass what a launch "
            f"returns, e.g. compiled = kernel[grid](...), or kernel.warmup(..., grid=(1,))")
    if not hasattr(compiled, "n_regs"):
        compiled._init_handles()  # loads the module, which fills in n_regs (lazy until the first launch)
    return max(int(compiled.n_regs), 1), int(metadata.num_warps), int(metadata.shared)


def programs_per_sm(compiled, device: torch.device) -> int:
    """How many programs of ``compiled`` (a Triton ``CompiledKernel``: what a launch or
    ``kernel.warmup`` returns) one multiprocessor of ``device`` holds at once."""
    return _programs_per_sm(compiled, device, "programs_per_sm()")


def _programs_per_sm(compiled, device: torch.device, call: str) -> int:
    regs, warps, shared = _compiled_resources(compiled, call)
    return fit_per_sm(regs, warps, shared, torch.cuda.get_device_properties(device))


def fit_per_sm(regs: int, warps: int, shared: int, props) -> int:
    """Programs of ``warps`` warps, ``regs`` registers per thread and ``shared`` bytes of shared
    memory that one multiprocessor with the limits in ``props`` (torch's device properties) holds:
    the smallest of the limits set by registers, threads, shared memory and blocks per SM."""
    regs_per_sm = getattr(props, "regs_per_multiprocessor", _DEFAULT_REGS_PER_SM)
    threads_per_sm = getattr(props, "max_threads_per_multi_processor", _DEFAULT_THREADS_PER_SM)
    smem_per_sm = getattr(props, "shared_memory_per_multiprocessor", _DEFAULT_SMEM_PER_SM)
    regs_per_warp = -(-regs * 32 // _REG_ALLOCATION_UNIT) * _REG_ALLOCATION_UNIT
    by_regs = regs_per_sm // (regs_per_warp * warps)
    by_threads = threads_per_sm // (32 * warps)
    by_smem = smem_per_sm // (shared + _SMEM_RESERVED_PER_BLOCK) if shared else _MAX_BLOCKS_PER_SM
    return min(by_regs, by_threads, by_smem, _MAX_BLOCKS_PER_SM)


def resident_grid(compiled, num_work: int, device: torch.device, ranks_on_device: int) -> int:
    """Programs per rank such that every rank's launch of ``compiled`` is resident at once.

    ``num_work`` is the most programs that have work (e.g. the tile count); the result never
    exceeds it. Raises :class:`IrisUsageError` when not even one program per rank fits.
    """
    per_sm = _programs_per_sm(compiled, device, "resident_grid()")
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    fits = per_sm * sms // ranks_on_device
    if fits < 1:
        raise IrisUsageError(
            f"resident_grid(): {ranks_on_device} ranks share {device}, which holds {per_sm * sms} programs of "
            f"this kernel at once; use fewer registers, warps or shared memory per program, or fewer ranks per GPU")
    return min(num_work, fits)
