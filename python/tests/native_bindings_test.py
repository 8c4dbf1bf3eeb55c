"""The package's ctypes declarations (opguard/_native.py) against the C
headers they bind: every function the package declares has the header's
result and argument types, and the structs it mirrors have the header's
fields in order. Run by ctest (python_native_bindings)."""
import ctypes
import os
import re
import sys
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "python"))
from opguard import _native  # noqa: E402  (needs no torch)

SHIM_H = os.path.join(ROOT, "shim", "include", "opguard", "shim.h")
TORCH_H = os.path.join(ROOT, "shim", "torch", "include", "opguard", "torch.h")

_C_TYPES = {
    "void": None, "int": ctypes.c_int, "uint8_t": ctypes.c_uint8, "uint32_t": ctypes.c_uint32,
    "uint64_t": ctypes.c_uint64, "int64_t": ctypes.c_int64,
    "size_t": ctypes.c_size_t, "const char*": ctypes.c_char_p, "char*": ctypes.c_char_p,
    "opguard_release_fn": ctypes.c_void_p,  # function pointers
    "opguard_parallel_for": ctypes.c_void_p,
}


def _ctype(c_type):
    c_type = re.sub(r"\s+\*", "*", c_type.strip())
    if c_type in _C_TYPES:
        return _C_TYPES[c_type]
    if c_type.endswith("*"):  # pointers to the header's structs: passed as void*
        return ctypes.c_void_p
    raise ValueError(f"no ctypes mapping for C type {c_type!r}")


def _strip_comments(text):
    return re.sub(r"/\*.*?\*/", "", text, flags=re.S)


def prototypes(path, macro):
    """{name: (result ctype, [argument ctypes])} of every function `macro` exports."""
    with open(path) as f:
        text = _strip_comments(f.read())
    found = {}
    for result, name, args in re.findall(macro + r"\s+([\w\s\*]+?)\s*\b(opguard_\w+)\s*\(([^)]*)\)",
                                         text):
        arguments = []
        for arg in args.split(","):
            arg = arg.strip()
            if arg in ("", "void"):
                continue
            arguments.append(_ctype(re.sub(r"\b\w+$", "", arg)))  # drop the parameter name
        found[name] = (_ctype(result), arguments)
    return found


def struct_fields(path, name):
    """[(field, ctype)] of `typedef struct name {...}` in the header."""
    with open(path) as f:
        text = _strip_comments(f.read())
    body = re.search(r"typedef struct " + name + r" \{(.*?)\}", text, re.S).group(1)
    fields = []
    for declaration in body.split(";"):
        declaration = declaration.strip()
        if declaration:
            c_type, field = re.match(r"(.+?)\s*\b(\w+)$", declaration).groups()
            fields.append((field, _ctype(c_type)))
    return fields


def _same(a, b):
    """ctypes pointer types compare by identity only for the same object."""
    if a is None or b is None:
        return a is b
    return ctypes.sizeof(a) == ctypes.sizeof(b) and (a is b or (
        issubclass(a, ctypes._Pointer) and b is ctypes.c_void_p))


def mismatches(declared, header, macro):
    """What differs between `declared` and the header's prototypes, one line each."""
    protos = prototypes(header, macro)
    if not protos:
        return [f"no {macro} prototypes parsed from {header}"]
    found = []
    for name, (result, arguments) in declared.items():
        if name not in protos:
            found.append(f"{name} is not in {os.path.basename(header)}")
            continue
        want_result, want_args = protos[name]
        if not _same(result, want_result):
            found.append(f"{name} returns {want_result}, declared {result}")
        if len(arguments) != len(want_args):
            found.append(f"{name} takes {len(want_args)} arguments, declared {len(arguments)}")
        for i, (got, want) in enumerate(zip(arguments, want_args)):
            if not _same(got, want):
                found.append(f"{name} argument {i}: {want}, declared {got}")
    return found


class NativeBindingsTest(unittest.TestCase):
    def test_shim_functions_match_shim_h(self):
        self.assertEqual(mismatches(_native.SHIM_FUNCTIONS, SHIM_H, "OPGUARD_API"), [])

    def test_every_adapter_function_is_declared_as_in_torch_h(self):
        self.assertEqual(mismatches(_native.ADAPTER_FUNCTIONS, TORCH_H, "OPGUARD_TORCH_API"), [])
        self.assertEqual(sorted(prototypes(TORCH_H, "OPGUARD_TORCH_API")),
                         sorted(_native.ADAPTER_FUNCTIONS))

    def test_structs_match_shim_h(self):
        for struct, cls in (("opguard_communicator", _native.Communicator),
                            ("opguard_counters", _native.Counters)):
            header = struct_fields(SHIM_H, struct)
            self.assertEqual([f for f, _ in cls._fields_], [f for f, _ in header], struct)
            for (field, got), (_, want) in zip(cls._fields_, header):
                self.assertTrue(_same(got, want), f"{struct}.{field}: {got} is not {want}")

    def test_a_changed_prototype_is_caught(self):
        changed = dict(_native.ADAPTER_FUNCTIONS)
        changed["opguard_torch_forget_groups"] = (None, [ctypes.c_uint32])
        self.assertEqual(mismatches(changed, TORCH_H, "OPGUARD_TORCH_API"),
                         ["opguard_torch_forget_groups argument 0: <class 'ctypes.c_ulong'>, "
                          "declared <class 'ctypes.c_uint'>"])


if __name__ == "__main__":
    unittest.main()
