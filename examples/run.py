"""Run an example on N ranks with the MPI that is installed: ``python examples/run.py -n 4 [name]``.

The default example is the flagship (the README's main job). Extra arguments after ``--`` go to
the example.
"""

import argparse
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
FLAGSHIP = "02_gemm_all_reduce.py"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=4, help="number of ranks")
    parser.add_argument("example", nargs="?", default=FLAGSHIP, help="file in examples/")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the example")
    opts = parser.parse_args()
    # This process only launches the job; it must not be an MPI process itself. Importing
    # iris.runtime imports mpi4py.MPI, which would initialise MPI here, and under Open MPI that
    # sets environment variables that make the nested mpiexec exit 1 without a word.
    import mpi4py

    mpi4py.rc.initialize = mpi4py.rc.finalize = False
    from iris.runtime.testing import launcher

    script = opts.example if os.path.isabs(opts.example) else os.path.join(HERE, opts.example)
    extra = opts.args[1:] if opts.args[:1] == ["--"] else opts.args
    cmd = launcher() + ["-n", str(opts.n), sys.executable, "-m", "mpi4py", script, *extra]
    print("$", " ".join(cmd), flush=True)
    # os.environ is Python's copy of the environment as it started: whatever a library set at the
    # C level since (MPI does, when it initialises) does not reach the job.
    return subprocess.call(cmd, env=dict(os.environ))


if __name__ == "__main__":
    sys.exit(main())
