"""Run every code block of the documentation (the pages, docs/**/*.md, and README.md) on this machine.

Rules, so that no example in the docs goes stale:

- A ```` ```python ```` block runs as a script of its own, in a fresh process, on one rank.
- A block preceded by ``<!-- docs-run: ranks=N -->`` runs on N ranks:
  ``mpiexec -n N python -m mpi4py block.py`` (the launcher of ``iris.runtime.testing``).
- A ``bash`` block preceded by ``<!-- docs-run: shell -->`` runs with ``bash -e`` in a fresh
  directory that links every top-level entry of the repository (so ``python examples/run.py``
  works and nothing is written into the checkout); ``python`` is this interpreter, and ``mpirun``
  the MPI launcher next to it. Options after ``shell``: ``previous=NAME`` writes the previous
  Python block of the page to ``NAME`` first; ``copy=SRC:NAME`` copies the repository file
  ``SRC`` to ``NAME`` first.
- A block preceded by ``<!-- docs-run: skip REASON -->`` is not run; the reason is printed.
  Installation, GPU-only commands, program output and fragments that only make sense inside a
  kernel are marked this way. Any other block (a ``bash`` block with no marker, say) is an error:
  mark it.
- Directives written as fences (```` ```{toctree} ````, ```` ```{eval-rst} ```` ...) are not
  code blocks; ```` ```{code-block} python ```` is one.

A block passes when its process exits 0 within the time limit; blocks check their own results
(``assert``). Exit status: 0 when every block that runs passes.

    python docs/run_code_blocks.py [-k SUBSTRING] [--list] [FILE ...]
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SOURCES = [os.path.join(ROOT, "packages", p, "src") for p in ("iris-device", "iris-runtime", "iris-collectives")]
FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})\s*(.*?)\s*$")
MARKER = re.compile(r"^\s*<!--\s*docs-run:\s*(.*?)\s*-->\s*$")
CODE_DIRECTIVES = ("{code-block}", "{code}", "{sourcecode}")
PYTHON = ("python", "py", "python3")
SHELL = ("bash", "sh", "shell", "console")
TIMEOUT_S = 300


@dataclasses.dataclass
class Block:
    path: str
    line: int  # 1-based line of the opening fence
    language: str
    code: str
    marker: str  # text of the docs-run marker, "" when none

    @property
    def where(self) -> str:
        return f"{os.path.relpath(self.path, ROOT)}:{self.line}"


def is_closing(line: str, fence: str) -> bool:
    """A fence of the same character, at least as long as the opening one, and nothing else."""
    text = line.strip()
    return text.startswith(fence) and text.strip(fence[0]) == ""


def find_blocks(path: str) -> list[Block]:
    """Fenced code blocks of a Markdown file, with the docs-run marker just above each."""
    lines = open(path, encoding="utf-8").read().splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        match = FENCE.match(lines[i])
        if not match:
            i += 1
            continue
        indent, fence, info = match.groups()
        end = i + 1
        while end < len(lines) and not is_closing(lines[end], fence):
            end += 1
        body = [line[len(indent):] if line.startswith(indent) else line for line in lines[i + 1:end]]
        language = info.split()[0] if info else ""
        if language in CODE_DIRECTIVES:
            language = info.split()[1] if len(info.split()) > 1 else ""
            body = [line for line in body if not line.startswith(":")]  # directive options
        elif language.startswith("{"):
            i = end + 1  # a directive (toctree, eval-rst, figure ...), not code
            continue
        prev = i - 1
        while prev >= 0 and not lines[prev].strip():
            prev -= 1
        marker = MARKER.match(lines[prev]) if prev >= 0 else None
        blocks.append(Block(path, i + 1, language.lower(), "\n".join(body) + "\n", marker.group(1) if marker else ""))
        i = end + 1
    return blocks


def default_files() -> list[str]:
    files = [os.path.join(ROOT, "README.md")]
    for folder, dirs, names in os.walk(HERE):
        dirs[:] = sorted(d for d in dirs if not d.startswith(("_build", ".")))
        # README.md files under docs/ are notes for the folder, not pages (conf.py excludes them).
        files += [os.path.join(folder, n) for n in sorted(names) if n.endswith(".md") and n != "README.md"]
    return files


def plan(block: Block) -> tuple[str, object]:
    """("skip", reason) / ("run", ranks) / ("shell", options) / ("error", message) for a block."""
    marker = block.marker
    if marker.startswith("skip"):
        reason = marker[4:].strip(" :") or "no reason given"
        return "skip", reason
    if marker.split()[:1] == ["shell"]:
        if block.language not in SHELL:
            return "error", f"'docs-run: shell' on a {block.language or 'plain'} block; it is for bash blocks"
        options = {}
        for item in marker.split()[1:]:
            key, _, value = item.partition("=")
            if key not in ("previous", "copy") or not value:
                return "error", f"unknown shell option {item!r}; use previous=NAME or copy=SRC:NAME"
            options.setdefault(key, []).append(value)
        return "shell", options
    ranks = None
    if marker:
        m = re.fullmatch(r"ranks\s*=\s*(\d+)", marker)
        if not m:
            return "error", f"unknown docs-run marker {marker!r}; use 'ranks=N', 'shell [...]' or 'skip REASON'"
        ranks = int(m.group(1))
    if block.language not in PYTHON:
        return "error", (f"a {block.language or 'plain'} block with no marker; put '<!-- docs-run: shell -->' "
                         f"or '<!-- docs-run: skip REASON -->' on the line above it")
    return "run", ranks


def installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # the parent package is missing
        return False


# Not installed: use the packages of this checkout (here and in the blocks' processes).
USE_CHECKOUT = not installed("iris.runtime")
if USE_CHECKOUT:
    sys.path[:0] = SOURCES


def run_block(block: Block, ranks: int | None, workdir: str) -> tuple[bool, str, float]:
    script = os.path.join(workdir, f"block_{os.path.basename(block.path)}_{block.line}.py")
    with open(script, "w", encoding="utf-8") as fh:
        fh.write(block.code)
    env = block_env()
    if ranks is None:
        cmd = [sys.executable, script]
    else:
        from iris.runtime.testing import launcher

        cmd = launcher() + ["-n", str(ranks), sys.executable, "-m", "mpi4py", script]
    return run_timed(cmd, workdir, env)


def run_timed(cmd: list[str], cwd: str, env: dict) -> tuple[bool, str, float]:
    """Run ``cmd`` under the block timeout: (exit 0, its output, seconds)."""
    start = time.monotonic()
    try:
        proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        return False, f"timed out after {TIMEOUT_S} s\n{out}", time.monotonic() - start
    return proc.returncode == 0, proc.stdout + proc.stderr, time.monotonic() - start


def block_env() -> dict:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    if USE_CHECKOUT:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [env.get("PYTHONPATH", "")] + SOURCES))
    return env


def shell_dir(options: dict, previous: Block | None, workdir: str) -> str:
    """A fresh directory for a shell block: links to the repository's top-level entries, the
    files its options ask for, and a ``python`` that is this interpreter."""
    where = tempfile.mkdtemp(prefix="shell-", dir=workdir)
    for name in os.listdir(ROOT):
        if not name.startswith("."):
            os.symlink(os.path.join(ROOT, name), os.path.join(where, name))
    for name in options.get("previous", []):
        if previous is None:
            raise ValueError(f"previous={name}: no Python block above this one on the page")
        with open(os.path.join(where, name), "w", encoding="utf-8") as fh:
            fh.write(previous.code)
    for item in options.get("copy", []):
        src, _, name = item.partition(":")
        shutil.copyfile(os.path.join(ROOT, src), os.path.join(where, name or os.path.basename(src)))
    shims = os.path.join(where, ".bin")
    os.mkdir(shims)
    for name in ("python", "python3"):
        # a script, not a link: a linked venv interpreter would not find its pyvenv.cfg
        path = os.path.join(shims, name)
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
        os.chmod(path, 0o755)
    return where


def run_shell(block: Block, options: dict, previous: Block | None, workdir: str) -> tuple[bool, str, float]:
    try:
        where = shell_dir(options, previous, workdir)
    except (OSError, ValueError) as exc:
        return False, str(exc), 0.0
    env = block_env()
    # this interpreter first, then the scripts next to it (mpich's mpirun in a virtual environment)
    env["PATH"] = os.pathsep.join([os.path.join(where, ".bin"), os.path.dirname(sys.executable), env.get("PATH", "")])
    return run_timed(["bash", "-e", "-o", "pipefail", "-c", block.code], where, env)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="*", help="Markdown files (default: README.md and docs/**/*.md)")
    parser.add_argument("-k", default="", help="only blocks whose file:line contains this")
    parser.add_argument("--list", action="store_true", help="show the plan, run nothing")
    args = parser.parse_args(argv)

    files = [os.path.abspath(f) for f in args.files] or default_files()
    all_blocks = [b for f in files for b in find_blocks(f)]
    failures, ran, skipped = [], 0, []
    with tempfile.TemporaryDirectory(prefix="iris-docs-") as workdir:
        previous: dict[str, Block] = {}  # per page, the last Python block that runs (previous=NAME)
        for block in all_blocks:
            action, detail = plan(block)
            if action == "run":
                previous[block.path] = block
            if args.k not in block.where:
                continue
            if action == "skip":
                skipped.append(block)
                print(f"SKIP {block.where} ({block.language or 'plain'}): {detail}", flush=True)
                continue
            if action == "error":
                failures.append(block)
                print(f"ERROR {block.where}: {detail}", flush=True)
                continue
            label = "bash" if action == "shell" else (f"{detail} ranks" if detail else "1 process")
            if args.list:
                print(f"RUN  {block.where} on {label}")
                continue
            if action == "shell":
                before = previous.get(block.path)
                ok, output, seconds = run_shell(block, detail, before, workdir)
            else:
                ok, output, seconds = run_block(block, detail, workdir)
            ran += 1
            print(f"{'PASS' if ok else 'FAIL'} {block.where} on {label} ({seconds:.1f} s)", flush=True)
            if not ok:
                failures.append(block)
                print("  | " + "\n  | ".join(output.rstrip().splitlines()[-60:]), flush=True)
    print(f"{ran} blocks run, {len(skipped)} skipped (marked), {len(failures)} failed or unmarked")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
