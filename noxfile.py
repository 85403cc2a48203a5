"""Sessions: one test session per package, the cross-package multi-rank suite, the mutations
(promises broken on purpose), lint, packaging, docs and the demo (the main job). ``nox`` alone
runs all of them but the demo."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import nox

nox.options.default_venv_backend = "venv"
nox.options.sessions = ["lint", "tests", "multirank", "mutations", "packaging", "docs"]
nox.options.error_on_missing_interpreters = True

PACKAGES = ["iris-device", "iris-runtime", "iris-collectives"]
CONSTRAINTS = "constraints/cpu-test.txt"
# Third-party packages of the CPU test environment (versions pinned in CONSTRAINTS, Triton and numpy
# in one constraints/triton-<X.Y>.txt per tested Triton line).
TEST_DEPS = ["torch", "mpich", "mpi4py", "pytest"]


#: The oldest CPython the packages admit (requires-python) and the newest this kind of machine can
#: install (pyenv's builds in its image; 3.14 is not to be had from PyPI or Debian 12). CI's own
#: Python (3.11) runs every other session.
PYTHONS = ["3.10", "3.13"]


#: ``IRIS_NOX_DROP_ENVS=1`` removes each session's environment when the session ends, so that a
#: full run holds one at a time (about 1.8 GB with torch and Triton) instead of ten: CI sets it, on
#: machines whose disk would not hold them all. Unset, nox keeps them (``nox -r`` reuses them).
DROP_ENVS = os.environ.get("IRIS_NOX_DROP_ENVS", "") not in ("", "0")


def one_env_at_a_time(func: Callable[..., None]) -> Callable[..., None]:
    """Session decorator (innermost): with ``DROP_ENVS``, the session's venv is deleted when it ends,
    passed or failed."""

    @functools.wraps(func)
    def run(session: nox.Session, *args: object, **kwargs: object) -> None:
        try:
            func(session, *args, **kwargs)
        finally:
            location = getattr(session.virtualenv, "location", None)
            if DROP_ENVS and location and Path(location).is_dir():
                shutil.rmtree(location, ignore_errors=True)
                session.log(f"removed {location} (IRIS_NOX_DROP_ENVS)")

    return run


def _version_key(line: str) -> tuple[int, ...]:
    return tuple(int(part) for part in line.split("."))


#: Tested Triton lines, oldest first: {"3.6": "constraints/triton-3.6.txt", ...}. The lowest is the
#: GPU machine's; the newest is the newest release the packages admit. CI runs the first and last.
TRITON_PINS = dict(sorted(((path.stem.removeprefix("triton-"), str(path))
                           for path in Path("constraints").glob("triton-*.txt")),
                          key=lambda item: _version_key(item[0])))
TRITON_LOWEST, TRITON_NEWEST = next(iter(TRITON_PINS)), next(reversed(TRITON_PINS))
TRITONS = sorted({TRITON_LOWEST, TRITON_NEWEST}, key=_version_key)


def triton_choice(session: nox.Session, default: str) -> tuple[list[str], list[str]]:
    """What to install for Triton (and numpy, which its interpreter needs), and the posargs left.

    ``-- --triton=X.Y`` takes a tested line's pins, ``--triton=3.8.0`` that exact release (numpy
    newest, which Triton 3.6's interpreter cannot use: take ``--triton=3.6`` for that line),
    ``--triton=latest`` the newest Triton on the index: how to try a release before adding its
    constraints file and widening the packages' range.
    """
    choice, rest = default, []
    for arg in session.posargs:
        if arg.startswith("--triton="):
            choice = arg.split("=", 1)[1]
        else:
            rest.append(arg)
    if choice in TRITON_PINS:
        return ["-c", TRITON_PINS[choice], "triton", "numpy"], rest
    if choice == "latest":
        return ["--upgrade", "triton", "numpy"], rest
    if not all(part.isdigit() for part in choice.split(".")):
        session.error(f"--triton={choice}: give a version (3.8.0), a tested line ({', '.join(TRITON_PINS)}) or latest")
    return [f"triton=={choice}", "numpy"], rest


def install(session: nox.Session, *packages: str, triton: str = TRITON_LOWEST,
            extra: tuple[str, ...] = ()) -> list[str]:
    """Install the pinned CPU environment with the chosen Triton, then our packages from their
    folders (no deps: the siblings come from here, not from an index). Returns the posargs that
    are not ``--triton=``."""
    triton_args, rest = triton_choice(session, triton)
    session.install("-c", CONSTRAINTS, *TEST_DEPS, *extra, *triton_args)
    session.install("--no-deps", *(f"packages/{p}" for p in packages))
    session.run("python", "-c", "import numpy, torch, triton; "
                "print(f'triton {triton.__version__}, torch {torch.__version__}, numpy {numpy.__version__}')")
    return rest


def pytest(session: nox.Session, *args: str, posargs: list[str], triton: str | None = None) -> None:
    # Exit code 5 means no test was collected: legitimate for a filtered run (e.g. -k).
    env, select = {}, []
    if triton == TRITON_LOWEST and len(TRITONS) > 1 and not session.posargs:
        # CI time: what does not depend on Triton's version (tests marked ``once``: faults, crashes,
        # torchrun, litmus, stress) runs on the newest line only, and the multi-rank suites run at
        # 2 ranks on the lowest (every world size, 1 to 4, on the newest: the world size is a
        # constexpr of the same interpreted code on both lines), but for one small 3-rank launch of
        # the promises that need three ranks (the order of a sum: test_promises_multirank.py).
        # Any posargs (or -- --triton=) run everything.
        env["IRIS_TEST_WORLD_SIZES"] = os.environ.get("IRIS_TEST_WORLD_SIZES", "2")
        select = ["-m", "not once"]
    # --durations: CI's log says which tests to look at when the suite nears its time budget
    session.run("pytest", "--durations=15", *args, *select, *posargs, env=env, success_codes=[0, 5])


@nox.session
@nox.parametrize("package, triton", [(p, t) for t in TRITONS for p in PACKAGES],
                 ids=[f"{p}, triton-{t}" for t in TRITONS for p in PACKAGES])
@one_env_at_a_time
def tests(session: nox.Session, package: str, triton: str) -> None:
    """The tests of one package, on the cpu backend (Triton's interpreter, shared memory)."""
    # iris-device's network-path compile checks link NVSHMEM's real device bitcode (only the
    # bitcode file of that wheel is used; no GPU is needed).
    extra = ("matplotlib", "nvidia-nvshmem-cu13") if package == "iris-device" else ("matplotlib",)
    rest = install(session, *PACKAGES, triton=triton, extra=extra)
    pytest(session, f"packages/{package}/tests", posargs=rest, triton=triton)


@nox.session
@nox.parametrize("triton", TRITONS, ids=[f"triton-{t}" for t in TRITONS])
@one_env_at_a_time
def multirank(session: nox.Session, triton: str) -> None:
    """Cross-package integration tests, the examples and the benchmarks' quick modes, several ranks each."""
    rest = install(session, *PACKAGES, triton=triton, extra=("matplotlib",))
    pytest(session, "tests", posargs=rest, triton=triton)


def expose_pyenv_pythons(versions: list[str]) -> None:
    """Let nox find ``pythonX.Y`` for CPythons that pyenv has built but not selected.

    pyenv's shims answer only for the versions ``pyenv global`` names (3.11 on this machine), so
    ``python3.10`` on PATH is a shim that fails. Each wanted version that does not run is linked
    from pyenv's newest X.Y.* build into ``.nox/_pythons``, which goes first on PATH.
    """
    root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    links = Path(".nox/_pythons").resolve()
    for version in versions:
        name = f"python{version}"
        if shutil.which(name) and subprocess.run([name, "-c", ""], capture_output=True).returncode == 0:
            continue
        builds = sorted(root.glob(f"{version}.*/bin/{name}"), key=lambda p: _version_key(p.parts[-3]))
        if not builds:
            continue  # nox reports the missing interpreter (error_on_missing_interpreters)
        links.mkdir(parents=True, exist_ok=True)
        link = links / name
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(builds[-1])
    if links.is_dir():
        os.environ["PATH"] = f"{links}{os.pathsep}{os.environ['PATH']}"


expose_pyenv_pythons(PYTHONS)


@nox.session(python=PYTHONS)
@one_env_at_a_time
def tests_python(session: nox.Session) -> None:
    """iris-device's and iris-runtime's tests on the oldest and newest CPython (not in the default
    run: torch for these comes from PyPI as its CUDA build, about 3 GB per Python, and pins
    Triton 3.7.1, so they run on that line)."""
    rest = install(session, *PACKAGES, triton="3.7")
    pytest(session, "packages/iris-device/tests", "packages/iris-runtime/tests", posargs=rest)


@nox.session
@one_env_at_a_time
def stress(session: nox.Session) -> None:
    """Nightly-style randomised stress of the collectives (not in the default run): 400 seeded cases
    at each of 2, 3 and 4 ranks on the newest tested Triton (CI's tests session runs 200 in all).
    ``-- --triton=X`` and ``IRIS_STRESS_SEED`` pick others."""
    rest = install(session, *PACKAGES, triton=TRITONS[-1])
    env = {"IRIS_STRESS_CASES": "400", "IRIS_STRESS_WORLDS": "2,3,4"}
    session.run("pytest", "packages/iris-collectives/tests/test_collectives_stress.py", *rest, env=env)


@nox.session
@one_env_at_a_time
def mutations(session: nox.Session) -> None:
    """``tools/mutations.py``: first that every mutation still applies to the source (``--check``:
    one whose text is gone fails, naming itself), then the quick subset (``--quick``, about three
    minutes): each breaks one promise in a copy of the packages and a test must fail, on the cpu
    backend with the newest tested Triton. ``-- NAME ...`` runs those mutations instead; running
    them all (``python tools/mutations.py``, about 8 minutes) also runs pytest checks: run it from
    the tests' environment."""
    session.install("-c", CONSTRAINTS, *TEST_DEPS, "-c", TRITON_PINS[TRITON_NEWEST], "triton", "numpy")
    # no install of the packages: each check imports its mutated copy (PYTHONPATH)
    session.run("python", "tools/mutations.py", "--check")
    session.run("python", "tools/mutations.py", *(session.posargs or ["--quick"]))


@nox.session
@one_env_at_a_time
def lint(session: nox.Session) -> None:
    """ruff over the whole repository."""
    session.install("ruff==0.17.6")
    session.run("ruff", "check", ".")


@nox.session
@one_env_at_a_time
def packaging(session: nox.Session) -> None:
    """Each package builds a wheel alone; iris-device needs neither torch, mpi4py nor the runtime."""
    # triton (only) for the check that iris.device imports with torch and mpi4py blocked.
    session.install("-c", CONSTRAINTS, "-c", TRITON_PINS[TRITON_LOWEST], "build", "pip", "triton", "numpy")
    session.run("python", "tools/check_packaging.py", *PACKAGES)


@nox.session
@nox.parametrize("package", PACKAGES, ids=PACKAGES)
@one_env_at_a_time
def release(session: nox.Session, package: str) -> None:
    """Prepare one package's release (not in the default run): sdist and wheel, twine check, the
    CHANGELOG section of its version, the wheel in a clean venv with its declared dependencies,
    and the tag to create. Creates no tag, uploads nothing; the files go to dist/<package>/."""
    session.install("build", "twine")
    session.run("python", "tools/release.py", package, *session.posargs)


def ensure_browser(session: nox.Session) -> None:
    """Headless Chromium for the layout check: Debian's, installed by apt-get when it is missing.

    apt-get needs root; CI runs .ci/run as root on a fresh machine, so there it installs itself.
    """
    if any(shutil.which(name) for name in ("chromium", "chromium-browser", "google-chrome")):
        return
    if not shutil.which("apt-get") or os.geteuid() != 0:
        session.error("docs: the layout check needs a headless Chromium and this is not root with apt-get: "
                      "install one (Debian: sudo apt-get install -y chromium fonts-liberation) and run again")
    env = {"DEBIAN_FRONTEND": "noninteractive"}
    session.run("apt-get", "update", "-q", external=True, env=env)
    # fonts-liberation: the theme's monospace font (Liberation Mono) makes the widths the same everywhere.
    session.run("apt-get", "install", "-y", "-q", "chromium", "fonts-liberation", external=True, env=env)


@nox.session
@one_env_at_a_time
def docs(session: nox.Session) -> None:
    """Build the documentation with warnings as errors, run every code block it shows, and check
    in headless Chromium at 1366x900 that no code block scrolls sideways."""
    install(session, *PACKAGES, extra=("matplotlib",))
    session.install("sphinx==9.0.4", "myst-parser==5.2.0", "pydata-sphinx-theme==0.24.0")
    session.run("python", "docs/run_code_blocks.py")
    session.run("sphinx-build", "-W", "--keep-going", "-b", "html", "docs", "docs/_build/html")
    ensure_browser(session)
    session.run("python", "tools/check_docs_layout.py", "docs/_build/html", "--width", "1366", "--height", "900",
                "--screenshot", "collectives")


@nox.session
@one_env_at_a_time
def demo(session: nox.Session) -> None:
    """The main job: 4 ranks on whatever this machine has (GPU if usable, else the CPU)."""
    rest = install(session, *PACKAGES)
    session.run("python", "examples/run.py", "-n", "4", *rest)
