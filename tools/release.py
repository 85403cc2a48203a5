"""Prepare the release of one package: build, check, install, and say which tag to create.

    python tools/release.py iris-device [--outdir dist] [--no-isolation]

For packages/<name> (on a clean copy of the folder, so the source tree stays as it is):

1. the version in ``_version.py`` has the newest section of the package's CHANGELOG.md, headed
   ``## X.Y.Z (YYYY-MM-DD)``;
2. ``python -m build`` makes the sdist, then the wheel from that sdist (so a file the sdist
   forgets breaks the build here, not for a user); both carry the version;
3. ``twine check --strict`` passes on both (metadata, and the README renders on PyPI);
4. the wheel installs into a clean venv with only its declared dependencies, resolved from the
   index under the repository's constraints (``constraints/cpu-test.txt`` and the newest tested
   Triton line), plus the wheels of the siblings it requires, built from this repository (they
   are not on an index), and an MPI (``mpich`` from PyPI) where the docs leave one to the user;
   ``pip check`` is clean, and ``import iris.<name>`` works from the
   installed wheel and reports the version (iris-device: torch, mpi4py and iris-runtime are not
   installed at all);
5. the tag ``<name>-vX.Y.Z`` does not exist yet, or already names HEAD.

It prints a table and, when every check passed, the tag to create and the upload command. It
creates no tag and uploads nothing: a person does both. The built files stay in
``<outdir>/<name>/``. Exits 1 when a check fails.
"""

from __future__ import annotations

import argparse
import datetime
import email.parser
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile

import check_packaging
import compat
from check_packaging import Report, copy_package, module_name, run

ROOT = check_packaging.ROOT
CONSTRAINTS = ["constraints/cpu-test.txt"]
#: What ``pip install iris-device`` must never bring in (a kernel author gets Triton only).
FORBIDDEN_FOR_DEVICE = check_packaging.FORBIDDEN_FOR_DEVICE
#: What the docs name as the user's own, not as a dependency (getting-started: "and an MPI"), with
#: the PyPI package that stands in for it in the clean venv: mpi4py loads an MPI library when
#: ``iris.runtime`` is imported, and pip cannot know which one a cluster has.
USER_PROVIDED = {"iris-runtime": ["mpich"], "iris-collectives": ["mpich"]}
HEADING = re.compile(r"^## (?P<version>\S+) \((?P<date>[^)]*)\)\s*$")


def newest_triton_constraints() -> str:
    """``constraints/triton-<X.Y>.txt`` of the newest tested line: what a new user's pip picks."""
    lines = [f for f in os.listdir(os.path.join(ROOT, "constraints")) if re.fullmatch(r"triton-\d+\.\d+\.txt", f)]
    if not lines:
        raise SystemExit("tools/release.py: no constraints/triton-<X.Y>.txt found")
    newest = max(lines, key=lambda f: tuple(int(p) for p in f[7:-4].split(".")))
    return os.path.join("constraints", newest)


def check_changelog(package: str, version: str, report: Report) -> None:
    """The first ``## `` heading of CHANGELOG.md is ``## <version> (YYYY-MM-DD)``."""
    path = os.path.join(ROOT, "packages", package, "CHANGELOG.md")
    rel = os.path.relpath(path, ROOT)
    with open(path) as f:
        headings = [line.rstrip("\n") for line in f if line.startswith("## ")]
    if not headings:
        report.add(package, "CHANGELOG section", False, f"{rel} has no '## X.Y.Z (YYYY-MM-DD)' section")
        return
    top = HEADING.match(headings[0])
    if not top:
        report.add(package, "CHANGELOG section", False,
                   f"{rel}'s newest heading is {headings[0]!r}; write it as '## {version} (YYYY-MM-DD)'")
        return
    try:
        datetime.date.fromisoformat(top["date"])
        date_ok = True
    except ValueError:
        date_ok = False
    ok = top["version"] == version and date_ok
    detail = f"{rel} starts with {headings[0]!r}; _version.py says {version}"
    if top["version"] != version:
        detail += f": add a '## {version} (YYYY-MM-DD)' section on top, or fix _version.py"
    elif not date_ok:
        detail += f": {top['date']!r} is not a date (YYYY-MM-DD)"
    report.add(package, "CHANGELOG section", ok, detail)


def build_dists(source: str, outdir: str, isolation: bool) -> tuple[list[str], str]:
    """sdist, then the wheel built from it. Returns the two paths (or []) and what ran."""
    cmd = [sys.executable, "-m", "build", "--outdir", outdir, source]
    if not isolation:
        cmd.insert(3, "--no-isolation")  # the offline GPU machine: its own setuptools, no index
    rc, out = run(cmd)
    dists = sorted(os.path.join(outdir, f) for f in os.listdir(outdir)) if os.path.isdir(outdir) else []
    kinds = sorted(d.endswith(".whl") for d in dists)
    if rc != 0 or kinds != [False, True]:
        return [], f"{' '.join(cmd[1:])} exited {rc}: {out[-800:]}"
    return dists, "python -m build (sdist, then the wheel from it)"


def dist_metadata(path: str) -> dict:
    """Name and version from a wheel's METADATA or an sdist's PKG-INFO."""
    if path.endswith(".whl"):
        with zipfile.ZipFile(path) as zf:
            name = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
            text = zf.read(name).decode()
    else:
        with tarfile.open(path) as tf:
            member = next(m for m in tf.getmembers() if m.name.count("/") == 1 and m.name.endswith("/PKG-INFO"))
            text = tf.extractfile(member).read().decode()
    msg = email.parser.Parser().parsestr(text)
    return {"name": msg["Name"], "version": msg["Version"], "requires_python": msg["Requires-Python"]}


def check_dists(package: str, version: str, dists: list[str], report: Report) -> None:
    for path in dists:
        kind = "wheel" if path.endswith(".whl") else "sdist"
        meta = dist_metadata(path)
        ok = meta["name"] == package and meta["version"] == version and bool(meta["requires_python"])
        report.add(package, f"{kind} name/version", ok,
                   f"{os.path.basename(path)}: {meta['name']} {meta['version']}, "
                   f"Requires-Python {meta['requires_python']}; _version.py says {version}")
    if shutil.which("twine") is None and subprocess.run([sys.executable, "-m", "twine", "--version"],
                                                        capture_output=True).returncode != 0:
        report.add(package, "twine check", False, "twine is not installed: pip install twine (nox installs it)")
        return
    rc, out = run([sys.executable, "-m", "twine", "check", "--strict", *dists])
    report.add(package, "twine check --strict", rc == 0,
               "PASSED for sdist and wheel" if rc == 0 else out.strip()[-600:])


def clean_env() -> dict:
    """The environment for the clean venv: no pip or Python settings of the caller, no Iris mode."""
    drop = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "TRITON_INTERPRET", "IRIS_BACKEND")
    env = {k: v for k, v in os.environ.items() if k not in drop and not k.startswith("PIP_REQUIRE")}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


IMPORT_PROBE = """
import importlib, json, sys
mod = importlib.import_module({module!r})
loaded = sorted({{m.split(".")[0] for m in sys.modules if m.split(".")[0] in ("torch", "mpi4py")}})
print(json.dumps({{"file": mod.__file__, "version": mod.__version__, "loaded": loaded}}))
"""


def install_and_import(package: str, version: str, wheel: str, sibling_wheels: list[str], workdir: str,
                       report: Report) -> None:
    """A fresh venv, the wheel and its declared dependencies only, then ``import iris.<name>``."""
    venv = os.path.join(workdir, "venv-" + package)
    rc, out = run([sys.executable, "-m", "venv", venv])
    if not report.add(package, "clean venv", rc == 0, f"python -m venv {venv}" if rc == 0 else out[-500:]):
        return
    python = os.path.join(venv, "bin", "python")
    constraints = [*CONSTRAINTS, newest_triton_constraints()]
    # The siblings as files on the command line: pip takes them for those names (they are not on
    # an index), and refuses them when the declared range does not admit their version.
    cmd = [python, "-m", "pip", "install", "--quiet", "--report", os.path.join(workdir, f"{package}-report.json"),
           *(a for c in constraints for a in ("-c", os.path.join(ROOT, c))), wheel, *sibling_wheels,
           *USER_PROVIDED.get(package, [])]
    rc, out = run(cmd, env=clean_env(), timeout=1800)
    given = ", ".join([*(os.path.basename(w) for w in [wheel, *sibling_wheels]), *USER_PROVIDED.get(package, [])])
    if not report.add(package, "install wheel + declared deps", rc == 0,
                      f"pip install {given} -c {' -c '.join(constraints)}" if rc == 0 else out.strip()[-900:]):
        return
    with open(os.path.join(workdir, f"{package}-report.json")) as f:
        installed = {i["metadata"]["name"].lower(): i["metadata"]["version"] for i in json.load(f)["install"]}
    names = ", ".join(f"{n} {v}" for n, v in sorted(installed.items()))
    if package == "iris-device":
        bad = sorted(set(installed) & FORBIDDEN_FOR_DEVICE)
        report.add(package, "installs no torch/mpi4py/runtime", not bad,
                   f"installed: {names}" + (f"; FORBIDDEN: {bad}" if bad else ""))
    else:
        stand_ins = USER_PROVIDED.get(package, [])
        report.add(package, "installed", True, names + (f" ({', '.join(stand_ins)}: the MPI the docs leave to the "
                                                         "user, from PyPI)" if stand_ins else ""))
    rc, out = run([python, "-m", "pip", "check"], env=clean_env())
    report.add(package, "pip check", rc == 0, out.strip().splitlines()[-1] if out.strip() else f"exit {rc}")
    module = f"iris.{module_name(package)}"
    # Run from the work folder, not the checkout: the import must find the installed wheel.
    rc, out = run([python, "-c", IMPORT_PROBE.format(module=module)], cwd=workdir, env=clean_env(), timeout=300)
    try:
        probe = json.loads(out.strip().splitlines()[-1])
    except (ValueError, IndexError):
        report.add(package, f"import {module}", False, f"exit {rc}: {out.strip()[-900:]}")
        return
    ok = rc == 0 and probe["file"].startswith(venv) and probe["version"] == version
    detail = f"{module} {probe['version']} from {os.path.relpath(probe['file'], venv)} in the clean venv"
    if package == "iris-device":
        ok = ok and not probe["loaded"]
        detail += "; loaded " + (", ".join(probe["loaded"]) if probe["loaded"] else "no torch or mpi4py")
    report.add(package, f"import {module}", ok, detail)


def check_tag(package: str, version: str, report: Report) -> str:
    """The tag to create; a tag that exists already must name HEAD (else the version needs a bump)."""
    tag = f"{package}-v{version}"
    rc, out = run(["git", "-C", ROOT, "rev-parse", "-q", "--verify", f"refs/tags/{tag}^{{commit}}"])
    if rc != 0:
        report.add(package, "tag is new", True, f"{tag} does not exist yet")
        return tag
    _, head = run(["git", "-C", ROOT, "rev-parse", "HEAD"])
    same = out.strip() == head.strip()
    report.add(package, "tag is new", same, f"{tag} already names HEAD" if same else
               f"{tag} exists at {out.strip()[:12]}, not HEAD: bump _version.py and add its CHANGELOG section")
    return tag


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("package", choices=compat.PACKAGES)
    parser.add_argument("--outdir", default=os.path.join(ROOT, "dist"),
                        help="where <package>/ gets the sdist and wheel")
    parser.add_argument("--no-isolation", action="store_true",
                        help="build with the installed setuptools (a machine without an index)")
    args = parser.parse_args(argv)
    package, report = args.package, Report()
    version = compat.version_of(package)
    print(f"release {package} {version} ...", flush=True)

    check_changelog(package, version, report)
    for problem in compat.range_problems():
        report.add("repository", "sibling ranges", False, problem)
    outdir = os.path.join(os.path.abspath(args.outdir), package)
    shutil.rmtree(outdir, ignore_errors=True)
    with tempfile.TemporaryDirectory(prefix="iris-release-") as workdir:
        dists, how = build_dists(copy_package(package, workdir), outdir, isolation=not args.no_isolation)
        if report.add(package, "sdist + wheel build", bool(dists),
                      f"{', '.join(os.path.basename(d) for d in dists)} ({how})" if dists else how):
            check_dists(package, version, dists, report)
            siblings = [s for s in compat.requirements_of(package) if s in compat.PACKAGES]
            sibling_wheels = []
            for sibling in siblings:  # wheels only: they are dependencies here, not releases
                wheel, how = check_packaging.build_wheel(copy_package(sibling, workdir),
                                                         os.path.join(workdir, "wheels-" + sibling))
                if report.add(package, f"sibling wheel {sibling}", wheel is not None,
                              os.path.basename(wheel) if wheel else how):
                    sibling_wheels.append(wheel)
            if len(sibling_wheels) == len(siblings):
                wheel = next(d for d in dists if d.endswith(".whl"))
                print(f"installing {os.path.basename(wheel)} into a clean venv ...", flush=True)
                install_and_import(package, version, wheel, sibling_wheels, workdir, report)
    tag = check_tag(package, version, report)
    report.print()
    failed = report.failed
    print(f"\n{len(report.rows) - len(failed)} passed, {len(failed)} failed")
    if failed:
        print(f"\n{package} {version} is not ready: fix the failed checks above.")
        return 1
    rel = os.path.relpath(outdir, ROOT)
    print(f"\n{package} {version} is ready. Nothing was tagged or uploaded; to release it:\n"
          f"  git tag -a {tag} -m '{package} {version}' && git push origin {tag}\n"
          f"  python -m twine upload {rel}/*")
    return 0


if __name__ == "__main__":
    sys.exit(main())
