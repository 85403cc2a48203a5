"""``IrisProcessGroup``: torch.distributed's process group interface, each call one call of
:mod:`iris.collectives.ccl` (no second implementation of a collective).

torch calls these methods with its own argument forms: lists of one tensor (``allreduce([t],
opts)``), lists of lists for the list collectives (``allgather([[out_0 .. out_W-1]], [inp])``),
options objects (``opts.reduceOp``, ``opts.rootRank``). Each method turns them into the ccl call
on the group's Iris context and returns an :class:`IrisWork`. Tensors are reshaped, never
copied, where ccl takes them as they are (one contiguous tensor in, one out); the list forms go
through one flat buffer. A CPU tensor goes to gloo where the group was configured so
(``"cuda:iris,cpu:gloo"``) and the context is on the GPU; what ccl cannot do raises an
:class:`iris.runtime.IrisUnsupportedError` naming the call and what to do instead.
"""

from __future__ import annotations

import inspect
import math
import sys

import torch
import torch.distributed as dist

from iris.runtime import IrisUnsupportedError, IrisUsageError, UnsupportedDtypeError

from .. import ccl
from ..ccl._checks import DTYPES as ccl_dtypes
from . import _context
from ._convert import OP_NAMES, check_reducible, flat, op_name, padded, unpad, words
from ._work import IrisWork, completed, stream_key

#: The name the backend is registered under.
BACKEND = "iris"
_ALL_REDUCE = "torch.distributed.all_reduce(backend='iris')"
#: ccl's name of each reduction, by the value of torch's ``ReduceOp.RedOpType``.
_OP_NAMES = {int(op.value): name for op, name in OP_NAMES.items()}
_SUM = dist.ReduceOp.SUM
#: The gloo backend's method for each of this class's methods that may hand CPU tensors to it.
_GLOO_NAMES = {"all_gather_single": "_allgather_base", "reduce_scatter_single": "_reduce_scatter_base",
               "all_to_all_single": "alltoall_base"}


class IrisProcessGroup(dist.ProcessGroup):
    """A process group of the ``iris`` backend: ranks ``rank`` of ``size``, its Iris context made
    or adopted on the first call (:mod:`._context`). ``store`` and ``timeout`` are the group's,
    for the gloo group that CPU tensors go to when the backend string says ``cpu:gloo`` (and, with
    ``members``, the default group's ranks of a group of some of them, for the members' own
    context)."""

    def __init__(self, rank: int, size: int, options=None, store=None, timeout=None, members: tuple | None = None):
        super().__init__(rank, size)
        self._options, self._store, self._timeout = options, store, timeout
        self._members = members  # the default group's ranks of a group of some of them (else None)
        self._ctx = None  # the Iris context, from the first call on
        self._owns_ctx = False
        self._gloo = None  # gloo for CPU tensors (cpu:gloo, context on the GPU)
        # where each kind of tensor goes, decided on the first call: True for iris
        self._cuda_to_iris = self._cpu_to_iris = False
        self._stream_of = None  # the current stream's key (on the GPU), for works
        self._fast = self._fast_path = None
        self._pending = []  # point-to-point operations kept on the cpu backend (_defer)

    # --- names ---------------------------------------------------------------------------------------
    def getBackendName(self) -> str:
        return BACKEND

    # torch names each group (_set_group_name) and reads the name back (.group_name) when the program
    # destroys one group, which torch's C++ side answers from the group's registered backends; a
    # process group written in Python registers none ("ProcessGroup name not set"): kept here too.
    _name = None

    def _set_group_name(self, name: str) -> None:
        super()._set_group_name(name)
        self._name = name

    @property
    def group_name(self) -> str:
        return self._name

    def __repr__(self) -> str:
        where = "no context yet" if self._ctx is None else repr(self._ctx)
        return f"IrisProcessGroup(rank={self.rank()}, size={self.size()}, {where})"

    # --- the context, and where tensors go --------------------------------------------------------------
    def context(self, call: str = "iris backend"):
        """The group's Iris context, made or adopted now if this is the group's first call
        (collective then)."""
        if self._ctx is None:
            self._setup(call)
        return self._ctx

    def _setup(self, call: str) -> None:
        ctx, made = _context.make_context(self._options, self.rank(), self.size(), call, self._members,
                                          None if self._store is None else dist.PrefixStore("iris-ctx/", self._store),
                                          self._timeout)
        on_gpu = ctx.device.type == "cuda"
        try:
            config = str(dist.get_backend_config(self))
        except Exception:  # a group torch does not list (made by hand): no device map
            config = ""
        devices = dict(pair.split(":", 1) for pair in config.split(",") if ":" in pair)
        cpu_gloo = devices.get("cpu") == "gloo"
        if cpu_gloo:
            if self._store is None:
                raise IrisUsageError(f"{call}: this group has no store to make the gloo group for CPU tensors from")
            # made by every rank at its first call on the group (the same call on every rank)
            self._gloo = dist.ProcessGroupGloo(dist.PrefixStore("iris-cpu/", self._store), self.rank(),
                                               self.size(), self._timeout)
        self._cuda_to_iris, self._cpu_to_iris = on_gpu, not on_gpu and not cpu_gloo
        index = ctx.device.index or 0
        self._stream_of = (lambda: stream_key(index)) if on_gpu else None
        self._ctx, self._owns_ctx = ctx, made
        # what all_reduce's common case reads, in one attribute of this (pybind) object
        self._fast = self._fast_path = (ctx, self._cuda_to_iris, self._cpu_to_iris, self._stream_of)

    def _ctx_for(self, t: torch.Tensor, call: str, p2p: bool = False):
        """The Iris context when ``t`` goes to iris, None when it goes to gloo; else raises. Runs
        the kept point-to-point operations first, unless the call is one of them (``p2p``)."""
        if self._pending and not p2p:
            self._run_pending()
        ctx = self._ctx if self._ctx is not None else self.context(call)
        if self._cuda_to_iris if t.is_cuda else self._cpu_to_iris:
            return ctx
        if self._gloo is not None and t.device.type == "cpu":
            return None
        fix = ("pass backend='cuda:iris,cpu:gloo' to init_process_group to send CPU tensors to gloo, or move the "
               f"tensor to {ctx.device}" if ctx.device.type == "cuda" else f"move the tensor to {ctx.device}")
        raise IrisUsageError(f"{call}: a tensor on {t.device}, but the iris backend's context runs on {ctx.device}; "
                             f"{fix}")

    def _to_gloo(self, name: str, *args):
        return getattr(self._gloo, _GLOO_NAMES.get(name, name))(*args)

    def _each_on_gloo(self, name: str, outputs, inputs, opts) -> IrisWork:
        # the coalesced forms: one gloo call per pair (gloo has no coalesced form of these)
        for output, input in zip(outputs, inputs):
            getattr(self._gloo, name)(output, input, opts).wait()
        return completed(list(outputs))

    def _work(self, ctx, tensors: list, blocking: bool = False) -> IrisWork:
        stream_of = self._stream_of
        return IrisWork(tensors, stream_of and stream_of(), blocking)

    @staticmethod
    def _one(tensors, call: str) -> torch.Tensor:
        if len(tensors) != 1:
            raise IrisUsageError(f"{call}: the iris backend takes one tensor per rank, got a list of {len(tensors)} "
                                 f"(one process per device)")
        return tensors[0]

    # --- all_reduce ------------------------------------------------------------------------------------
    def allreduce(self, tensors, opts):
        """``dist.all_reduce``: ``ccl.all_reduce`` in place. The path of every DDP bucket and most
        calls, so its common case (one tensor that goes to iris, a known op) reads the group's
        state in one attribute and as few of torch's properties as it can (``opts.reduceOp``
        alone costs about a microsecond)."""
        fast = self._fast
        if fast is None or len(tensors) != 1:
            return self._allreduce_elsewhere(tensors, opts)
        ctx, cuda_to_iris, cpu_to_iris, stream_of = fast
        t = tensors[0]
        if not (cuda_to_iris if t.is_cuda else cpu_to_iris):
            return self._allreduce_elsewhere(tensors, opts)
        reduce_op = opts.reduceOp
        # SUM (every DDP bucket) by one comparison; the others through the table
        op = "sum" if reduce_op == _SUM else _OP_NAMES.get(reduce_op.op.value)
        if op is None:
            op_name(_ALL_REDUCE, opts.reduceOp)  # raises, naming the op
        if t.numel():
            ccl.all_reduce(ctx, t, t, op)
        return IrisWork(tensors, stream_of and stream_of())

    def _allreduce_elsewhere(self, tensors, opts):
        # the first call (the context is made now), a CPU tensor for gloo, or an error
        t = self._one(tensors, _ALL_REDUCE)
        ctx = self._ctx_for(t, _ALL_REDUCE)
        if ctx is None:
            return self._to_gloo("allreduce", tensors, opts)
        return self.allreduce(tensors, opts)

    def allreduce_coalesced(self, tensors, opts):
        """``dist.all_reduce_coalesced``: one ``ccl.all_reduce`` per tensor."""
        call = "torch.distributed.all_reduce_coalesced(backend='iris')"
        if not tensors:
            return completed([])
        ctx = self._ctx_for(tensors[0], call)
        if ctx is None:
            return self._to_gloo("allreduce_coalesced", tensors, opts)
        op = op_name(call, opts.reduceOp)
        for t in tensors:
            if self._ctx_for(t, call) is not ctx:
                raise IrisUsageError(f"{call}: the tensors are on different devices; pass tensors of one device")
            if t.numel():
                check_reducible(call, t)
                ccl.all_reduce(ctx, t, t, op=op)
        return self._work(ctx, tensors)

    # --- all_gather ------------------------------------------------------------------------------------
    def all_gather_single(self, output, input, opts):
        """``dist.all_gather_into_tensor``: ``ccl.all_gather`` of the flattened tensors (``output``
        is every rank's ``input`` concatenated or stacked along dim 0)."""
        call = "torch.distributed.all_gather_into_tensor(backend='iris')"
        ctx = self._ctx_for(input, call)
        if ctx is None:
            return self._to_gloo("all_gather_single", output, input, opts)
        self._gather(ctx, call, output, input)
        return self._work(ctx, [output])

    _allgather_base = all_gather_single  # the name older torch calls

    def _gather(self, ctx, call: str, output: torch.Tensor, input: torch.Tensor) -> None:
        W = self.size()
        if output.numel() != W * input.numel():
            raise IrisUsageError(f"{call}: output has {output.numel()} elements and input {input.numel()}; with {W} "
                                 f"ranks the output holds {W} x the input's: every rank's input concatenated or "
                                 f"stacked along dim 0 (shape ({W}, *input.shape))")
        if output.dtype != input.dtype:
            raise IrisUsageError(f"{call}: output is {output.dtype} but input {input.dtype}; pass one dtype")
        if not input.numel():
            return
        self._contiguous(call, output=output, input=input)
        src, dst = words(input), words(output)
        if src is not None and dst is not None:
            ccl.all_gather(ctx, dst, src)
            return
        # bytes that are not whole words (all_gather_object's): through padded buffers
        src = padded(input)
        dst = torch.empty(W * src.numel(), dtype=torch.int32, device=input.device)
        ccl.all_gather(ctx, dst, src)
        nbytes = input.numel() * input.element_size()
        out_bytes = flat(output).view(torch.uint8).view(W, nbytes)
        out_bytes.copy_(dst.view(torch.uint8).view(W, -1)[:, :nbytes])

    def allgather(self, output_tensors, input_tensors, opts):
        """``dist.all_gather``: ``ccl.all_gather`` into one flat buffer, then into the list."""
        call = "torch.distributed.all_gather(backend='iris')"
        input = self._one(input_tensors, call)
        outputs = self._one(output_tensors, call)
        ctx = self._ctx_for(input, call)
        if ctx is None:
            return self._to_gloo("allgather", output_tensors, input_tensors, opts)
        if len(outputs) != self.size() or any(o.numel() != input.numel() or o.dtype != input.dtype for o in outputs):
            shapes = [tuple(o.shape) for o in outputs]
            raise IrisUsageError(f"{call}: the output list has tensors of shapes {shapes}; pass {self.size()} tensors "
                                 f"of the input's size ({input.numel()} elements) and dtype ({input.dtype})")
        if input.numel():
            gathered = torch.empty((self.size(), *input.shape), dtype=input.dtype, device=input.device)
            self._gather(ctx, call, gathered, input.contiguous())
            for out, part in zip(outputs, gathered):
                out.copy_(part.view(out.shape))
        return self._work(ctx, list(outputs))

    def allgather_into_tensor_coalesced(self, outputs, inputs, opts):
        """``all_gather_into_tensor`` of each pair, one ``ccl.all_gather`` each."""
        call = "torch.distributed.all_gather_into_tensor_coalesced(backend='iris')"
        if not inputs:
            return completed([])
        ctx = self._ctx_for(inputs[0], call)
        if ctx is None:
            return self._each_on_gloo("_allgather_base", outputs, inputs, opts)
        for output, input in zip(outputs, inputs):
            self._gather(ctx, call, output, input)
        return self._work(ctx, list(outputs))

    all_gather_single_coalesced = allgather_into_tensor_coalesced

    # --- reduce_scatter --------------------------------------------------------------------------------
    def reduce_scatter_single(self, output, input, opts):
        """``dist.reduce_scatter_tensor``: ``ccl.reduce_scatter`` of the flattened tensors (``input``
        is ``W`` chunks of ``output``'s size, concatenated or stacked along dim 0)."""
        call = "torch.distributed.reduce_scatter_tensor(backend='iris')"
        ctx = self._ctx_for(input, call)
        if ctx is None:
            return self._to_gloo("reduce_scatter_single", output, input, opts)
        self._scatter(ctx, call, output, input, op_name(call, opts.reduceOp))
        return self._work(ctx, [output])

    _reduce_scatter_base = reduce_scatter_single  # the name older torch calls

    def _scatter(self, ctx, call: str, output, input, op: str) -> None:
        W = self.size()
        if input.numel() != W * output.numel():
            raise IrisUsageError(f"{call}: input has {input.numel()} elements and output {output.numel()}; with {W} "
                                 f"ranks the input holds {W} x the output's")
        if output.dtype != input.dtype:
            raise IrisUsageError(f"{call}: output is {output.dtype} but input {input.dtype}; pass one dtype")
        if output.numel():
            check_reducible(call, input)
            self._contiguous(call, output=output, input=input)
            ccl.reduce_scatter(ctx, flat(output), flat(input), op=op)

    def reduce_scatter(self, output_tensors, input_tensors, opts):
        """``dist.reduce_scatter``: the list concatenated into one buffer, ``ccl.reduce_scatter``."""
        call = "torch.distributed.reduce_scatter(backend='iris')"
        output = self._one(output_tensors, call)
        inputs = self._one(input_tensors, call)
        ctx = self._ctx_for(output, call)
        if ctx is None:
            return self._to_gloo("reduce_scatter", output_tensors, input_tensors, opts)
        if len(inputs) != self.size() or any(i.numel() != output.numel() for i in inputs):
            shapes = [tuple(i.shape) for i in inputs]
            raise IrisUsageError(f"{call}: the input list has tensors of shapes {shapes}; pass {self.size()} tensors "
                                 f"of the output's size ({output.numel()} elements)")
        op = op_name(call, opts.reduceOp)
        if output.numel():
            whole = torch.cat([flat(i.contiguous()) for i in inputs])
            result = output if output.is_contiguous() else output.contiguous()
            self._scatter(ctx, call, result, whole, op)
            if result is not output:
                output.copy_(result)
        return self._work(ctx, [output])

    def reduce_scatter_tensor_coalesced(self, outputs, inputs, opts):
        """``reduce_scatter_tensor`` of each pair, one ``ccl.reduce_scatter`` each."""
        call = "torch.distributed.reduce_scatter_tensor_coalesced(backend='iris')"
        if not inputs:
            return completed([])
        ctx = self._ctx_for(inputs[0], call)
        if ctx is None:
            return self._each_on_gloo("_reduce_scatter_base", outputs, inputs, opts)
        op = op_name(call, opts.reduceOp)
        for output, input in zip(outputs, inputs):
            self._scatter(ctx, call, output, input, op)
        return self._work(ctx, list(outputs))

    reduce_scatter_single_coalesced = reduce_scatter_tensor_coalesced

    # --- all_to_all ------------------------------------------------------------------------------------
    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes, opts):
        """``dist.all_to_all_single``: with equal splits ``ccl.all_to_all`` of the flattened tensors;
        with split sizes that differ (on any rank) ``ccl.all_to_all_v`` of the rows."""
        call = "torch.distributed.all_to_all_single(backend='iris')"
        ctx = self._ctx_for(input, call)
        if ctx is None:
            return self._to_gloo("all_to_all_single", output, input, output_split_sizes, input_split_sizes, opts)
        W = self.size()
        rows = input.shape[0] if input.dim() else 0
        uneven = False
        for splits, t in ((input_split_sizes, input), (output_split_sizes, output)):
            equal = t.dim() and t.shape[0] % W == 0 and all(s == t.shape[0] // W for s in splits)
            uneven = uneven or not equal
        if input_split_sizes or output_split_sizes:
            # Split sizes differ between ranks when they are uneven, and a rank whose own look equal
            # must take the same path as one whose do not: every rank learns whether any is uneven,
            # and the most rows any rank sends (all_to_all_v's input capacity, the same everywhere).
            # A rank whose arguments cannot go that way says so in the same exchange, so that every
            # rank raises rather than wait for it.
            problem = self._v_problem(call, output, input, output_split_sizes, input_split_sizes)
            seen = ctx.allgather((uneven, rows, problem), call)
            if any(u for u, _, _ in seen):
                bad = [(q, found) for q, (_, _, found) in enumerate(seen) if found is not None]
                if bad:
                    q, (kind, text) = bad[0]
                    raise (UnsupportedDtypeError if kind == "dtype" else IrisUsageError)(
                        f"{call}: {'this rank' if q == ctx.rank else f'rank {q}'}: {text}")
                self._all_to_all_v(ctx, output, input, input_split_sizes, max(n for _, n, _ in seen))
                return self._work(ctx, [output])
        elif uneven:
            raise IrisUsageError(f"{call}: input has {rows} rows, not a multiple of the {W} ranks; pass split sizes "
                                 f"or rows a multiple of {W}")
        if output.shape != input.shape or output.dtype != input.dtype:
            raise IrisUsageError(f"{call}: output is {tuple(output.shape)} {output.dtype} but input "
                                 f"{tuple(input.shape)} {input.dtype}; with equal splits pass an output of the "
                                 f"input's shape and dtype")
        if rows and input.numel():
            self._contiguous(call, output=output, input=input)
            src, dst = words(input), words(output)
            if src is not None and dst is not None and src.numel() % W == 0:  # whole words per peer
                ccl.all_to_all(ctx, dst, src)
            else:
                chunk = input.numel() * input.element_size() // W  # bytes each rank sends each peer
                per = -(-chunk // 4)
                src = torch.zeros(W, per, dtype=torch.int32, device=input.device)
                src.view(torch.uint8)[:, :chunk].copy_(flat(input).view(torch.uint8).view(W, chunk))
                dst = torch.empty_like(src)
                ccl.all_to_all(ctx, flat(dst), flat(src))
                flat(output).view(torch.uint8).view(W, chunk).copy_(dst.view(torch.uint8)[:, :chunk])
        return self._work(ctx, [output])

    alltoall_base = all_to_all_single  # the name older torch calls

    def _v_problem(self, call: str, output, input, output_split_sizes, input_split_sizes) -> tuple | None:
        # What stops this rank's arguments from going through all_to_all_v: ("usage" or "dtype", the
        # words); None if nothing.
        W = self.size()
        if input.dim() == 0 or output.dim() == 0 or input.shape[1:] != output.shape[1:] or input.dtype != output.dtype:
            return "usage", (f"output is {tuple(output.shape)} {output.dtype} and input {tuple(input.shape)} "
                             f"{input.dtype}; pass one dtype and rows (dim 0) of one shape")
        rows, received = input.shape[0], output.shape[0]
        sends = list(input_split_sizes) or ([rows // W] * W if rows % W == 0 else [])
        if len(sends) != W or sum(sends) != rows or min(sends) < 0:
            return "usage", (f"input_split_sizes={list(input_split_sizes)} for an input of {rows} rows; pass {W} "
                             f"counts that add up to {rows}")
        if output_split_sizes and (len(output_split_sizes) != W or sum(output_split_sizes) != received):
            return "usage", (f"output_split_sizes={list(output_split_sizes)} for an output of {received} rows; "
                             f"pass {W} counts that add up to {received}")
        if not (input.is_contiguous() and output.is_contiguous()):
            return "usage", "input and output must be contiguous (torch.distributed's collectives take contiguous ones)"
        row_bytes = math.prod(input.shape[1:]) * input.element_size()
        if input.dtype not in ccl_dtypes and row_bytes % 4:
            return "dtype", (f"rows of {row_bytes} bytes of {input.dtype} with uneven splits: pass a dtype of "
                             f"{', '.join(str(d).removeprefix('torch.') for d in ccl_dtypes)}, or rows of a multiple "
                             f"of 4 bytes")
        return None

    def _all_to_all_v(self, ctx, output, input, input_split_sizes, capacity: int) -> None:
        # Rows of input (dim 0) to each rank by input_split_sizes (checked: _v_problem), received in
        # rank order into output's rows; the input staged into `capacity` rows where it has fewer
        # (all_to_all_v's input is a capacity, the same on every rank). Rows of a dtype ccl does
        # not move go as int32 words.
        W = self.size()
        rows, received = input.shape[0], output.shape[0]
        sends = list(input_split_sizes) or [rows // W] * W
        src, dst = input, output
        if input.dtype not in ccl_dtypes:
            row = math.prod(input.shape[1:])
            src, dst = input.view(rows, row).view(torch.int32), output.view(received, row).view(torch.int32)
        if rows < capacity:
            staged = torch.empty((capacity, *src.shape[1:]), dtype=src.dtype, device=src.device)
            staged[:rows].copy_(src)
            src = staged
        counts = torch.tensor(sends, dtype=torch.int64).to(input.device, non_blocking=True)
        got = torch.empty(W, dtype=torch.int64, device=input.device)
        ccl.all_to_all_v(ctx, dst, src, counts, got)

    def alltoall(self, output_tensors, input_tensors, opts):
        """``dist.all_to_all`` of equal tensors: concatenated, ``ccl.all_to_all``, split."""
        call = "torch.distributed.all_to_all(backend='iris')"
        ctx = self._ctx_for(input_tensors[0], call)
        if ctx is None:
            return self._to_gloo("alltoall", output_tensors, input_tensors, opts)
        W = self.size()
        n = input_tensors[0].numel()
        sizes = [t.numel() for t in (*input_tensors, *output_tensors)]
        mine = len(input_tensors) != W or len(output_tensors) != W or any(s != n for s in sizes)
        # sizes of a list all-to-all may differ between ranks: every rank learns whether any is uneven
        if any(ctx.allgather(mine, call)):
            raise IrisUnsupportedError(
                f"{call}: tensors of {sizes[:len(input_tensors)]} elements in and {sizes[len(input_tensors):]} out; "
                f"the iris backend exchanges {W} tensors of one size each way (variable sizes need all_to_all_v, "
                f"which the backend does not route to iris.collectives.ccl.all_to_all_v yet; run this call on a gloo "
                f"or nccl group)")
        if n:
            whole = torch.stack([i.contiguous().view(-1) for i in input_tensors])
            received = torch.empty_like(whole)
            self.all_to_all_single(received.view(-1), whole.view(-1), [], [], opts)
            for out, part in zip(output_tensors, received):
                out.copy_(part.view(out.shape))
        return self._work(ctx, list(output_tensors))

    # --- broadcast and barrier ------------------------------------------------------------------------
    def broadcast(self, tensors, opts):
        """``dist.broadcast``: ``ccl.broadcast`` in place from ``opts.rootRank``."""
        call = "torch.distributed.broadcast(backend='iris')"
        t = self._one(tensors, call)
        ctx = self._ctx_for(t, call)
        if ctx is None:
            return self._to_gloo("broadcast", tensors, opts)
        if t.numel():
            self._contiguous(call, tensor=t)
            moved = words(t)
            if moved is not None:
                ccl.broadcast(ctx, moved, opts.rootRank)
            else:
                buffer = padded(t)
                ccl.broadcast(ctx, buffer, opts.rootRank)
                unpad(buffer, t)
        return self._work(ctx, tensors)

    def barrier(self, opts=None):
        """``dist.barrier``: ``ccl.barrier`` on the stream; the work's ``wait()`` (which torch calls
        unless ``async_op=True``) also waits on the host, as torch's barrier promises."""
        if self._pending:
            self._run_pending()
        ctx = self.context("torch.distributed.barrier(backend='iris')")
        ccl.barrier(ctx)
        return self._work(ctx, [], blocking=True)

    # --- to and from one rank ----------------------------------------------------------------------------
    def reduce(self, tensors, opts):
        """``dist.reduce``: ``ccl.reduce`` in place on ``opts.rootRank`` (the other ranks' tensors
        are left as they were, as torch's backends leave them)."""
        call = "torch.distributed.reduce(backend='iris')"
        t = self._one(tensors, call)
        ctx = self._ctx_for(t, call)
        if ctx is None:
            return self._to_gloo("reduce", tensors, opts)
        op = op_name(call, opts.reduceOp)
        if t.numel():
            check_reducible(call, t)
            self._contiguous(call, tensor=t)
            ccl.reduce(ctx, flat(t) if ctx.rank == opts.rootRank else None, flat(t), opts.rootRank, op=op)
        return self._work(ctx, tensors)

    def gather(self, output_tensors, input_tensors, opts):
        """``dist.gather``: ``ccl.gather`` into one buffer on ``opts.rootRank``, then into its list."""
        call = "torch.distributed.gather(backend='iris')"
        input = self._one(input_tensors, call)
        ctx = self._ctx_for(input, call)
        if ctx is None:
            return self._to_gloo("gather", output_tensors, input_tensors, opts)
        root, W = opts.rootRank, self.size()
        outputs = self._one(output_tensors, call) if ctx.rank == root else []
        if ctx.rank == root and (len(outputs) != W or any(o.numel() != input.numel() or o.dtype != input.dtype
                                                           for o in outputs)):
            shapes = [tuple(o.shape) for o in outputs]
            raise IrisUsageError(f"{call}: the gather list has tensors of shapes {shapes}; pass {W} tensors of the "
                                 f"input's size ({input.numel()} elements) and dtype ({input.dtype}) on the root")
        if input.numel():
            self._contiguous(call, input=input)
            src = words(input)
            if src is None:  # bytes that are not whole words: through a padded buffer
                src = padded(input)
            gathered = torch.empty(W * src.numel(), dtype=src.dtype, device=input.device) if ctx.rank == root else None
            ccl.gather(ctx, gathered, src, root)
            if ctx.rank == root:
                nbytes = input.numel() * input.element_size()
                parts = gathered.view(torch.uint8).view(W, -1)[:, :nbytes]
                for out, part in zip(outputs, parts):
                    out.copy_(part.view(input.dtype).view(out.shape))
        return self._work(ctx, list(outputs))

    def scatter(self, output_tensors, input_tensors, opts):
        """``dist.scatter``: the root's list into one buffer, then ``ccl.scatter`` from
        ``opts.rootRank``."""
        call = "torch.distributed.scatter(backend='iris')"
        output = self._one(output_tensors, call)
        ctx = self._ctx_for(output, call)
        if ctx is None:
            return self._to_gloo("scatter", output_tensors, input_tensors, opts)
        root, W = opts.rootRank, self.size()
        inputs = self._one(input_tensors, call) if ctx.rank == root else []
        if ctx.rank == root and (len(inputs) != W or any(i.numel() != output.numel() or i.dtype != output.dtype
                                                          for i in inputs)):
            shapes = [tuple(i.shape) for i in inputs]
            raise IrisUsageError(f"{call}: the scatter list has tensors of shapes {shapes}; pass {W} tensors of the "
                                 f"output's size ({output.numel()} elements) and dtype ({output.dtype}) on the root")
        if output.numel():
            self._contiguous(call, output=output)
            dst = words(output)
            staged = dst is None  # bytes that are not whole words: through a padded buffer
            if staged:
                dst = padded(output)
            whole = None
            if ctx.rank == root:
                nbytes = output.numel() * output.element_size()
                whole = torch.zeros(W, dst.numel() * dst.element_size(), dtype=torch.uint8, device=output.device)
                for part, i in zip(whole, inputs):
                    part[:nbytes].copy_(i.contiguous().view(-1).view(torch.uint8))
                whole = whole.view(-1).view(dst.dtype)
            ccl.scatter(ctx, dst, whole, root)
            if staged:
                unpad(dst, output)
        return self._work(ctx, [output])

    # --- point to point ----------------------------------------------------------------------------------
    def _p2p(self, name: str, tensors, peer: int, tag: int):
        call = f"torch.distributed.{name}(backend='iris')"
        t = self._one(tensors, call)
        ctx = self._ctx_for(t, call, p2p=True)
        if ctx is None:
            return None, None, call
        settings = ccl.p2p_settings(ctx)
        if settings is None:
            raise IrisUnsupportedError(
                f"{call}: the group's context has no point-to-point mailboxes; call "
                f"iris.collectives.ccl.init_p2p(iris.collectives.distributed.context_of(group)) on every rank of the "
                f"group first (collective: once, before the first send or recv), or send over a gloo group "
                f"(dist.new_group(backend='gloo'))")
        if not isinstance(tag, int) or not 0 <= tag < settings.tags:
            raise IrisUsageError(f"{call}: tag={tag!r}, but the group's mailboxes have tags 0 .. {settings.tags - 1}; "
                                 f"pass a tag in that range or call ccl.init_p2p(context, tags={max(tag, 0) + 1}) "
                                 f"on every rank")
        self._contiguous(call, tensor=t)
        return ctx, t, call

    def send(self, tensors, dst, tag=0):
        """``dist.send`` / ``dist.isend``: ``ccl.isend`` to ``dst`` (a group rank); needs the
        context's mailboxes (``ccl.init_p2p`` on ``context_of(group)``, every rank, once). Inside
        torch's ``batch_isend_irecv`` on the cpu backend: kept (:meth:`_defer`)."""
        ctx, t, _ = self._p2p("send", tensors, dst, tag)
        if ctx is None:
            return self._to_gloo("send", tensors, dst, tag)
        return self._start(ctx, ccl.isend, tensors, t, dst, tag)

    def recv(self, tensors, src, tag=0):
        """``dist.recv`` / ``dist.irecv``: ``ccl.irecv`` from ``src`` (a group rank) into the
        tensor. Inside torch's ``batch_isend_irecv`` on the cpu backend: kept (:meth:`_defer`)."""
        ctx, t, _ = self._p2p("recv", tensors, src, tag)
        if ctx is None:
            return self._to_gloo("recv", tensors, src, tag)
        return self._start(ctx, ccl.irecv, tensors, t, src, tag)

    # On the cpu backend a ccl send or receive runs when it is made (Triton's interpreter runs a
    # launch on the host), so a message larger than an inbox waits there for its peer's matching
    # call. torch's batch_isend_irecv issues a Python backend's operations one by one, and in a
    # ring every rank sends first: each send would wait for a receive its peer has not made yet.
    # So the operations that torch's batch_isend_irecv issues are kept until one of their works
    # is waited for or tested, or the group's next other call, and then run together through
    # ccl.batch_isend_irecv, which moves every message an inbox at a time by turns. Operations
    # outside a batch still run when made: a batch by turns would wait in its receive for a peer
    # that receives first, while a send made alone is taken by that receive. While some are
    # kept, all_reduce's fast path is off, so that every other call goes through _ctx_for, which
    # runs them first. On the GPU a send and a receive are enqueued on their streams when made
    # and nothing waits on the host.
    def _start(self, ctx, op, tensors, t: torch.Tensor, peer: int, tag: int) -> IrisWork:
        if ctx.device.type != "cuda":
            if _in_torch_batch():
                return self._defer(op, tensors, t, peer, tag)
            self._run_pending()  # kept operations first: a peer and tag's messages stay in order
        return IrisWork(tensors, inner=op(ctx, t, peer, tag))

    def _defer(self, op, tensors, t: torch.Tensor, peer: int, tag: int) -> IrisWork:
        if not self._pending:
            self._fast = None
        self._pending.append(ccl.P2POp(op, t, peer, tag))
        return IrisWork(tensors, inner=_Deferred(self))

    def _run_pending(self) -> None:
        ops, self._pending = self._pending, []
        if ops:
            self._fast = self._fast_path
            ccl.batch_isend_irecv(self._ctx, ops)

    def recv_anysource(self, tensors, tag=0):
        call = "torch.distributed.recv(src=None, backend='iris')"
        t = self._one(tensors, call)
        if self._ctx_for(t, call) is None:
            return self._to_gloo("recv_anysource", tensors, tag)
        raise IrisUnsupportedError(f"{call}: a receive from any source is not supported (a mailbox belongs to one "
                                   f"sender); pass src=, or receive over a gloo group")

    # --- checks and lifetime ---------------------------------------------------------------------------
    @staticmethod
    def _contiguous(call: str, **tensors) -> None:
        for name, t in tensors.items():
            if not t.is_contiguous():
                raise IrisUsageError(f"{call}: {name} (shape {tuple(t.shape)}, strides {t.stride()}) is not "
                                     f"contiguous; torch.distributed's collectives take contiguous tensors: pass "
                                     f"{name}.contiguous() (and copy the result back where it is the output)")

    def shutdown(self) -> None:
        """At ``dist.destroy_process_group()``: the context the backend made for this group is
        closed (collective: every rank destroys its groups together), and a later group makes a
        new one; a context the program passed stays open."""
        if self._pending:  # operations nobody waited for still run: no message is lost
            self._run_pending()
        ctx, self._ctx, self._fast, self._fast_path = self._ctx, None, None, None
        if ctx is not None and self._owns_ctx:
            _context.forget(ctx)
            ctx.close()

    def abort(self) -> None:
        self.shutdown()


#: The code of torch's batch_isend_irecv (under its logging wrapper), to recognise its calls.
_BATCH_CODE = getattr(inspect.unwrap(getattr(dist.distributed_c10d, "batch_isend_irecv", lambda: None)), "__code__",
                      None)


def _in_torch_batch() -> bool:
    """Whether torch's ``batch_isend_irecv`` is among the few callers above this call (the
    backend's ``send``/``recv``, called by ``dist.isend``/``dist.irecv`` and their wrappers)."""
    frame = sys._getframe(2)
    for _ in range(8):
        if frame is None:
            return False
        if frame.f_code is _BATCH_CODE:
            return True
        frame = frame.f_back
    return False


class _Deferred:
    """What the work of a kept point-to-point operation (cpu backend) waits on: waiting for it or
    testing it runs the group's kept operations (all done when it returns)."""

    __slots__ = ("_group",)

    def __init__(self, group: IrisProcessGroup):
        self._group = group

    def wait(self) -> bool:
        self._group._run_pending()
        return True

    def is_completed(self) -> bool:
        self._group._run_pending()
        return True
