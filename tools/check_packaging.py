"""Packaging checks: each package builds a wheel alone, the wheels are right, and iris-device
stays free of torch, mpi4py and the runtime.

    python tools/check_packaging.py iris-device iris-runtime iris-collectives [--no-network]

For each package (a folder under packages/), on a copy of the folder so the source tree stays clean:
- builds a wheel alone (``python -m build --wheel``, or ``pip wheel --no-deps`` without ``build``);
- checks the wheel: ``py.typed`` and ``_version.py`` present (and the version matches the wheel's),
  every file of the sources other than Python (data such as ``ccl/tables/*.json``) present,
  no ``iris/__init__.py`` (``iris`` is a PEP 420 namespace), nothing outside ``iris/<name>/``;
- checks METADATA: iris-device requires triton (and numpy) only; a sibling (``iris-*``) requirement is a range
  such as ``>=0.1,<0.2`` that admits the sibling's current version, never ``==``; the Triton range
  admits every release pinned in ``constraints/triton-*.txt`` and not the minor release after the
  newest of them.
For iris-device, also:
- ``pip install --dry-run --report`` of the package folder in a fresh venv (needs the network to
  PyPI; ``--no-network`` skips it) must not install torch, mpi4py or iris-runtime, and the Triton
  it picks (the newest the range admits) must be a tested line;
- ``import iris.device`` from the wheel's files works with torch and mpi4py blocked, and without
  the block it imports neither (nor iris.runtime).
For the repository: the compatibility table in docs/release-notes.md is the one
``tools/compat.py`` generates from the versions and declared ranges (stale: run
``python tools/compat.py --write``), and every declared sibling range admits the sibling's version.

Prints a table; exits 1 when any check fails.
"""

from __future__ import annotations

import argparse
import email.parser
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
import zipfile
from dataclasses import dataclass, field

try:
    from packaging.requirements import Requirement
    from packaging.version import Version
except ImportError:  # pip always vendors it
    from pip._vendor.packaging.requirements import Requirement
    from pip._vendor.packaging.version import Version

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = os.path.join(ROOT, "packages")
#: What ``pip install iris-device`` must never bring in.
FORBIDDEN_FOR_DEVICE = {"torch", "mpi4py", "iris-runtime", "iris-collectives"}
#: The only unconditional dependencies iris-device may have.
#: numpy: Triton's interpreter, which ``import iris.device`` turns on without a GPU, imports it.
DEVICE_ALLOWED = {"triton", "numpy"}


@dataclass
class Report:
    rows: list[tuple[str, str, bool, str]] = field(default_factory=list)

    def add(self, package: str, check: str, ok: bool, detail: str = "") -> bool:
        self.rows.append((package, check, ok, detail))
        return ok

    @property
    def failed(self) -> list[tuple[str, str, bool, str]]:
        return [r for r in self.rows if not r[2]]

    def print(self) -> None:
        widths = [max(len(r[i]) for r in self.rows + [("package", "check", True, "")]) for i in (0, 1)]
        print(f"\n{'package':<{widths[0]}}  {'check':<{widths[1]}}  result  detail")
        print(f"{'-' * widths[0]}  {'-' * widths[1]}  ------  ------")
        for package, check, ok, detail in self.rows:
            first, *rest = textwrap.wrap(detail, 100) or [""]
            print(f"{package:<{widths[0]}}  {check:<{widths[1]}}  {'ok' if ok else 'FAIL':<6}  {first}")
            for line in rest:
                print(f"{'':<{widths[0]}}  {'':<{widths[1]}}  {'':<6}  {line}")


def run(cmd: list[str], cwd: str | None = None, env: dict | None = None, timeout: float = 900) -> tuple[int, str]:
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    return proc.returncode, proc.stdout + proc.stderr


def module_name(package: str) -> str:
    """``iris-device`` -> ``device`` (the folder under the ``iris`` namespace)."""
    return package.removeprefix("iris-").replace("-", "_")


def copy_package(package: str, workdir: str) -> str:
    """A clean copy of packages/<package> (builds write build/ and *.egg-info next to the sources)."""
    dest = os.path.join(workdir, "src-" + package)
    shutil.copytree(os.path.join(PACKAGES, package), dest,
                    ignore=shutil.ignore_patterns("build", "dist", "*.egg-info", "__pycache__", ".pytest_cache"))
    return dest


def build_wheel(source: str, outdir: str) -> tuple[str | None, str]:
    if importlib.util.find_spec("build") is not None:
        cmd = [sys.executable, "-m", "build", "--wheel", "--outdir", outdir, source]
    else:
        cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--wheel-dir", outdir, source]
    rc, out = run(cmd)
    wheels = [f for f in os.listdir(outdir) if f.endswith(".whl")] if os.path.isdir(outdir) else []
    if rc != 0 or len(wheels) != 1:
        return None, f"{' '.join(cmd[2:4])} exited {rc}: {out[-800:]}"
    return os.path.join(outdir, wheels[0]), " ".join(cmd[2:4])


def data_files(package: str) -> list[str]:
    """The files of ``packages/<package>/src/iris/<name>/`` other than Python, as the wheel names
    them (``iris/collectives/ccl/tables/fallback.json``)."""
    src = os.path.join(PACKAGES, package, "src")
    found = []
    for folder, dirs, files in os.walk(os.path.join(src, "iris", module_name(package))):
        dirs[:] = [d for d in dirs if d != "__pycache__" and not d.endswith(".egg-info")]
        found += [os.path.relpath(os.path.join(folder, f), src).replace(os.sep, "/") for f in files
                  if not f.endswith((".py", ".pyc"))]
    return sorted(found)


def check_wheel(package: str, wheel: str, versions: dict[str, str], report: Report) -> None:
    sub = module_name(package)
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        dist_info = next((n.split("/")[0] for n in names if n.split("/")[0].endswith(".dist-info")), None)
        metadata = zf.read(f"{dist_info}/METADATA").decode() if dist_info else ""
        version_src = zf.read(f"iris/{sub}/_version.py").decode() if f"iris/{sub}/_version.py" in names else ""
    name = os.path.basename(wheel)
    wheel_version = name.split("-")[1]

    report.add(package, "py.typed", f"iris/{sub}/py.typed" in names, f"iris/{sub}/py.typed")
    match = re.search(r"""__version__\s*=\s*["']([^"']+)["']""", version_src)
    report.add(package, "_version.py", bool(match) and match.group(1) == wheel_version,
               f"iris/{sub}/_version.py says {match.group(1) if match else 'nothing'}, wheel {wheel_version}")
    report.add(package, "PEP 420 namespace", "iris/__init__.py" not in names,
               "no iris/__init__.py" if "iris/__init__.py" not in names else "the wheel ships iris/__init__.py")
    stray = [n for n in names if not (n.startswith(f"iris/{sub}/") or n.startswith(f"{dist_info}/"))]
    report.add(package, "contents", not stray, f"{len(names)} files under iris/{sub}/ and {dist_info}"
               if not stray else f"files outside iris/{sub}/: {stray[:5]}")
    # data the code reads at run time (ccl/tables/*.json) ships too: package-data in pyproject.toml
    data = data_files(package)
    missing = [n for n in data if n not in names]
    report.add(package, "data files", not missing, f"{len(data)} files besides Python" if not missing
               else f"not in the wheel: {missing[:5]} (add them to [tool.setuptools.package-data])")

    requires = email.parser.Parser().parsestr(metadata).get_all("Requires-Dist") or []
    reqs = [Requirement(r) for r in requires]
    unconditional = [r for r in reqs if r.marker is None or "extra" not in str(r.marker)]
    if package == "iris-device":
        names_required = {r.name.lower() for r in unconditional}
        report.add(package, "requires triton, numpy only", names_required <= DEVICE_ALLOWED,
                   ", ".join(str(r) for r in unconditional) or "nothing")
    siblings = [r for r in reqs if r.name.lower().startswith("iris-")]
    for req in siblings:
        spec = req.specifier
        ops = {s.operator for s in spec}
        current = versions.get(req.name.lower())
        ranged = ">=" in ops and "<" in ops and not ops & {"==", "===", "~="}
        admits = current is not None and Version(current) in spec
        where = f" ({req.marker})" if req.marker else ""
        report.add(package, f"range on {req.name}", ranged and admits,
                   f"{req.name}{spec}{where}; {req.name} is {current}" + ("" if ranged else "; use >=X.Y,<X.Y+1"))
    if package != "iris-device" and not siblings:
        report.add(package, "siblings", False, "no iris-* requirement found in METADATA")
    check_triton_range(package, unconditional, report)


def tested_tritons() -> list[Version]:
    """The Triton releases the test sessions pin, one per ``constraints/triton-<X.Y>.txt``."""
    folder = os.path.join(ROOT, "constraints")
    found = []
    for name in sorted(os.listdir(folder)):
        if name.startswith("triton-") and name.endswith(".txt"):
            with open(os.path.join(folder, name)) as f:
                found += [Version(m) for m in re.findall(r"^triton==(\S+)", f.read(), re.M)]
    return sorted(found)


def check_triton_range(package: str, requirements: list, report: Report) -> None:
    """The declared Triton range says what is tested: it admits every pinned test release and
    stops before the minor release after the newest one (a newer Triton is admitted only once it
    has a constraints file, i.e. once the sessions run on it)."""
    tested = tested_tritons()
    triton = [r for r in requirements if r.name.lower() == "triton"]
    if not triton or not tested:
        report.add(package, "triton range = tested", False,
                   f"requirement {triton or 'missing'}; tested releases {tested or 'none (constraints/triton-*.txt)'}")
        return
    spec = triton[0].specifier
    newest = tested[-1]
    next_minor = Version(f"{newest.major}.{newest.minor + 1}")
    admits_all = all(spec.contains(v, prereleases=True) for v in tested)
    ok = admits_all and not spec.contains(next_minor, prereleases=True)
    report.add(package, "triton range = tested", ok,
               f"triton{spec}; tested {', '.join(map(str, tested))}" +
               ("" if admits_all else "; a tested release is outside the range") +
               ("" if not spec.contains(next_minor) else f"; admits {next_minor}, which no session tests"))


def repo_versions() -> dict[str, str]:
    versions = {}
    for package in os.listdir(PACKAGES):
        path = os.path.join(PACKAGES, package, "src", "iris", module_name(package), "_version.py")
        if os.path.exists(path):
            with open(path) as f:
                match = re.search(r"""__version__\s*=\s*["']([^"']+)["']""", f.read())
            if match:
                versions[package] = match.group(1)
    return versions


def check_fresh_venv_resolution(source: str, workdir: str, report: Report) -> None:
    """``pip install <iris-device folder>`` in a fresh venv, as a dry run: what would it install?"""
    venv = os.path.join(workdir, "fresh-venv")
    rc, out = run([sys.executable, "-m", "venv", venv])
    if rc != 0:
        report.add("iris-device", "fresh venv install", False, f"python -m venv failed: {out[-500:]}")
        return
    python = os.path.join(venv, "bin", "python")
    report_path = os.path.join(workdir, "pip-report.json")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "PYTHON"))}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    rc, out = run([python, "-m", "pip", "install", "--dry-run", "--quiet", "--report", report_path, source], env=env)
    if rc != 0 or not os.path.exists(report_path):
        report.add("iris-device", "fresh venv install", False,
                   f"pip install --dry-run failed (network to PyPI needed; --no-network skips): {out[-800:]}")
        return
    with open(report_path) as f:
        pip_report = json.load(f)
    picked = {item["metadata"]["name"].lower(): item["metadata"]["version"] for item in pip_report.get("install", [])}
    installed = sorted(picked)
    bad = sorted(set(installed) & FORBIDDEN_FOR_DEVICE)
    report.add("iris-device", "fresh venv install", not bad and "iris-device" in installed,
               f"pip would install {', '.join(installed)}" + (f"; FORBIDDEN: {bad}" if bad else ""))
    # what a new kernel author gets: the newest Triton the range admits, which must be a tested line
    tested_lines = {(v.major, v.minor) for v in tested_tritons()}
    triton = Version(picked["triton"]) if "triton" in picked else None
    report.add("iris-device", "fresh install's triton is tested", triton is not None and
               (triton.major, triton.minor) in tested_lines,
               f"pip picks triton {triton}; tested lines {sorted(tested_lines)}")


IMPORT_PROBE = """
import sys
blocked = {blocked}
for name in ("torch", "mpi4py"):
    if blocked:
        sys.modules[name] = None  # any import of it now raises ImportError
import iris.device
assert iris.device.__file__.startswith({root!r}), iris.device.__file__
loaded = sorted(m for m in sys.modules if sys.modules[m] is not None
                and (m.split(".")[0] in ("torch", "mpi4py") or m.startswith("iris.runtime")))
print("iris.device imported; loaded " + (", ".join(loaded) if loaded else "no torch, mpi4py or iris.runtime"))
sys.exit(1 if loaded else 0)
"""


def check_import_isolation(wheel: str, workdir: str, report: Report) -> None:
    """``import iris.device`` from the wheel's own files pulls in neither torch nor mpi4py."""
    root = os.path.join(workdir, "device-wheel-files")
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(root)
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "IRIS_BACKEND")}
    env["PYTHONPATH"] = root
    for blocked, check in ((True, "import, torch/mpi4py blocked"), (False, "import loads no torch/mpi4py")):
        rc, out = run([sys.executable, "-c", IMPORT_PROBE.format(blocked=blocked, root=root)], env=env, timeout=120)
        report.add("iris-device", check, rc == 0, out.strip().splitlines()[-1] if out.strip() else f"exit {rc}")


def check_compat_table(report: Report) -> None:
    """The docs' compatibility table matches the repository (tools/compat.py says how)."""
    import compat  # tools/ is sys.path[0] when this file runs as a script

    problems = compat.check()
    report.add("repository", "compatibility table", not problems,
               "; ".join(problems) or f"{os.path.relpath(compat.DOC, ROOT)} lists the current versions and ranges")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("packages", nargs="+", help="folders under packages/, e.g. iris-device")
    parser.add_argument("--no-network", action="store_true",
                        help="skip the fresh-venv resolution of iris-device (it needs PyPI)")
    args = parser.parse_args(argv)
    report = Report()
    versions = repo_versions()
    check_compat_table(report)
    with tempfile.TemporaryDirectory(prefix="iris-packaging-") as workdir:
        for package in args.packages:
            if not os.path.isdir(os.path.join(PACKAGES, package)):
                report.add(package, "exists", False, f"no folder packages/{package}")
                continue
            print(f"building {package} ...", flush=True)
            source = copy_package(package, workdir)
            wheel, how = build_wheel(source, os.path.join(workdir, "wheels-" + package))
            if not report.add(package, "wheel builds alone", wheel is not None,
                              os.path.basename(wheel) + f" ({how})" if wheel else how):
                continue
            check_wheel(package, wheel, versions, report)
            if package == "iris-device":
                check_import_isolation(wheel, workdir, report)
                if args.no_network:
                    report.add(package, "fresh venv install", True, "SKIPPED (--no-network)")
                else:
                    print("resolving iris-device in a fresh venv ...", flush=True)
                    check_fresh_venv_resolution(source, workdir, report)
    report.print()
    failed = report.failed
    print(f"\n{len(report.rows) - len(failed)} passed, {len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
