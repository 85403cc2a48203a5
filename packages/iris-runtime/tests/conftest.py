"""Fixtures of the iris-runtime tests (helpers live in runtime_test_helpers.py)."""

from __future__ import annotations

import pytest
from runtime_test_helpers import remove_dead_mpich_segments, shm_listing


@pytest.fixture
def mpich_leftovers():
    """Cleans up after a test whose MPI job is aborted on purpose (see remove_dead_mpich_segments)."""
    before = shm_listing()
    yield
    remove_dead_mpich_segments(before)
