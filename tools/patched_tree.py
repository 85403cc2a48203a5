"""A copy of the repository's packages with exact changes, for A/B timing on the GPU machine.

    python3 tools/patched_tree.py DEST FILE OLD NEW [FILE OLD NEW ...]

Copies ``packages/`` into ``DEST/packages`` (DEST is replaced), replaces ``OLD`` with ``NEW`` in
``DEST/FILE`` for each triple (``FILE`` relative to the repository root; ``OLD`` must occur
exactly once, so a script written against older code fails instead of timing an unchanged copy;
one change of a build may need several files) and prints the
copy's PYTHONPATH entries, to put before the rest (``benchmarks/watchdog_overhead.py --tree``
takes ``DEST`` itself). Used by ``tools/watchdog-ab.sh`` and ``tools/mrs-order-ab.sh``.
"""

from __future__ import annotations

import os
import shutil
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("iris-device", "iris-runtime", "iris-collectives")


def main(argv: list[str]) -> int:
    if len(argv) < 4 or (len(argv) - 1) % 3:
        sys.exit(__doc__.strip().splitlines()[2].strip())
    dest, changes = argv[0], argv[1:]
    shutil.rmtree(dest, ignore_errors=True)
    shutil.copytree(os.path.join(ROOT, "packages"), os.path.join(dest, "packages"),
                    ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    for file, old, new in zip(changes[0::3], changes[1::3], changes[2::3]):
        path = os.path.join(dest, file)
        text = open(path).read()
        if text.count(old) != 1:
            sys.exit(f"tools/patched_tree.py: {file}: expected the text to replace once, found it {text.count(old)} "
                     f"times; update the calling script to the current code:\n{old}")
        with open(path, "w") as f:
            f.write(text.replace(old, new))
    print(os.pathsep.join(os.path.join(dest, "packages", p, "src") for p in PACKAGES))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
