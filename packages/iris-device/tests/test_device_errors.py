"""Misuse fails at interpretation time with a message (never a wrong answer), under Triton's
interpreter; the interpreter's own limits (fp16/bf16 atomics) are reported as
IrisUnsupportedError; and IRIS_DEBUG=1 stops bad ranks and addresses with rank, peer and offset.
One child process per mode, on a fake two-rank heap (see device_interp_checks.py). The compiled
(GPU) side of the same errors is in test_device_gpu_compile.py."""

from __future__ import annotations

import pytest
from device_test_tables import ERROR_CASES, ERROR_EXPECT
from iris_device_testlib import child_env, run_json_script

DEBUG_VALID_OPS = ("load", "store", "get", "put", "copy", "atomic_add", "atomic_cas", "free_store", "translate")


@pytest.fixture(scope="module")
def interpreted():
    return run_json_script("device_interp_checks.py", env=child_env(interpret=True), timeout=300)


@pytest.fixture(scope="module")
def interpreted_debug():
    return run_json_script("device_interp_checks.py", "--only", "debug", env=child_env(interpret=True, debug=True),
                           timeout=300)


@pytest.mark.parametrize("case", ERROR_CASES)
def test_interpreter_errors_name_the_fix(interpreted, case):
    result = interpreted["errors"][case]
    assert result["raised"], f"{case} ran without an error"
    kind, fragments = ERROR_EXPECT[case]
    assert result["type"] == kind and result["iris_error"], result
    for fragment in fragments:
        assert fragment in result["message"], (fragment, result["message"])


@pytest.mark.parametrize("case", ["add_fp16", "sub_fp16", "free_add_fp16", "add_bf16", "cas_bf16", "free_cas_bf16"])
def test_interpreter_half_precision_atomics_are_refused(interpreted, case):
    result = interpreted["unsupported"][case]
    op, dtype = case.removeprefix("free_").split("_")
    assert result["raised"] and result["type"] == "IrisUnsupportedError", result
    message = result["message"]
    assert f"iris.device.atomic_{op} on {dtype} pointers" in message
    assert "CPU backend" in message and "interpreter" in message and "cuda backend" in message, message


def test_interpreter_fp16_cas_touches_two_bytes_only(interpreted):
    # Lanes 0 and 2 match their cmp and are swapped; 1 and 3 do not; the -4.0 between them survive.
    assert interpreted["fp16_cas"]["target"] == [2.5, -4.0, 1.5, -4.0, 4.5, -4.0, 1.5, -4.0]
    assert interpreted["fp16_cas"]["olds"] == [1.5, 1.5, 1.5, 1.5]


def test_debug_passes_valid_accesses(interpreted_debug):
    valid = interpreted_debug["debug"]["valid"]
    assert sorted(valid) == sorted(DEBUG_VALID_OPS)
    for op, result in valid.items():
        assert not result["raised"], (op, result)
    assert not interpreted_debug["debug"]["masked_past_end_is_fine"]["raised"]


@pytest.mark.parametrize("case,call,peer", [("bad_peer", "iris.device.load", 77),
                                            ("negative_peer", "iris.device.atomic_add", -1),
                                            ("free_bad_peer", "iris.device.store", 5)])
def test_debug_rank_out_of_range(interpreted_debug, case, call, peer):
    result = interpreted_debug["debug"][case]
    assert result["raised"] and result["type"] == "IrisUsageError", result
    assert result["message"].startswith(f"iris debug: {call}: rank 0, peer {peer}: a rank is outside [0, 2)"), result


@pytest.mark.parametrize("case,call", [("outside_heap", "iris.device.store"), ("past_heap_end", "iris.device.get"),
                                       ("cas_past_heap_end", "iris.device.atomic_cas"),
                                       ("translate_past_heap_end", "iris.device.translate")])
def test_debug_address_outside_heap(interpreted_debug, case, call):
    debug = interpreted_debug["debug"]
    result = debug[case]
    assert result["raised"] and result["type"] == "IrisUsageError", result
    offset = debug["outside_offset"] if case == "outside_heap" else debug["first_bad_offset"]
    assert f"iris debug: {call}: rank 0, peer 1: " in result["message"], result
    assert f"first at heap offset {offset} " in result["message"], result


def test_debug_context_mismatch(interpreted_debug):
    result = interpreted_debug["debug"]["context_mismatch"]
    assert result["raised"], result
    assert "DeviceContext.initialize(rank=1, world_size=2)" in result["message"]
    assert "(rank 0, world_size 2)" in result["message"]
