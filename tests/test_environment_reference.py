"""docs/environment.md, the reference of environment variables, lists every ``IRIS_*`` variable that
the repository's code reads, and nothing that no code reads any more.

"The code" is every Python and shell file of the packages (``packages/*/src`` and their tests),
``tests/``, ``tools/``, ``benchmarks/``, ``examples/``, the docs' scripts, ``noxfile.py`` and
``.ci/``: what a user, a test run, a benchmark or CI may be asked to set. A variable counts as read when its name occurs
in such a file at all, not only inside ``os.environ.get(...)``: names also reach the environment
through constants (``TIMINGS_ENV = "IRIS_TEST_TIMINGS"``), helpers (``_env_flag("IRIS_VERIFY")``),
mappings passed in (``env.get(...)``) and shell expansions (``${IRIS_NO_MPS:-}``), and error
messages that tell a user to set one must find it in the reference too.

Each variable is one row of a table of the reference, its name in the first cell:
``| `IRIS_DEBUG` | `0` | ... |``.
"""

from __future__ import annotations

import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REFERENCE = os.path.join(ROOT, "docs", "environment.md")
#: Folders and files whose code counts, relative to the repository root.
CODE_PLACES = ["packages", "tests", "tools", "benchmarks", "examples", "docs", "noxfile.py", ".ci"]
CODE_SUFFIXES = (".py", ".sh")
SKIP_DIRS = {"__pycache__", "build", "dist", "_build", "node_modules"}
NAME = re.compile(r"\bIRIS_[A-Z0-9_]*[A-Z0-9]\b")
ROW = re.compile(r"^\|\s*`(IRIS_[A-Z0-9_]+)`\s*\|", re.MULTILINE)
#: This file names variables in its text as examples; it reads none.
THIS_FILE = os.path.abspath(__file__)


def code_files(root: str = ROOT) -> list[str]:
    """The files of CODE_PLACES that are code: Python and shell files, and scripts without a
    suffix in ``.ci/`` (``.ci/run``); not this file. A walk, not git's list, so that new files
    count at once."""
    found = []
    for place in CODE_PLACES:
        path = os.path.join(root, place)
        if os.path.isfile(path):
            found.append(path)
            continue
        for top, dirs, names in os.walk(path):
            dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS and not d.startswith(".")
                             and not d.endswith(".egg-info"))
            for name in sorted(names):
                in_ci = os.path.relpath(top, root).split(os.sep)[0] == ".ci"
                path = os.path.join(top, name)
                if (name.endswith(CODE_SUFFIXES) or (in_ci and "." not in name)) and path != THIS_FILE:
                    found.append(path)
    return found


def variables_in_code(root: str = ROOT) -> dict[str, list[str]]:
    """Every IRIS_* name in the code, with the places (``path:line``) that name it."""
    where: dict[str, list[str]] = {}
    for path in code_files(root):
        with open(path, encoding="utf-8", errors="replace") as f:
            for lineno, line in enumerate(f, 1):
                for name in NAME.findall(line):
                    where.setdefault(name, []).append(f"{os.path.relpath(path, root)}:{lineno}")
    return where


def variables_in_reference(path: str = REFERENCE) -> set[str]:
    with open(path, encoding="utf-8") as f:
        return set(ROW.findall(f.read()))


def test_the_scan_finds_names_however_they_are_read(tmp_path):
    """The scan sees a name in a constant, a helper call, a mapping lookup and a shell expansion
    (made up names: real ones in this file would count as read)."""
    names = ["IRIS_" + suffix for suffix in ("MADE_UP_A", "MADE_UP_B", "MADE_UP_C", "MADE_UP_D")]
    (tmp_path / "tools").mkdir()
    (tmp_path / "tools" / "a.py").write_text(f'ENV = "{names[0]}"\nflag("{names[1]}")\nenv.get("{names[2]}")\n')
    (tmp_path / "tools" / "b.sh").write_text(f'[ -n "${{{names[3]}:-}}" ] && echo on\n')
    (tmp_path / "tools" / "notes.md").write_text("IRIS_" + "IN_PROSE_ONLY\n")
    found = variables_in_code(str(tmp_path))
    assert sorted(found) == names, found
    assert found[names[3]] == [os.path.join("tools", "b.sh") + ":1"], found


def test_every_variable_the_code_reads_is_in_the_reference():
    in_code = variables_in_code()
    assert "IRIS_BACKEND" in in_code, "the scan found no IRIS_BACKEND: are the packages where it looks?"
    documented = variables_in_reference()
    missing = sorted(set(in_code) - documented)
    assert not missing, (
        "docs/environment.md has no row for " + ", ".join(missing) + ":\n"
        + "\n".join(f"  {name}: read in {', '.join(in_code[name][:3])}" for name in missing)
        + "\nadd a row (| `NAME` | default | what it does | when it is read |) to one of its tables")


def test_every_variable_in_the_reference_is_still_read():
    stale = sorted(variables_in_reference() - set(variables_in_code()))
    assert not stale, (f"docs/environment.md lists {', '.join(stale)}, which no code reads any more: "
                       f"remove the row, or name the code that reads it")
