"""Plain tables shared by the iris-device tests, the checking scripts and the multi-rank worker.

No triton or iris import here: the pytest process reads these without defining kernels (that would
fix iris.device's mode in it).
"""

from __future__ import annotations

#: Every spec value of ``sem`` and ``scope``, ``None`` (the default) first.
SEMS = (None, "relaxed", "acquire", "release", "acq_rel")
SCOPES = (None, "cta", "gpu", "sys")
COMBOS = len(SEMS) * len(SCOPES)

#: The atomics, in the order the matrix kernels lay them out.
OPS = ("add", "sub", "xchg", "and", "or", "xor", "min", "max", "cas")

#: (op, dtype) of the exact memory-order checks: every atomic once in int32, add in fp32 too.
EXACT_OPS = (("add", "int32"), ("add", "fp32"), ("sub", "int32"), ("xchg", "int32"), ("and", "int32"),
             ("or", "int32"), ("xor", "int32"), ("min", "int32"), ("max", "int32"), ("cas", "int32"))
#: Forms of a call: the bound method of DeviceContext, the free function of iris.device.
FORMS = ("bound", "free")

#: What NVIDIA supports (FACTS.md); iris.device must compile all of it for sm_90.
ATOMIC_DTYPES = {
    "add": ["int32", "int64", "uint32", "uint64", "fp32", "fp64", "fp16", "bf16"],
    "sub": ["int32", "int64", "uint32", "uint64", "fp32", "fp64", "fp16", "bf16"],
    "xchg": ["int32", "int64", "uint32", "uint64", "fp32", "fp64"],
    "min": ["int32", "int64", "uint32", "uint64", "fp32", "fp64"],
    "max": ["int32", "int64", "uint32", "uint64", "fp32", "fp64"],
    "and": ["int32", "int64", "uint32", "uint64"],
    "or": ["int32", "int64", "uint32", "uint64"],
    "xor": ["int32", "int64", "uint32", "uint64"],
    "cas": ["int32", "int64", "uint32", "uint64", "fp32", "fp64", "fp16", "bf16", "int16", "uint16"],
}

ERROR_CASES = ("bad_sem", "bad_scope", "bad_cas_sem", "bad_load_modifier", "bad_store_modifier", "cg_volatile",
               "ca_volatile", "get_bad_load_modifier", "put_bad_store_modifier", "copy_bad_load_modifier",
               "free_get_bad_store_modifier", "xor_fp32", "and_fp16", "xchg_fp16", "max_bf16", "add_int8",
               "free_or_fp32")


#: What each error case's message must contain (besides naming the call).
ERROR_EXPECT = {
    "bad_sem": ("IrisUsageError", ["iris.device.atomic_add", "sem='acq-rel'", "'acq_rel'"]),
    "bad_scope": ("IrisUsageError", ["iris.device.atomic_xchg", "scope='system'", "'sys'"]),
    "bad_cas_sem": ("IrisUsageError", ["iris.device.atomic_cas", "sem='seq_cst'"]),
    "bad_load_modifier": ("IrisUsageError", ["iris.device.load", "cache_modifier='.cs'", "'.cv'"]),
    "bad_store_modifier": ("IrisUsageError", ["iris.device.store", "cache_modifier='.ca'", "'.wt'"]),
    "cg_volatile": ("IrisUsageError", ["iris.device.load", "cache_modifier='.cg', volatile=True"]),
    "ca_volatile": ("IrisUsageError", ["iris.device.load", "cache_modifier='.ca', volatile=True"]),
    "get_bad_load_modifier": ("IrisUsageError", ["iris.device.get", "load_cache_modifier='.wt'"]),
    "put_bad_store_modifier": ("IrisUsageError", ["iris.device.put", "store_cache_modifier='.cv'"]),
    "copy_bad_load_modifier": ("IrisUsageError", ["iris.device.copy", "load_cache_modifier='cg'"]),
    "free_get_bad_store_modifier": ("IrisUsageError", ["iris.device.get", "store_cache_modifier='.ca'"]),
    "xor_fp32": ("IrisUnsupportedError", ["iris.device.atomic_xor", "fp32", "int32"]),
    "and_fp16": ("IrisUnsupportedError", ["iris.device.atomic_and", "fp16"]),
    "xchg_fp16": ("IrisUnsupportedError", ["iris.device.atomic_xchg", "fp16"]),
    "max_bf16": ("IrisUnsupportedError", ["iris.device.atomic_max", "bf16"]),
    "add_int8": ("IrisUnsupportedError", ["iris.device.atomic_add", "int8"]),
    "free_or_fp32": ("IrisUnsupportedError", ["iris.device.atomic_or", "fp32"]),
}
