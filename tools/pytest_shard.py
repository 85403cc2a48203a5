"""pytest plugin: run one shard of the collected tests, so that a suite longer than one time limit
runs as a few shorter runs. ``IRIS_TEST_SHARD=i/n`` (1 <= i <= n) keeps the tests of every n-th
test function, counting from the i-th, in collection order; the parametrisations of one function
(its world sizes) stay in one shard, since they take about as long as each other and a shard
holding all the largest ones would be the slowest. The shards of one n partition the suite.
``IRIS_TEST_RESUME_AT=text`` then drops the tests before the first one whose node id contains
``text`` (e.g. ``test_torch_ops_scenarios[4]``): a run that a deadline stopped goes on where it was,
with the same shard. Loaded by ``tools/gpu-tests.sh`` (``-p pytest_shard``); without the variables
it does nothing.

``IRIS_TEST_CLAIMS=<folder>`` shares the tests out at run time instead, among pytest processes
that run the same suite side by side: before each test a process claims it by creating a file
named after it in the folder (``O_CREAT | O_EXCL``: exactly one process succeeds), and runs it
only if its claim won; the others pass over it without reporting it. A process that is done with
a slow test takes the next unclaimed one, so the processes end at about the same time whatever
the tests cost (static shards of a suite whose tests take 1 to 60 s do not). Each parametrisation
is claimed on its own: a function with many cases (the fault tests have 20 and more, each a job
that ends on purpose) is spread over every process instead of holding one to the end."""

from __future__ import annotations

import hashlib
import os

import pytest
from _pytest.runner import runtestprotocol


def shard_of(value: str) -> tuple[int, int]:
    """``(i, n)`` of ``"i/n"``; raises ``pytest.UsageError`` naming the variable for anything else."""
    try:
        i, n = (int(part) for part in value.split("/"))
    except ValueError:
        i = n = 0
    if not 1 <= i <= n:
        raise pytest.UsageError(f"IRIS_TEST_SHARD={value!r}: expected i/n with 1 <= i <= n, e.g. 1/2")
    return i, n


def _function_of(item) -> tuple[str, str]:
    return item.nodeid.split("::")[0], getattr(item, "originalname", item.name)


def claim(folder: str, name: str) -> bool:
    """Whether this process won the claim on ``name`` (a test's node id) in ``folder``."""
    path = os.path.join(folder, hashlib.sha1(name.encode()).hexdigest()[:20])
    try:
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
    except FileExistsError:
        return False
    return True


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item, nextitem):
    folder = os.environ.get("IRIS_TEST_CLAIMS")
    if not folder:
        return None
    os.makedirs(folder, exist_ok=True)
    if not claim(folder, item.nodeid):
        return True  # handled (by another process), not run here
    # pytest tears down after a test only the fixtures that ``nextitem`` does not share, but the
    # test this process runs next is known only once it wins that claim: what the previous test
    # left set up for a ``nextitem`` another process took (a module's fixtures) is torn down here,
    # before this test sets up (else pytest stops: "previous item was not torn down properly").
    item.session._setupstate.teardown_exact(item)
    item.ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
    runtestprotocol(item, nextitem=nextitem, log=True)
    item.ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)
    return True


def pytest_collection_modifyitems(config, items):
    _keep_shard(config, items, os.environ.get("IRIS_TEST_SHARD", ""))
    _resume_at(config, items, os.environ.get("IRIS_TEST_RESUME_AT", ""))


def _resume_at(config, items, text: str) -> None:
    # the tests from the first whose node id contains text; raises naming the variable if none does
    if not text:
        return
    first = next((k for k, item in enumerate(items) if text in item.nodeid), None)
    if first is None:
        raise pytest.UsageError(f"IRIS_TEST_RESUME_AT={text!r}: no collected test's node id contains it (with "
                                f"IRIS_TEST_SHARD={os.environ.get('IRIS_TEST_SHARD', '')!r}); pass part of a node "
                                f"id that pytest --collect-only -q prints")
    if first:
        config.hook.pytest_deselected(items=items[:first])
        items[:] = items[first:]


def _keep_shard(config, items, value: str) -> None:
    if not value:
        return
    i, n = shard_of(value)
    functions: dict[tuple, int] = {}  # (file, function) -> its index in collection order
    for item in items:
        functions.setdefault(_function_of(item), len(functions))
    keep, drop = [], []
    for item in items:
        index = functions[_function_of(item)]
        (keep if index % n == i - 1 else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
    items[:] = keep
