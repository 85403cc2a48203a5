"""Pipeline parallelism from the host: a GPipe schedule of a small MLP over the ranks, one stage each.

The MLP has ``--layers-per-stage`` x W layers (``tanh(x @ W + b)``); rank ``s`` holds the layers of
stage ``s``. A batch is cut into ``--microbatches`` microbatches and every step runs GPipe's
schedule: all forwards, stage after stage, then all backwards in reverse order:

- forward: stage 0 takes microbatch ``i`` from the data, every other stage receives its input from
  the stage before (``ccl.recv``, tag 0), runs its layers, and sends the output on (``ccl.send``);
  the last stage computes the microbatch's share of the loss (mean squared error);
- backward: the last stage differentiates the loss, every stage receives the gradient of its
  output from the stage after (``ccl.irecv`` and ``wait()``, tag 1), backpropagates through its
  layers (autograd, on the graph its forward kept) and sends the gradient of its input back
  (``ccl.isend``); the parameters' gradients add up over the microbatches;
- an SGD step on each stage's own parameters.

Messages are enqueued on the stream and move through the receivers' mailboxes
(``ccl.init_p2p``), with no host round trip. After the steps the losses are reduced to rank 0
(``ccl.reduce``) and every stage's parameters are checked against the same model trained in one
process (each rank builds the whole model from the seed), so the example exits non-zero when the
pipeline computed anything else.

    mpirun -n 4 python examples/06_pipeline.py [--microbatches 4] [--batch 32] [--width 64] [--steps 2]
"""

import argparse
import sys

import torch

import iris.runtime
from iris.collectives import ccl

ACTIVATIONS, GRADIENTS = 0, 1  # the tags of the forward's and the backward's messages


def whole_model(layers: int, width: int, seed: int):
    """Every layer's ``(weight, bias)``, fp32 on the host: the same on every rank."""
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(width, width, generator=g) / width ** 0.5, torch.randn(width, generator=g) * 0.1)
            for _ in range(layers)]


def forward(params, x):
    """The layers of ``params`` (``[(weight, bias), ...]``) applied to ``x``."""
    for weight, bias in params:
        x = torch.tanh(x @ weight + bias)
    return x


def data(batch: int, width: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, width, generator=g), torch.randn(batch, width, generator=g)


def pipeline_step(ctx, params, x, y, microbatches: int, lr: float) -> torch.Tensor:
    """One GPipe step of this rank's stage; returns this stage's part of the loss (the last stage's
    loss, 0 elsewhere)."""
    W, s, dev = ctx.world_size, ctx.rank, ctx.device
    first, last = s == 0, s == W - 1
    rows, width = x.shape[0] // microbatches, x.shape[1]
    inputs, outputs = [], []
    loss = torch.zeros((), device=dev)
    for i in range(microbatches):
        if first:
            inp = x[i * rows:(i + 1) * rows].to(dev)
        else:
            inp = ccl.recv(ctx, torch.empty(rows, width, device=dev), s - 1, tag=ACTIVATIONS)
        inp.requires_grad_(not first)
        out = forward(params, inp)
        if last:
            # the microbatch's share of the mean over the whole batch
            out = ((out - y[i * rows:(i + 1) * rows].to(dev)) ** 2).sum() / y.numel()
            loss = loss + out.detach()
        else:
            ccl.send(ctx, out.detach(), s + 1, tag=ACTIVATIONS)
        inputs.append(inp)
        outputs.append(out)
    for i in reversed(range(microbatches)):
        if last:
            outputs[i].backward()
        else:
            grad = torch.empty(rows, width, device=dev)
            ccl.irecv(ctx, grad, s + 1, tag=GRADIENTS).wait()  # the stream waits, not the host
            outputs[i].backward(grad)
        if not first:
            ccl.isend(ctx, inputs[i].grad, s - 1, tag=GRADIENTS).wait()
    with torch.no_grad():
        for weight, bias in params:
            weight -= lr * weight.grad
            bias -= lr * bias.grad
            weight.grad = bias.grad = None
    return loss


def one_process(model, batches, lr: float):
    """The same training on one device, the whole batch at once: the parameters and the losses."""
    params = [(w.detach().clone().requires_grad_(), b.detach().clone().requires_grad_()) for w, b in model]
    losses = []
    for x, y in batches:
        loss = ((forward(params, x) - y) ** 2).mean()
        loss.backward()
        with torch.no_grad():
            for weight, bias in params:
                weight -= lr * weight.grad
                bias -= lr * bias.grad
                weight.grad = bias.grad = None
        losses.append(loss.item())
    return params, losses


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--microbatches", type=int, default=4)
    p.add_argument("--batch", type=int, default=32, help="rows per step (a multiple of --microbatches)")
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--layers-per-stage", type=int, default=2)
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--lr", type=float, default=0.1)
    args = p.parse_args(argv)
    if args.batch % args.microbatches:
        p.error("--batch must be a multiple of --microbatches")

    with iris.runtime.iris(heap_size=1 << 26) as ctx:
        W, s, dev = ctx.world_size, ctx.rank, ctx.device
        ccl.init_p2p(ctx, tags=2)  # collective, once: the mailboxes of the two tags
        L = args.layers_per_stage
        model = whole_model(L * W, args.width, seed=1234)
        mine = [(w.to(dev, copy=True).requires_grad_(), b.to(dev, copy=True).requires_grad_())
                for w, b in model[s * L:(s + 1) * L]]
        batches = [data(args.batch, args.width, seed=100 + step) for step in range(args.steps)]
        losses = []
        for x, y in batches:
            part = pipeline_step(ctx, mine, x, y, args.microbatches, args.lr)
            total = torch.empty(1, device=dev) if s == 0 else None
            ccl.reduce(ctx, total, part.reshape(1), 0)  # the last stage's loss, on rank 0
            losses.append(None if total is None else total.item())

        expected, expected_losses = one_process(model, batches, args.lr)
        wrong = 0.0
        for (w, b), (we, be) in zip(mine, expected[s * L:(s + 1) * L]):
            for got, want in ((w, we), (b, be)):
                wrong = max(wrong, (got.detach().cpu() - want.detach()).abs().max().item())
        ok = wrong <= 1e-5
        if s == 0:
            ok &= all(abs(a - b) <= 1e-5 * max(1.0, abs(b)) for a, b in zip(losses, expected_losses))
        verdicts = ctx.comm.gather((ok, wrong), root=0)
        if s == 0:
            print(f"GPipe pipeline: {W} stages x {L} layers, {args.microbatches} microbatches of "
                  f"{args.batch // args.microbatches} rows, width {args.width}, {args.steps} steps, backend "
                  f"{ctx.backend}")
            print(f"  losses {', '.join(f'{v:.6f}' for v in losses)} (one process: "
                  f"{', '.join(f'{v:.6f}' for v in expected_losses)})")
            bad = {r: d for r, (good, d) in enumerate(verdicts) if not good}
            state = "correct" if not bad and ok else f"WRONG (stage: largest difference) {bad}"
            print(f"  parameters of every stage after {args.steps} steps  {state} "
                  f"(largest difference {max(d for _, d in verdicts):.2e})")
        ok = ctx.broadcast(all(good for good, _ in verdicts) if s == 0 else None)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
