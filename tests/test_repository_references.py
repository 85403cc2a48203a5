"""Every script the repository's text names (``benchmarks/...``, ``tools/...``, ``examples/...``) exists:
a renamed or removed script must take its mentions in the docs, results, tests and tools with it.
The changelogs are history and may name scripts that are gone."""

from __future__ import annotations

import os
import re
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MENTION = re.compile(r"\b((?:benchmarks|tools|examples)/[A-Za-z0-9_.-]+\.(?:py|sh))\b")


SKIP_DIRS = {"_build", "dist", "build", "node_modules", "__pycache__"}  # plus hidden ones (.git, .nox)


def tracked_text_files() -> list[str]:
    """The repository's text files: git's list in a checkout, else a walk that skips build output."""
    proc = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True)
    if proc.returncode == 0 and proc.stdout.strip():
        paths = proc.stdout.split()
    else:
        paths = []
        for top, dirs, names in os.walk(ROOT):
            dirs[:] = [d for d in dirs if not d.startswith(".") and d not in SKIP_DIRS and not d.endswith(".egg-info")]
            paths += [os.path.relpath(os.path.join(top, n), ROOT) for n in names]
    return [p for p in paths if p.endswith((".md", ".py", ".sh", ".toml", ".txt")) and not p.endswith("CHANGELOG.md")]


def test_every_named_script_exists():
    files = tracked_text_files()
    assert any(f.startswith("benchmarks/") for f in files), "git ls-files found no benchmarks: not a checkout?"
    missing = []
    for path in files:
        with open(os.path.join(ROOT, path), encoding="utf-8", errors="replace") as f:
            for lineno, line in enumerate(f, 1):
                for name in MENTION.findall(line):
                    if not os.path.exists(os.path.join(ROOT, name)):
                        missing.append(f"{path}:{lineno}: {name}")
    assert not missing, "named but not in the repository:\n" + "\n".join(missing)
