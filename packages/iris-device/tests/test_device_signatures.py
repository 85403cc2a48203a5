"""Every DeviceContext method of the spec exists with exactly its parameter names, order and defaults,
and every one has its free-function twin in ``iris.device`` (DESIGN.md's signatures).

The expected table below is written out by hand so that the test runs anywhere; when the seed spec
is present (``$IRIS_SPEC`` or ``../shared/seed`` next to the checkout) the table is also checked
against the spec's own signature lines. The actual signatures are read in both kernel modes (compiled
and interpreted: the aggregate's methods are wrapped differently in each), in child processes.

Run as a script, this file prints the actual signatures of this process's mode as JSON.
"""

from __future__ import annotations

import ast
import inspect
import json
import re
import sys

import pytest

REQUIRED = "<required>"

# The spec's DeviceContext methods that iris.device provides: (parameter, default or REQUIRED).
EXPECTED_BOUND: dict[str, list[tuple[str, object]]] = {
    "initialize": [("context_tensor", REQUIRED), ("rank", REQUIRED), ("world_size", REQUIRED), ("tracing", False)],
    "load": [("pointer", REQUIRED), ("from_rank", REQUIRED), ("mask", None), ("other", None),
             ("cache_modifier", None), ("volatile", False), ("hint", None)],
    "store": [("pointer", REQUIRED), ("value", REQUIRED), ("to_rank", REQUIRED), ("mask", None),
              ("cache_modifier", None), ("hint", None)],
    "get": [("from_ptr", REQUIRED), ("to_ptr", REQUIRED), ("from_rank", REQUIRED), ("mask", None), ("other", None),
            ("load_cache_modifier", None), ("store_cache_modifier", None), ("hint", None)],
    "put": [("from_ptr", REQUIRED), ("to_ptr", REQUIRED), ("to_rank", REQUIRED), ("mask", None), ("other", None),
            ("load_cache_modifier", None), ("store_cache_modifier", None), ("hint", None)],
    "copy": [("src_ptr", REQUIRED), ("dst_ptr", REQUIRED), ("from_rank", REQUIRED), ("to_rank", REQUIRED),
             ("mask", None), ("other", None), ("load_cache_modifier", None), ("store_cache_modifier", None),
             ("hint", None)],
    "atomic_cas": [("pointer", REQUIRED), ("cmp", REQUIRED), ("val", REQUIRED), ("to_rank", REQUIRED),
                   ("sem", None), ("scope", None), ("hint", None)],
}
for _op in ("add", "sub", "xchg", "xor", "and", "or", "min", "max"):
    EXPECTED_BOUND[f"atomic_{_op}"] = [("pointer", REQUIRED), ("val", REQUIRED), ("to_rank", REQUIRED),
                                       ("mask", None), ("sem", None), ("scope", None), ("hint", None)]

# The spec's tile collectives are bound on iris.collectives' DeviceContext (DESIGN.md), not here.
COLLECTIVES = {"all_reduce_atomic", "all_reduce_spinlock", "all_reduce_one_shot", "all_reduce_ring",
               "all_reduce_two_shot", "all_gather", "gather", "all_to_all", "reduce_scatter"}

# DESIGN.md: a free function names both ends and the heap. Its leading parameters replace the bound
# method's leading ones up to and including the rank; the keyword tail is the bound method's.
FREE_HEADS = {
    "load": (["pointer", "to_rank", "from_rank", "heap_bases"], "from_rank"),
    "store": (["pointer", "value", "from_rank", "to_rank", "heap_bases"], "to_rank"),
    "get": (["from_ptr", "to_ptr", "from_rank", "to_rank", "heap_bases"], "from_rank"),
    "put": (["from_ptr", "to_ptr", "from_rank", "to_rank", "heap_bases"], "to_rank"),
    "copy": (["src_ptr", "dst_ptr", "from_rank", "to_rank", "cur_rank", "heap_bases"], "to_rank"),
    "atomic_cas": (["pointer", "cmp", "val", "from_rank", "to_rank", "heap_bases"], "to_rank"),
}
for _op in ("add", "sub", "xchg", "xor", "and", "or", "min", "max"):
    FREE_HEADS[f"atomic_{_op}"] = (["pointer", "val", "from_rank", "to_rank", "heap_bases"], "to_rank")


def expected_free() -> dict[str, list[tuple[str, object]]]:
    table = {}
    for name, (head, last_rank) in FREE_HEADS.items():
        bound = EXPECTED_BOUND[name]
        tail = bound[[p for p, _ in bound].index(last_rank) + 1:]
        table[name] = [(p, REQUIRED) for p in head] + tail
    table["translate"] = [("pointer", REQUIRED), ("from_rank", REQUIRED), ("to_rank", REQUIRED),
                          ("heap_bases", REQUIRED), ("hint", None)]
    return table


# ---------------------------------------------------------------------------------------------
# reading signatures


def python_signature(obj) -> inspect.Signature:
    """The signature of the Python function behind a jit function, an interpreted function, or the
    interpreter-mode forwarder that iris.device.aggregate attaches (which sets ``__wrapped__``)."""
    fn = getattr(obj, "fn", None)
    if fn is not None and callable(fn):  # JITFunction / InterpretedFunction
        return inspect.signature(fn)
    return inspect.signature(obj)  # follows __wrapped__


def params_of(obj, drop_self: bool) -> list[tuple[str, object]]:
    params = list(python_signature(obj).parameters.values())
    if drop_self:
        assert params and params[0].name == "self", f"{obj} is not a method taking self first: {params}"
        params = params[1:]
    return [(p.name, REQUIRED if p.default is inspect.Parameter.empty else p.default) for p in params]


def actual_signatures() -> dict:
    """Signatures of this process's iris.device (its mode: compiled or interpreted)."""
    import iris.device as device

    bound = {}
    for name in EXPECTED_BOUND:
        method = getattr(device.DeviceContext, name, None)
        if method is None:
            bound[name] = None
            continue
        bound[name] = params_of(method, drop_self=name != "initialize")
    free = {}
    for name in expected_free():
        fn = getattr(device, name, None)
        free[name] = None if fn is None else params_of(fn, drop_self=False)
    tracing = params_of(device.DeviceTracing.record_event_start, drop_self=True)
    return {"interpreter": bool(device.INTERPRETER.value), "bound": bound, "free": free, "all": list(device.__all__),
            "record_event_start": tracing}


# ---------------------------------------------------------------------------------------------
# the spec's own lines

_SIG_LINE = re.compile(r"^(?:static )?Context\.(\w+)\((.*)\)\[source\]\s*$")


def parse_spec(text: str) -> dict[str, list[tuple[str, object]]]:
    """``name -> [(param, default or REQUIRED)]`` from the spec's ``Context.name(...)[source]`` lines."""
    methods = {}
    for line in text.splitlines():
        match = _SIG_LINE.match(line.strip())
        if not match:
            continue
        params = []
        for part in filter(None, (p.strip() for p in match.group(2).split(","))):
            name, eq, default = part.partition("=")
            params.append((name.strip(), ast.literal_eval(default.strip()) if eq else REQUIRED))
        methods[match.group(1)] = params
    return methods


# ---------------------------------------------------------------------------------------------
# tests


def _as_pairs(value):
    return None if value is None else [tuple(p) for p in value]


def test_expected_table_matches_the_spec():
    from iris_device_testlib import spec_path

    path = spec_path()
    if path is None:
        pytest.skip("the seed spec is not next to this checkout (../shared/seed/device-context-spec.txt) and "
                    "$IRIS_SPEC is unset; the hand-written table is still checked against the code")
    spec = parse_spec(path.read_text(encoding="utf-8"))
    assert spec, f"no 'Context.name(...)[source]' line found in {path}"
    device_part = {name: params for name, params in spec.items() if name not in COLLECTIVES}
    assert set(spec) - set(device_part) == COLLECTIVES, "the spec's collectives changed; update COLLECTIVES"
    assert device_part == EXPECTED_BOUND


@pytest.fixture(scope="module", params=["compiled", "interpreted"])
def signatures(request):
    from iris_device_testlib import child_env, run_json_script

    env = child_env(interpret=request.param == "interpreted")
    result = run_json_script("test_device_signatures.py", env=env, timeout=120)
    assert result["interpreter"] == (request.param == "interpreted")
    return result


@pytest.mark.parametrize("name", sorted(EXPECTED_BOUND))
def test_device_context_method(signatures, name):
    actual = _as_pairs(signatures["bound"][name])
    assert actual is not None, f"DeviceContext.{name} is missing"
    assert actual == EXPECTED_BOUND[name], f"DeviceContext.{name}: got {actual}, spec says {EXPECTED_BOUND[name]}"


@pytest.mark.parametrize("name", sorted(expected_free()))
def test_free_function_twin(signatures, name):
    expected = expected_free()[name]
    actual = _as_pairs(signatures["free"][name])
    assert actual is not None, f"iris.device.{name} is missing"
    assert actual == expected, f"iris.device.{name}: got {actual}, DESIGN.md says {expected}"
    assert name in signatures["all"], f"iris.device.{name} is not in iris.device.__all__"


def test_tracing_keywords_of_the_spec_example(signatures):
    # The spec's example calls ctx.tracing.record_event_start(event_id=..., target_rank=...,
    # address=..., pid_m=..., pid_n=..., mask=...).
    names = [p for p, _ in signatures["record_event_start"]]
    assert names[:6] == ["event_id", "target_rank", "address", "pid_m", "pid_n", "mask"]
    assert dict(_as_pairs(signatures["record_event_start"]))["mask"] is None


def test_parse_spec_reads_defaults():
    text = "static Context.initialize(context_tensor, rank, world_size, tracing=False)[source]\n" \
           "Context.load(pointer, from_rank, mask=None, volatile=False)[source]\nnot a signature\n"
    assert parse_spec(text) == {
        "initialize": [("context_tensor", REQUIRED), ("rank", REQUIRED), ("world_size", REQUIRED),
                       ("tracing", False)],
        "load": [("pointer", REQUIRED), ("from_rank", REQUIRED), ("mask", None), ("volatile", False)],
    }


if __name__ == "__main__":
    sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parent))
    print(json.dumps(actual_signatures()))
