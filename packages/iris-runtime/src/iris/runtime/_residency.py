"""Grid sizes for kernels whose programs wait for programs of other ranks.

A program that spins on a flag raised by a program of another rank only finishes if that program
runs at the same time. A GPU starts the programs of a launch as resources free up, so every
program that waits must be able to become resident while every program it waits for is resident.

One rank per GPU: the only waiting programs on the GPU are this rank's, all of one kernel, and
the GPU packs identical programs as tightly as their registers, warps and shared memory allow, so
the grid may fill every SM (``programs_per_sm`` x SMs).

Several ranks on one GPU (MPS): the programs of different processes do not pack like programs of
one launch. Measured on an H200 with 8 ranks (2026-12-01, docs/performance.md), grids of 49
programs each (392 of the 396 that the per-SM arithmetic allows) stalled after 8 to 300
back-to-back calls: some ranks' kernels did not start while the others' programs spun, though the
arithmetic said they fit. How MPS places blocks of several clients on an SM (shared-memory
carve-outs, per-client state) is not documented well enough to rely on, so the grid is sized by an
argument that needs none of it: at most ``SMs // ranks_on_device`` programs per rank. Then the
waiting programs of all the ranks on the GPU number at most one per SM, so while any of them is not
yet resident some SM holds no waiting program; the work on that SM (other kernels, which do not
wait) ends, and an empty SM takes any program that fits on an SM at all. No placement policy can
deadlock that. A cap set with ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` shrinks the SM count each
process sees, and the same argument holds inside each process's share.

Several jobs on one GPU at once (a test suite running its jobs side by side): each job counts only
its own ranks, so ``IRIS_GPU_RANKS=<n>`` tells every job how many ranks, of all the jobs, may share
the GPU at most; the rule then divides the SMs among that many (:func:`gpu_sharers`).
"""

from __future__ import annotations

import os

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


def waiting_programs_limit(per_sm: int, sms: int, ranks_on_device: int) -> int:
    """The most programs per rank that may wait for other ranks' programs (see the module doc):
    every SM full (``per_sm * sms``) for one rank per GPU, one program per SM shared out among
    the ranks (``sms // ranks_on_device``) when several ranks share it. 0: not even one fits."""
    if per_sm < 1:
        return 0
    return per_sm * sms if ranks_on_device <= 1 else sms // ranks_on_device


def gpu_sharers() -> int:
    """``IRIS_GPU_RANKS``: the most ranks, of every job on the node, that share one GPU at once
    (0 when unset: each job counts its own ranks). Raises :class:`IrisUsageError` for a value that
    is not a non-negative int."""
    text = os.environ.get("IRIS_GPU_RANKS", "").strip()
    if not text:
        return 0
    if not text.isdigit():
        raise IrisUsageError(f"IRIS_GPU_RANKS={text!r}: set the number of ranks, of all jobs, that share one GPU "
                             f"(e.g. 16), or unset it")
    return int(text)


def resident_grid(compiled, num_work: int, device: torch.device, ranks_on_device: int) -> int:
    """Programs per rank such that no rank's launch of ``compiled`` can wait forever for SMs that
    the other ranks' waiting programs hold (see the module doc).

    ``num_work`` is the most programs that have work (e.g. the tile count); the result never
    exceeds it. Raises :class:`IrisUsageError` when not even one program per rank fits.
    """
    per_sm = _programs_per_sm(compiled, device, "resident_grid()")
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    fits = waiting_programs_limit(per_sm, sms, ranks_on_device)
    if fits < 1:
        raise IrisUsageError(
            f"resident_grid(): {ranks_on_device} ranks share {device} ({sms} SMs, {per_sm} programs of this kernel "
            f"per SM), which leaves no program per rank; use fewer registers, warps or shared memory per program, "
            f"or fewer ranks per GPU (at most one per SM)")
    return min(num_work, fits)
