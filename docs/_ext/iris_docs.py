"""Sphinx helpers for this site.

1. ``@triton.jit`` functions are ``JITFunction`` (or, under Triton's interpreter,
   ``InterpretedFunction``) objects, not Python functions, so autodoc would list them as data
   with no signature. Before autodoc runs, every such object in the ``iris.*`` modules (and in
   their classes) is replaced, in this build process only, by the Python function it wraps, and
   its docstring gets a line saying it is device code.
2. ``<!-- results-gallery: PATH -->`` in a page is replaced, when the page is read, by what
   the folder ``PATH`` (relative to the repository root) holds at build time: pictures shown,
   Markdown inlined, CSV as tables, text as literal blocks, anything else as a download link.
   ``<!-- results: STEM -->`` shows one benchmark's results the same way: ``STEM.md`` inlined,
   ``STEM.png`` shown, ``STEM.json`` as a download. The performance and tracing pages use them,
   so a new run's results appear without editing the pages.
"""

from __future__ import annotations

import csv
import importlib
import inspect
import json
import os
import re
import sys

JIT_MARK = "__iris_device_function__"
PACKAGES = ("iris.device", "iris.runtime", "iris.collectives")
GALLERY = re.compile(r"^<!--\s*results-gallery:\s*(\S+)\s*-->\s*$", re.MULTILINE)
RESULTS = re.compile(r"^<!--\s*results:\s*(\S+)\s*-->\s*$", re.MULTILINE)
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# --- 1. device functions for autodoc -----------------------------------------------------------

def _is_jit(obj) -> bool:
    from triton.runtime.jit import KernelInterface

    return isinstance(obj, KernelInterface) and inspect.isfunction(getattr(obj, "fn", None))


def _plain(obj, staticish: bool):
    fn = obj.fn if _is_jit(obj) else obj.__wrapped__
    setattr(fn, JIT_MARK, True)
    first = next(iter(inspect.signature(fn).parameters), None)
    return staticmethod(fn) if staticish and first != "self" else fn


def _unwrap_class(cls) -> None:
    aggregate = getattr(cls, "__triton_aggregate__", False)
    for name, member in list(vars(cls).items()):
        if isinstance(member, staticmethod) and _is_jit(member.__func__):
            setattr(cls, name, staticmethod(_plain(member.__func__, False)))
        elif _is_jit(member):
            setattr(cls, name, _plain(member, staticish=True))
        elif aggregate and inspect.isfunction(member) and _is_jit_wrapper(member):
            # Under the interpreter iris.device.aggregate attaches forwarders that wrap the method.
            setattr(cls, name, _plain(member, staticish=False))


def _is_jit_wrapper(fn) -> bool:
    wrapped = getattr(fn, "__wrapped__", None)
    return inspect.isfunction(wrapped) and fn.__name__ == wrapped.__name__ and fn.__code__.co_name == "method"


def unwrap_device_functions(_app=None) -> None:
    """Replace every jit object of the iris packages' modules and classes by its function."""
    for name in PACKAGES + ("iris.runtime.testing",):
        importlib.import_module(name)
    # The modules the packages import themselves (not every file: some are entry points).
    modules = [m for n, m in sorted(sys.modules.items()) if n.startswith(PACKAGES) and m is not None]
    for module in modules:
        for name, member in list(vars(module).items()):
            if _is_jit(member):
                setattr(module, name, _plain(member, staticish=False))
            elif inspect.isclass(member) and member.__module__.startswith("iris."):
                _unwrap_class(member)


def mark_device_functions(_app, _what, _name, obj, _options, lines) -> None:
    """Open a device function's docstring with how it is called."""
    target = getattr(obj, "__func__", obj)
    if getattr(target, JIT_MARK, False):
        lines[:0] = ["*Device code* (``@triton.jit``): call it from inside a Triton kernel.", ""]


def _is_aggregate(obj) -> bool:
    return inspect.isclass(obj) and getattr(obj, "__triton_aggregate__", False)


def hide_aggregate_signature(_app, what, _name, obj, _options, signature, return_annotation):
    """Aggregates are built with ``X.initialize(...)`` in a kernel, not by calling the class."""
    if what == "class" and _is_aggregate(obj):
        return "", None
    return signature, return_annotation


def hide_aggregate_base(_app, _name, obj, _options, bases) -> None:
    """Triton's ``base_value`` is an implementation detail of aggregates."""
    if _is_aggregate(obj):
        bases[:] = [b for b in bases if b.__name__ != "base_value"]


# --- 2. results galleries ----------------------------------------------------------------------

def _markdown_table(rows: list[list[str]]) -> list[str]:
    if not rows:
        return []
    width = max(len(r) for r in rows)
    rows = [r + [""] * (width - len(r)) for r in rows]
    clean = [[c.replace("|", "\\|").strip() for c in r] for r in rows]
    out = ["| " + " | ".join(clean[0]) + " |", "|" + "---|" * width]
    out += ["| " + " | ".join(r) + " |" for r in clean[1:]]
    return out


def _json_records(path: str, limit: int = 500) -> list[list[str]] | None:
    """Rows of a table when the JSON file is a list of flat records (a results file), else None."""
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        return None
    if not (isinstance(data, list) and 0 < len(data) <= limit and all(isinstance(r, dict) for r in data)):
        return None
    if any(isinstance(v, (dict, list)) for r in data for v in r.values()):
        return None
    keys = list(dict.fromkeys(k for r in data for k in r))
    return [keys] + [[str(r.get(k, "")) for k in keys] for r in data]


#: A ``text`` fence in a results file: a measured table, not code.
RESULT_FENCE = re.compile(r"^(`{3,})text[ \t]*$", re.MULTILINE)


def results_block(match: re.Match) -> str:
    """The fence as a code block of class ``iris-results``: such tables are wider than a laptop's
    column by design and may scroll (tools/check_docs_layout.py exempts the class)."""
    return f"{match.group(1)}{{code-block}} text\n:class: iris-results\n"


def gallery_markdown(folder: str, docdir: str) -> str:
    """MyST text showing the files of ``folder`` (absolute) for a page in ``docdir``."""
    if not os.path.isdir(folder):
        return "*(no results yet)*\n"
    files = sorted(f for f in os.listdir(folder) if not f.startswith(".") and os.path.isfile(os.path.join(folder, f)))
    inside_docs = os.path.commonpath([folder, os.path.join(ROOT, "docs")]) == os.path.join(ROOT, "docs")
    parts: list[str] = []
    pages = [f for f in files if f.endswith(".md") and f != "README.md"] if inside_docs else []
    if pages:
        # Pages of their own: list them in a toctree (Sphinx wants every page in one).
        entries = [os.path.relpath(os.path.join(folder, p[:-3]), docdir).replace(os.sep, "/") for p in pages]
        parts += ["```{toctree}", ":maxdepth: 1", "", *entries, "```", ""]
    for name in files:
        path = os.path.join(folder, name)
        rel = os.path.relpath(path, docdir).replace(os.sep, "/")
        ext = os.path.splitext(name)[1].lower()
        if ext == ".md" and inside_docs:
            continue  # a page of its own, listed in the toctree above
        # One section per file, so that what a file brings (its own headings) stays inside it.
        parts += [f"### {name}", ""]
        if ext in (".png", ".svg", ".jpg", ".jpeg", ".gif"):
            parts += [f"```{{image}} {rel}", ":width: 100%", f":alt: {name}", "```", ""]
        elif ext == ".md":
            # Headings demoted by three levels so that the file's sections sit under its own.
            parts += [inlined_markdown(path, 3), ""]
        elif ext == ".csv":
            with open(path, newline="", encoding="utf-8") as fh:
                rows = list(csv.reader(fh))
            parts += [f"{{download}}`{name} <{rel}>`", ""] + _markdown_table(rows) + [""]
        elif ext == ".json" and (rows := _json_records(path)):
            parts += [f"{{download}}`{name} <{rel}>`", ""] + _markdown_table(rows) + [""]
        elif ext in (".txt", ".log"):
            text = open(path, encoding="utf-8", errors="replace").read()
            fence = "````" if "```" in text else "```"
            parts += [RESULT_FENCE.sub(results_block, fence + "text"), text.rstrip(), fence, ""]
        else:
            size = os.path.getsize(path)
            parts += [f"{{download}}`{name} <{rel}>` ({size / 1024:.1f} KiB)", ""]
    if not parts:
        return "*(no results yet)*\n"
    return "\n".join(parts) + "\n"


def inlined_markdown(path: str, levels: int) -> str:
    """A results Markdown file for inlining: headings demoted by ``levels``, text fences as results."""
    text = open(path, encoding="utf-8").read()
    text = re.sub(r"^(#{1,3}) ", lambda m: "#" * (len(m.group(1)) + levels) + " ", text, flags=re.MULTILINE)
    return RESULT_FENCE.sub(results_block, text).rstrip()


def stem_markdown(stem: str, docdir: str) -> str:
    """MyST text showing one benchmark's results ``stem.{md,png,json}`` (absolute ``stem``)."""
    parts: list[str] = []
    name = os.path.basename(stem)
    if os.path.isfile(stem + ".md"):
        parts += [inlined_markdown(stem + ".md", 4), ""]
    if os.path.isfile(stem + ".png"):
        rel = os.path.relpath(stem + ".png", docdir).replace(os.sep, "/")
        parts += [f"```{{image}} {rel}", ":width: 100%", f":alt: {name}", "```", ""]
    if os.path.isfile(stem + ".json"):
        rel = os.path.relpath(stem + ".json", docdir).replace(os.sep, "/")
        parts += [f"Data: {{download}}`{name}.json <{rel}>`", ""]
    return "\n".join(parts) + "\n" if parts else f"*(no results in {name}.* yet)*\n"


def expand_galleries(app, docname, source) -> None:
    """``source-read`` handler: replace each gallery and results marker by what it names."""
    docdir = str(os.path.dirname(app.env.doc2path(docname)))

    def gallery(match):
        return gallery_markdown(os.path.normpath(os.path.join(ROOT, match.group(1))), docdir)

    def results(match):
        return stem_markdown(os.path.normpath(os.path.join(ROOT, match.group(1))), docdir)

    source[0] = RESULTS.sub(results, GALLERY.sub(gallery, source[0]))


def setup(app):
    app.connect("builder-inited", unwrap_device_functions)
    app.connect("autodoc-process-docstring", mark_device_functions)
    app.connect("autodoc-process-signature", hide_aggregate_signature)
    app.connect("autodoc-process-bases", hide_aggregate_base)
    app.connect("source-read", expand_galleries)
    return {"parallel_read_safe": True, "parallel_write_safe": True, "version": "1"}
