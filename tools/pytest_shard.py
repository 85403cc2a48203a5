"""pytest plugin: run one shard of the collected tests, so that a suite longer than one time limit
runs as a few shorter runs. ``IRIS_TEST_SHARD=i/n`` (1 <= i <= n) keeps the tests of every n-th
test function, counting from the i-th, in collection order; the parametrisations of one function
(its world sizes) stay in one shard, since they take about as long as each other and a shard
holding all the largest ones would be the slowest. The shards of one n partition the suite.
Loaded by ``tools/gpu-tests.sh`` (``-p pytest_shard``); without the variable it does nothing."""

from __future__ import annotations

import os

import pytest


def shard_of(value: str) -> tuple[int, int]:
    """``(i, n)`` of ``"i/n"``; raises ``pytest.UsageError`` naming the variable for anything else."""
    try:
        i, n = (int(part) for part in value.split("/"))
    except ValueError:
        i = n = 0
    if not 1 <= i <= n:
        raise pytest.UsageError(f"IRIS_TEST_SHARD={value!r}: expected i/n with 1 <= i <= n, e.g. 1/2")
    return i, n


def pytest_collection_modifyitems(config, items):
    value = os.environ.get("IRIS_TEST_SHARD", "")
    if not value:
        return
    i, n = shard_of(value)
    functions: dict[tuple, int] = {}  # (file, function) -> its index in collection order
    for item in items:
        functions.setdefault((item.nodeid.split("::")[0], getattr(item, "originalname", item.name)), len(functions))
    keep, drop = [], []
    for item in items:
        index = functions[(item.nodeid.split("::")[0], getattr(item, "originalname", item.name))]
        (keep if index % n == i - 1 else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
    items[:] = keep
