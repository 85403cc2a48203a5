"""Misuse fails at interpretation time with a message (never a wrong answer), under Triton's
interpreter; the interpreter's own limits (fp16/bf16 atomics) are reported as
IrisUnsupportedError; bad ranks and addresses outside the heap reached on another rank are refused by
default, naming the kernel argument; and IRIS_DEBUG=1 stops bad ranks and addresses with rank, peer and
offset.
One child process per mode, on a fake two-rank heap (see device_interp_checks.py). The compiled
(GPU) side of the same errors is in test_device_gpu_compile.py."""

from __future__ import annotations

import pytest
from device_test_tables import ERROR_CASES, ERROR_EXPECT
from iris_device_testlib import child_env, run_json_script

DEBUG_VALID_OPS = ("load", "store", "get", "put", "copy", "atomic_add", "atomic_cas", "free_store", "translate",
                   "translate_lanes")


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
    assert result["raised"] and result["type"] == result["raised_as"] == "NotOnHeapError", result
    assert result["message"].startswith(f"iris debug: {call}: rank 0, peer 1: "), result
    if case == "outside_heap":  # a plain tensor: the launch names the kernel's argument
        assert "argument 'x' of debug_kernel (a float32 tensor of shape (64,)) is not on the symmetric heap" in \
            result["message"], result
    else:
        assert f"first at heap offset {debug['first_bad_offset']} " in result["message"], result
    assert "ctx.zeros()" in result["message"], result


# Without IRIS_DEBUG: the interpreter's default check (iris.device._heap_check).

def test_default_checks_pass_valid_accesses_and_a_plain_tensor_of_this_rank(interpreted):
    off_heap = interpreted["off_heap"]
    assert sorted(off_heap["valid"]) == sorted(DEBUG_VALID_OPS)
    for op, result in off_heap["valid"].items():
        assert not result["raised"], (op, result)
    assert not off_heap["masked_past_end_is_fine"]["raised"], off_heap["masked_past_end_is_fine"]
    assert not off_heap["plain_tensor_own_rank"]["raised"], off_heap["plain_tensor_own_rank"]


@pytest.mark.parametrize("case,call", [("plain_tensor_store", "iris.device.store"),
                                       ("plain_tensor_atomic", "iris.device.atomic_add")])
def test_a_plain_tensor_reached_on_another_rank_is_one_line_naming_call_rank_tensor_and_fix(interpreted, case, call):
    # one NotOnHeapError, raised as itself (not inside the interpreter's wrapping), on one line
    result = interpreted["off_heap"][case]
    assert result["raised"] and result["raised_as"] == result["type"] == "NotOnHeapError", result
    assert result["message"] == (
        f"{call}: rank 0, peer 1: argument 'x' of debug_kernel (a float32 tensor of shape (64,)) is not on the "
        f"symmetric heap, and another rank reaches only memory on the heap: allocate the tensor with ctx.zeros() "
        f"(or another factory of the Iris context: ctx.empty(), ctx.full(), ...)"), result


def test_an_address_past_the_heap_names_its_offset(interpreted):
    off_heap = interpreted["off_heap"]
    result = off_heap["past_heap_end"]
    assert result["raised"] and result["raised_as"] == "NotOnHeapError", result
    assert result["message"].startswith("iris.device.get: rank 0, peer 1: 16 address(es) outside the symmetric "
                                        f"heap, first at heap offset {off_heap['first_bad_offset']} "), result


@pytest.mark.parametrize("case,call,peer", [("bad_peer", "iris.device.load", 77),
                                            ("negative_peer", "iris.device.store", -1)])
def test_a_rank_out_of_range_is_refused_by_default(interpreted, case, call, peer):
    result = interpreted["off_heap"][case]
    assert result["raised"] and result["raised_as"] == "IrisUsageError", result
    assert result["message"].startswith(f"{call}: rank 0, peer {peer}: a rank is outside [0, 2)"), result


def test_debug_context_mismatch(interpreted_debug):
    result = interpreted_debug["debug"]["context_mismatch"]
    assert result["raised"], result
    assert "DeviceContext.initialize(rank=1, world_size=2)" in result["message"]
    assert "(rank 0, world_size 2)" in result["message"]


@pytest.mark.parametrize("mode", ["default", "debug"])
def test_a_block_of_peers_is_checked_lane_by_lane(interpreted, interpreted_debug, mode):
    # translate() with a rank per lane (even lanes the peer, odd lanes this rank): the lanes bound
    # for another rank are checked as a scalar peer's would be, and the bad peer is the one named
    results = interpreted["off_heap"] if mode == "default" else interpreted_debug["debug"]
    head = ("" if mode == "default" else "iris debug: ") + "iris.device.translate: rank 0, peer "
    bad = results["lanes_bad_peer"]
    assert bad["raised"] and bad["type"] == "IrisUsageError", bad
    assert bad["message"].startswith(f"{head}77: a rank is outside [0, 2)"), bad
    past = results["lanes_past_heap_end"]
    assert past["raised"] and past["type"] == "NotOnHeapError", past
    assert past["message"].startswith(f"{head}1: "), past
    if mode == "default":  # this rank's lanes are not translated: only the peer's 8 of 16 count
        assert past["message"].startswith(f"{head}1: 8 address(es) outside the symmetric heap"), past
