"""The two native libraries the package drives, and every C function and
struct it uses from them, declared here once: the shim's from
shim/include/opguard/shim.h, the adapter's from shim/torch/include/opguard/torch.h.
A unit test (tests/unit/native_bindings_test.py) checks these declarations
against the headers, so a changed prototype fails the build's tests rather
than corrupting arguments at run time."""
import ctypes
import os

LIB_DIR = os.environ.get("OPGUARD_LIBDIR") or os.path.join(os.path.dirname(__file__), "lib")

_c = ctypes
SHIM_FUNCTIONS = {  # name: (result, [arguments])
    "opguard_init": (_c.c_int, []),
    "opguard_enabled": (_c.c_int, []),
    "opguard_rank": (_c.c_uint32, []),
    "opguard_set_run_info": (_c.c_int, [_c.c_int, _c.c_char_p, _c.c_char_p]),
    "opguard_intern": (_c.c_uint64, [_c.c_char_p, _c.c_size_t]),
    "opguard_communicator_define": (_c.c_uint64, [_c.c_void_p]),
    "opguard_get_counters": (_c.c_int, [_c.c_void_p]),
}
ADAPTER_FUNCTIONS = {
    "opguard_torch_enable": (_c.c_int, [_c.c_int, _c.c_char_p]),
    "opguard_torch_set_trusted": (_c.c_int, [_c.c_char_p]),
    "opguard_torch_set_sdc": (_c.c_int, [_c.c_int]),
    "opguard_torch_disable": (None, []),
    "opguard_torch_recording": (_c.c_int, []),
    "opguard_torch_pause": (_c.c_int, [_c.c_int]),
    "opguard_torch_mark_step": (_c.c_uint64, []),
    "opguard_torch_backward_begin": (_c.c_int, []),
    "opguard_torch_backward_end": (_c.c_int, []),
    "opguard_torch_python_region_begin": (_c.c_int, []),
    "opguard_torch_python_region_end": (_c.c_int, []),
    "opguard_torch_optimizer_step_begin": (_c.c_int, []),
    "opguard_torch_optimizer_step_end": (_c.c_int, []),
    "opguard_torch_step": (_c.c_uint64, []),
    "opguard_torch_lane": (_c.c_uint32, []),
    "opguard_torch_replicated_begin": (_c.c_int, []),
    "opguard_torch_replicated_end": (_c.c_int, []),
    "opguard_torch_unrecorded_begin": (_c.c_int, []),
    "opguard_torch_unrecorded_end": (_c.c_int, []),
    "opguard_torch_callback_lane": (_c.c_uint32, []),
    "opguard_torch_callback_begin": (_c.c_int, [_c.c_uint32]),
    "opguard_torch_callback_end": (_c.c_int, []),
    "opguard_torch_announce_group": (None, [_c.c_uint64]),
    "opguard_torch_forget_groups": (None, [_c.c_uint64]),
    "opguard_torch_collective_function": (_c.c_char_p, [_c.c_uint32]),
    "opguard_torch_collective_kind": (_c.c_int, [_c.c_char_p]),
    "opguard_torch_collective_op": (_c.c_char_p, [_c.c_char_p]),
}


class Communicator(ctypes.Structure):  # opguard_communicator
    _fields_ = [("struct_size", _c.c_uint32), ("size", _c.c_uint32), ("id", _c.c_uint64),
                ("name", _c.c_char_p), ("ranks", _c.POINTER(_c.c_uint32))]


class Counters(ctypes.Structure):  # opguard_counters
    _fields_ = [("struct_size", _c.c_uint32), ("enabled", _c.c_uint32)] + [
        (name, _c.c_uint64) for name in (
            "records_enqueued", "records_dropped", "records_invalid", "records_sent",
            "records_acked", "records_rejected", "batches_sent", "batches_acked",
            "batches_resent", "batches_rejected", "gaps_reported", "ops_missing", "bytes_sent",
            "buffered_bytes", "pending_batches", "fp_pending", "fp_resolved", "fp_failed",
            "fp_refused", "records_held", "kernel_names", "kernel_lists_unavailable",
            "kernel_lists_cut")]


def _declare(lib, functions):
    for name, (result, arguments) in functions.items():
        function = getattr(lib, name)
        function.restype = result
        function.argtypes = arguments
    return lib


class TorchMismatch(Exception):
    """The running torch is not the one the adapter was built against."""


def built_for_torch():
    """torch.__version__ of the torch the adapter was compiled against (None
    in a source tree, where no adapter was built)."""
    try:
        from . import _build_info
    except ImportError:
        return None
    return _build_info.TORCH_VERSION


def check_torch(version):
    """Raises TorchMismatch unless `version` (torch.__version__) is the one
    the adapter was built for: torch's C++ ABI changes between releases, so
    another torch could fail to load the adapter or, worse, load it and
    misread torch's objects."""
    built = built_for_torch()
    if built is not None and built != version:
        raise TorchMismatch(
            f"this opguard was built for torch {built}, but this Python runs torch {version}; "
            "rebuild it against this torch: pip install --force-reinstall ./python "
            "(from an OpGuard checkout)")


def load():
    """(shim, adapter): both libraries with their functions declared. The
    shim is loaded globally first: the adapter resolves its symbols there.
    Call check_torch first."""
    shim = ctypes.CDLL(os.path.join(LIB_DIR, "libopguard_shim.so"), mode=ctypes.RTLD_GLOBAL)
    adapter = ctypes.CDLL(os.path.join(LIB_DIR, "libopguard_torch.so"))
    return _declare(shim, SHIM_FUNCTIONS), _declare(adapter, ADAPTER_FUNCTIONS)


def collectives(adapter):
    """{torch.distributed function: (OPGUARD_COLL_* kind, c10d op)} from the
    adapter's one table."""
    table = {}
    index = 0
    while True:
        function = adapter.opguard_torch_collective_function(index)
        if function is None:
            return table
        table[function.decode()] = (adapter.opguard_torch_collective_kind(function),
                                    adapter.opguard_torch_collective_op(function).decode())
        index += 1
