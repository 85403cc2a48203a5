"""Sessions: one test session per package, the cross-package multi-rank suite, lint, packaging,
docs and the demo (the main job). ``nox`` alone runs all of them but the demo."""

from __future__ import annotations

import nox

nox.options.default_venv_backend = "venv"
nox.options.sessions = ["lint", "tests", "multirank", "packaging", "docs"]
nox.options.error_on_missing_interpreters = True

PACKAGES = ["iris-device", "iris-runtime", "iris-collectives"]
CONSTRAINTS = "constraints/cpu-test.txt"
# Third-party packages of the CPU test environment (versions pinned in CONSTRAINTS).
TEST_DEPS = ["torch", "triton", "numpy", "mpich", "mpi4py", "pytest"]


def install(session: nox.Session, *packages: str, extra: tuple[str, ...] = ()) -> None:
    """Install the pinned CPU environment, then our packages from their folders (no deps: the
    siblings come from here, not from an index)."""
    session.install("-c", CONSTRAINTS, *TEST_DEPS, *extra)
    session.install("--no-deps", *(f"packages/{p}" for p in packages))


def pytest(session: nox.Session, *args: str) -> None:
    # Exit code 5 means no test was collected: legitimate for a filtered run (e.g. -k).
    session.run("pytest", *args, *session.posargs, success_codes=[0, 5])


@nox.session
@nox.parametrize("package", [nox.param(p, id=p) for p in PACKAGES])
def tests(session: nox.Session, package: str) -> None:
    """The tests of one package, on the cpu backend (Triton's interpreter, shared memory)."""
    install(session, *PACKAGES, extra=("matplotlib",))
    pytest(session, f"packages/{package}/tests")


@nox.session
def multirank(session: nox.Session) -> None:
    """Cross-package integration tests, the examples and the benchmarks' quick modes, several ranks each."""
    install(session, *PACKAGES, extra=("matplotlib",))
    pytest(session, "tests")


@nox.session
def lint(session: nox.Session) -> None:
    """ruff over the whole repository."""
    session.install("ruff==0.17.6")
    session.run("ruff", "check", ".")


@nox.session
def packaging(session: nox.Session) -> None:
    """Each package builds a wheel alone; iris-device needs neither torch, mpi4py nor the runtime."""
    # triton (only) for the check that iris.device imports with torch and mpi4py blocked.
    session.install("-c", CONSTRAINTS, "build", "pip", "triton", "numpy")
    session.run("python", "tools/check_packaging.py", *PACKAGES)


@nox.session
def docs(session: nox.Session) -> None:
    """Build the documentation with warnings as errors, and run every code block it shows."""
    install(session, *PACKAGES, extra=("matplotlib",))
    session.install("sphinx==9.0.4", "myst-parser==5.2.0")
    session.run("python", "docs/run_code_blocks.py")
    session.run("sphinx-build", "-W", "--keep-going", "-b", "html", "docs", "docs/_build/html")


@nox.session
def demo(session: nox.Session) -> None:
    """The main job: 4 ranks on whatever this machine has (GPU if usable, else the CPU)."""
    install(session, *PACKAGES)
    session.run("python", "examples/run.py", "-n", "4", *session.posargs)
