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
    from iris.runtime.testing import launcher

    script = opts.example if os.path.isabs(opts.example) else os.path.join(HERE, opts.example)
    extra = opts.args[1:] if opts.args[:1] == ["--"] else opts.args
    cmd = launcher() + ["-n", str(opts.n), sys.executable, "-m", "mpi4py", script, *extra]
    print("$", " ".join(cmd), flush=True)
    return subprocess.call(cmd)


if __name__ == "__main__":
    sys.exit(main())
