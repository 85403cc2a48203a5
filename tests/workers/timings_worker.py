"""A worker for tests/test_suite_timings.py: two scenarios, the second of which ends the process
the way a deadline's kill does (no clean exit, no worker row)."""

import os

import iris.runtime.testing


def scenario_passes(ctx):
    ctx.barrier()


def scenario_is_cut(ctx):
    os._exit(3)


if __name__ == "__main__":
    iris.runtime.testing.run_scenarios(globals(), heap_size=1 << 20)
