"""What a kernel compiles to, read on any machine: for tests that pin down a kernel's memory order.

Triton compiles for a GPU it cannot see. :func:`compile_ptx` returns the PTX of a ``@triton.jit``
function for an H100/H200 (sm_90) on a machine with no GPU, and :func:`memory_order` reads out of
it the instructions the memory model is made of, in program order, with loops marked. A test can
then say exactly what a signal or a flag wait compiles to, and fail when a change (ours, or a new
Triton) drops a fence or weakens a scope::

    # run with IRIS_BACKEND=cuda (or TRITON_INTERPRET=0): compiled kernels, GPU or not
    import triton
    import triton.language as tl
    from iris.device.testing import compile_ptx, memory_order

    @triton.jit
    def signal(flag):
        tl.atomic_add(flag, 1, sem="release", scope="sys")

    order = memory_order(compile_ptx(signal, {"flag": "*i32"}))
    assert order[-1] == "atom.release.sys.add.u32"  # Triton 3.9 puts a "bar.sync" before it

The kernels must be compiled functions: where ``import iris.device`` chose Triton's interpreter
(no GPU visible, ``IRIS_BACKEND=cpu``), :func:`compile_ptx` raises :class:`IrisBackendError`.
"""

from __future__ import annotations

import re

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.runtime.interpreter import InterpretedFunction
from triton.runtime.jit import JITFunction

from ._errors import IrisBackendError, IrisUsageError

#: An H100 or H200: compute capability 9.0, 32 threads per warp.
SM90 = GPUTarget("cuda", 90, 32)


def compile_ptx(fn, signature: dict, constexprs: dict | None = None, aligned=(), options: dict | None = None,
                target: GPUTarget = SM90) -> str:
    """The PTX of the ``@triton.jit`` function ``fn`` for ``target`` (default sm_90), no GPU needed
    (:func:`compile_for`'s ``asm["ptx"]``)."""
    return compile_for(fn, signature, constexprs, aligned, options, target).asm["ptx"]


def compile_for(fn, signature: dict, constexprs: dict | None = None, aligned=(), options: dict | None = None,
                target: GPUTarget = SM90):
    """The ``@triton.jit`` function ``fn`` compiled for ``target`` (default sm_90), no GPU needed:
    Triton's compiled kernel, whose ``asm`` holds the PTX and whose ``metadata.shared`` the shared
    memory a launch needs (bytes; a launch fails where the card has less).

    ``signature`` maps each runtime argument to its Triton type (``"*fp32"``, ``"i32"``, ...) in
    the order of ``fn``'s parameters; ``constexprs`` gives the compile-time ones their values.
    The arguments named in ``aligned`` get the 16-divisibility a launch gives aligned pointers and
    multiples of 16 (what makes Triton vectorise). ``options`` are Triton's compile options
    (``num_warps``, ``num_stages``, ...); ``debug`` follows Triton's knob, as at a launch.
    """
    if isinstance(fn, InterpretedFunction):
        raise IrisBackendError(
            f"iris.device.testing.compile_ptx({getattr(fn, '__name__', fn)}): the kernel is interpreted "
            f"(Triton's interpreter is on: no GPU visible, IRIS_BACKEND=cpu or TRITON_INTERPRET=1); set "
            f"IRIS_BACKEND=cuda or TRITON_INTERPRET=0 before importing triton to compile without a GPU")
    if not isinstance(fn, JITFunction):
        raise IrisUsageError(f"iris.device.testing.compile_ptx(fn={fn!r}): fn must be a @triton.jit function")
    constexprs = dict(constexprs or {})
    sig = {**signature, **{name: "constexpr" for name in constexprs}}
    names = list(sig)
    missing = [a for a in aligned if a not in names]
    if missing:
        raise IrisUsageError(f"iris.device.testing.compile_ptx({fn.__name__}): aligned={list(aligned)} names "
                             f"{missing}, which are not in the signature or constexprs ({names})")
    attrs = {(names.index(a),): [["tt.divisibility", 16]] for a in aligned}
    source = ASTSource(fn=fn, signature=sig, constexprs=constexprs, attrs=attrs)
    options = {"debug": bool(triton.knobs.runtime.debug), **(options or {})}
    return triton.compile(source, target=target, options=options)


# The tokens memory_order keeps, found anywhere in a line (inline-asm blocks hold several).
_SEMS = ("relaxed", "acquire", "release", "acq_rel")
_SCOPES = ("cta", "gpu", "sys")
_TOKEN = re.compile(
    r"(?<![\w.%$])(?:"
    r"(?P<bar>bar\.sync|barrier(?:\.cta)?\.sync|bar(?:rier)?(?:\.cta)?\.red\.(?:and|or|popc))\b"
    r"|(?P<fence>(?:fence|membar)\.[\w.]+)"
    r"|(?P<atom>(?:atom|red)\.[\w.]+)"
    r"|(?P<ldst>(?:ld|st)\.[\w.]*?\b(?:acquire|release|relaxed|volatile)\b[\w.]*)"
    r"|bra(?:\.uni)?\s+(?P<target>\$L__BB\w+)"
    r")")
_LABEL = re.compile(r"^(\$L__BB\w+):")


def _atom(text: str) -> str:
    parts = text.split(".")[1:]
    sem = next((p for p in parts if p in _SEMS), "-")
    scope = next((p for p in parts if p in _SCOPES), "-")
    rest = [p for p in parts if p not in _SEMS and p not in _SCOPES and p != "global"]
    return ".".join(["atom", sem, scope, *rest])


def _load_store(text: str) -> str:
    parts = text.split(".")
    sem = next(p for p in parts if p in _SEMS or p == "volatile")
    scope = [p for p in parts if p in _SCOPES][:1]
    return ".".join([parts[0], sem, *scope])


def memory_order(ptx: str) -> list[str]:
    """The memory-model instructions of ``ptx``, in program (text) order, written so that Triton
    3.6 and 3.9 read the same where they mean the same:

    - ``"bar.sync"``: a CTA barrier (``bar.sync``, ``barrier.sync``, any operands; also the votes
      ``bar.red.and/or/popc``, which order memory as ``bar.sync`` does);
    - ``"fence.acq_rel.sys"``, ``"membar.gl"``: fences, as written;
    - ``"atom.<sem>.<scope>.<op>.<type>"``: ``atom`` and ``red`` alike (Triton 3.9 writes ``red``
      where the old value is unused: the same ordering), qualifiers in that order, the state space
      dropped, ``-`` for a missing sem or scope;
    - ``"ld.acquire.sys"``, ``"st.release.gpu"``, ``"ld.volatile"``: loads and stores with a
      memory-order qualifier; plain loads and stores are left out;
    - ``"loop{"`` ... ``"}"``: the body of a loop (a label and a branch back to it).

    Predicates (which threads execute an instruction) are dropped: Triton 3.6 and 3.9 spell
    thread 0's predicate differently. Plain text processing: any PTX, from any compiler.
    """
    items: list[tuple[str, str]] = []  # (kind, text): "op", "label" or "branch"
    for line in ptx.splitlines():
        text = line.split("//")[0].strip()
        if not text or text.startswith("."):
            continue
        label = _LABEL.match(text)
        if label:
            items.append(("label", label.group(1)))
            continue
        for m in _TOKEN.finditer(text):
            if m.group("bar"):
                items.append(("op", "bar.sync"))
            elif m.group("fence"):
                items.append(("op", m.group("fence")))
            elif m.group("atom"):
                items.append(("op", _atom(m.group("atom"))))
            elif m.group("ldst"):
                items.append(("op", _load_store(m.group("ldst"))))
            else:
                items.append(("branch", m.group("target")))
    defined = {text: i for i, (kind, text) in enumerate(items) if kind == "label"}
    opens: dict[int, int] = {}
    closes: dict[int, int] = {}
    for i, (kind, text) in enumerate(items):
        if kind == "branch" and defined.get(text, i) < i:  # a branch back: a loop from the label to here
            opens[defined[text]] = opens.get(defined[text], 0) + 1
            closes[i] = closes.get(i, 0) + 1
    out: list[str] = []
    for i, (kind, text) in enumerate(items):
        out += ["loop{"] * opens.get(i, 0)
        if kind == "op":
            out.append(text)
        out += ["}"] * closes.get(i, 0)
    return out


__all__ = ["SM90", "compile_for", "compile_ptx", "memory_order"]
