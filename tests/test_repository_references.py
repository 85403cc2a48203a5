"""Every script the repository's text names (``benchmarks/...``, ``tools/...``, ``examples/...``) exists:
a renamed or removed script must take its mentions in the docs, results, tests and tools with it.
The changelogs are history and may name scripts that are gone."""

from __future__ import annotations

import os
import re
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MENTION = re.compile(r"\b((?:benchmarks|tools|examples)/[A-Za-z0-9_.-]+\.(?:py|sh))\b")


def tracked_text_files() -> list[str]:
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return [p for p in out.split() if p.endswith((".md", ".py", ".sh", ".toml", ".txt"))
            and not p.endswith("CHANGELOG.md") and p != ".ci/run"]


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
