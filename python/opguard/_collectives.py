"""torch.distributed collectives as OpGuard collective records.

Each wrapped call records an Entered record (input fingerprints, taken at
launch) and, once the collective's work has completed, a Completed record
with the output fingerprints. For async_op=True the Completed record is taken
when the caller's work.wait() returns: an async all-reduce's output is not
final before that. Only host (CPU) tensors are fingerprinted here.
"""
import ctypes
import functools
import inspect
import os
import sys

import torch
import torch.distributed as dist

_AUTO = (1 << 64) - 1
_KINDS = {  # OPGUARD_COLL_*
    "all_reduce": 1, "broadcast": 2, "reduce": 3, "all_gather": 4, "all_gather_into_tensor": 4,
    "_all_gather_base": 4, "reduce_scatter": 5, "reduce_scatter_tensor": 5, "all_to_all": 6,
    "all_to_all_single": 6, "send": 7, "recv": 8, "barrier": 9, "gather": 10, "scatter": 11,
}
_REDUCE = {"SUM": 0, "PRODUCT": 1, "MAX": 2, "MIN": 3, "AVG": 4}


class _Tensor(ctypes.Structure):  # opguard_tensor
    _fields_ = [("fp_lo", ctypes.c_uint64), ("fp_hi", ctypes.c_uint64),
                ("shape", ctypes.POINTER(ctypes.c_int64)), ("ndim", ctypes.c_uint32),
                ("dtype", ctypes.c_uint8), ("has_stats", ctypes.c_uint8),
                ("device", ctypes.c_int16),
                ("nan_count", ctypes.c_uint64), ("inf_count", ctypes.c_uint64),
                ("min", ctypes.c_double), ("max", ctypes.c_double),
                ("sum", ctypes.c_double), ("l2", ctypes.c_double)]


class _Collective(ctypes.Structure):  # opguard_collective
    _fields_ = [("struct_size", ctypes.c_uint32), ("phase", ctypes.c_uint8),
                ("kind", ctypes.c_uint8), ("dtype", ctypes.c_uint8), ("reduce_op", ctypes.c_uint8),
                ("communicator", ctypes.c_uint64), ("seq", ctypes.c_uint64),
                ("count", ctypes.c_uint64), ("root", ctypes.c_int32), ("lane", ctypes.c_uint32),
                ("op_index", ctypes.c_uint64), ("step", ctypes.c_uint64),
                ("site", ctypes.c_uint64), ("num_inputs", ctypes.c_uint32),
                ("num_outputs", ctypes.c_uint32), ("inputs", ctypes.POINTER(_Tensor)),
                ("outputs", ctypes.POINTER(_Tensor)), ("time_ns", ctypes.c_uint64)]


class _Communicator(ctypes.Structure):  # opguard_communicator
    _fields_ = [("struct_size", ctypes.c_uint32), ("size", ctypes.c_uint32),
                ("id", ctypes.c_uint64), ("name", ctypes.c_char_p),
                ("ranks", ctypes.POINTER(ctypes.c_uint32))]


_DTYPES = {torch.float64: 1, torch.float32: 2, torch.float16: 3, torch.bfloat16: 4,
           torch.int64: 7, torch.int32: 8, torch.int16: 9, torch.int8: 10, torch.uint8: 11,
           torch.bool: 12, torch.complex64: 16, torch.complex128: 17}
_state = {"shim": None, "adapter": None, "installed": False, "comms": {}, "names": {},
          "user_code": {}, "sites": {}, "reduce_ops": {}}


def _fingerprint(tensor, keep):
    """opguard_tensor for a host tensor, or None if it has no host bytes."""
    if tensor is None or tensor.device.type != "cpu" or tensor.dtype not in _DTYPES:
        return None
    ndim = tensor.dim()
    array = ctypes.c_int64 * max(1, ndim)
    shape = array(*tensor.shape)
    # A contiguous tensor needs no strides (the same bytes, the same digest).
    strides = None if tensor.is_contiguous() else array(*tensor.stride())
    out = _Tensor()
    rc = _state["shim"].opguard_fingerprint_host(tensor.data_ptr() if tensor.numel() else None,
                                                 _DTYPES[tensor.dtype], shape, ndim, strides,
                                                 ctypes.byref(out))
    if rc != 0:
        return None
    keep.append(shape)
    return out


def _tensor_array(tensors, keep):
    prints = []
    for t in tensors:
        p = _fingerprint(t, keep)
        if p is None:
            return None
        prints.append(p)
    array = (_Tensor * max(1, len(prints)))(*prints)
    keep.append(array)
    return array, len(prints)


def _communicator(group):
    group = group if group is not None else dist.group.WORLD
    key = id(group)
    if key in _state["comms"]:
        return _state["comms"][key]
    try:
        ranks = dist.get_process_group_ranks(group)
    except Exception:
        ranks = list(range(dist.get_world_size(group)))
    name = "world" if group is dist.group.WORLD or group is None else "pg" + ",".join(map(str, ranks))
    members = (ctypes.c_uint32 * len(ranks))(*ranks)
    comm = _Communicator(ctypes.sizeof(_Communicator), len(ranks), 0, name.encode(), members)
    comm_id = _state["shim"].opguard_communicator_define(ctypes.byref(comm))
    _state["comms"][key] = comm_id
    return comm_id


def _reduce_op(op):
    """OPGUARD_REDUCE_* of a ReduceOp (255: none), cached per op value."""
    if op is None:
        return 255
    try:
        return _state["reduce_ops"][op]
    except (KeyError, TypeError):
        pass
    code = _REDUCE.get(getattr(op, "name", str(op)).upper().split(".")[-1], 0)
    try:
        if len(_state["reduce_ops"]) < 64:
            _state["reduce_ops"][op] = code
    except TypeError:  # unhashable: not cached
        pass
    return code


def _split(kind, a):
    """(inputs, outputs, root, reduce_op) of one call, by collective kind;
    `a` maps every parameter name to its argument (defaults applied)."""
    reduce_op = _reduce_op(a.get("op"))
    root = a.get("src", a.get("dst", -1))
    if kind in ("all_reduce", "broadcast", "reduce"):
        return [a["tensor"]], [a["tensor"]], root, reduce_op
    if kind == "all_gather":
        return [a["tensor"]], list(a["tensor_list"]), root, reduce_op
    if kind in ("all_gather_into_tensor", "_all_gather_base"):
        return [a["input_tensor"]], [a["output_tensor"]], root, reduce_op
    if kind == "reduce_scatter":
        return list(a["input_list"]), [a["output"]], root, reduce_op
    if kind == "reduce_scatter_tensor":
        return [a["input"]], [a["output"]], root, reduce_op
    if kind == "all_to_all_single":
        return [a["input"]], [a["output"]], root, reduce_op
    if kind == "all_to_all":
        return list(a["input_tensor_list"]), list(a["output_tensor_list"]), root, reduce_op
    if kind in ("send",):
        return [a["tensor"]], [], a.get("dst", -1), reduce_op
    if kind in ("recv",):
        return [], [a["tensor"]], a.get("src", -1), reduce_op
    return [], [], root, reduce_op


class _CompletingWork:
    """Wraps an async collective's Work: records Completed after wait()."""

    def __init__(self, work, complete):
        self._work = work
        self._complete = complete

    def wait(self, *args, **kwargs):
        result = self._work.wait(*args, **kwargs)
        complete, self._complete = self._complete, None
        if complete is not None:
            complete()
        return result

    def __getattr__(self, name):
        return getattr(self._work, name)


def _user_site():
    """Site id of the innermost frame outside torch, OpGuard and the stdlib.
    Whether a code object is user code (its source file sent once) and the
    site id of each (code, line) are cached."""
    frame = sys._getframe(1)
    user_code, sites = _state["user_code"], _state["sites"]
    while frame is not None:
        code = frame.f_code
        user = user_code.get(code)
        if user is None:
            path = code.co_filename
            user = not path.startswith("<") and not path.startswith(_state["skip"])
            if user:
                _state["shim"].opguard_source_file(path.encode(), None, 0)
            if len(user_code) >= 10000:
                user_code.clear()
            user_code[code] = user
        if user:
            key = (code, frame.f_lineno)
            site = sites.get(key)
            if site is None:
                site = _state["shim"].opguard_site(code.co_filename.encode(), key[1],
                                                   code.co_name.encode())
                if len(sites) >= 10000:
                    sites.clear()
                sites[key] = site
            return site
        frame = frame.f_back
    return 0


def _name_id(name):
    name_id = _state["names"].get(name)
    if name_id is None:
        encoded = name.encode()
        name_id = _state["shim"].opguard_intern(encoded, len(encoded))
        _state["names"][name] = name_id
    return name_id


def _record(phase, kind, comm, seq, count, dtype, root, reduce_op, inputs, outputs, site,
            entered=None, entered_at=None):
    """Records one phase. The collective is also an op boundary in the rank's
    op order, so alignment and the pivot walk see it like any other op:
    "c10d::all_reduce [enter]" holds what the collective consumed (recorded at
    launch), "c10d::all_reduce" what it produced (recorded once complete);
    the adapter records both in one call (opguard_torch_record_collective)."""
    keep = []
    # Completed records carry the inputs as they were at launch (an in-place
    # all-reduce has overwritten them by now).
    ins = entered if entered is not None else _tensor_array(inputs, keep)
    outs = _tensor_array(outputs, keep)
    if ins is None or outs is None:
        return None  # device tensors: the collective is not fingerprinted here
    rec = _Collective()
    rec.struct_size = ctypes.sizeof(_Collective)
    rec.phase, rec.kind, rec.dtype, rec.reduce_op = phase, _KINDS[kind], dtype, reduce_op
    rec.communicator, rec.seq, rec.count = comm, seq, count
    rec.root = root if isinstance(root, int) else -1
    # Entered: the adapter sets op_index to where the collective was issued
    # (after its [enter] boundary); Completed repeats that position, so both
    # phases sit at the same place in the rank's op order (causality compares
    # positions).
    rec.op_index = _AUTO if phase == 1 else entered_at
    rec.step, rec.site = _AUTO, site
    rec.num_inputs, rec.inputs = ins[1], ins[0]
    rec.num_outputs, rec.outputs = outs[1], outs[0]
    name = f"c10d::{kind} [enter]" if phase == 1 else f"c10d::{kind}"
    seq_out = ctypes.c_uint64(0)
    if _state["adapter"].opguard_torch_record_collective(ctypes.byref(rec), _name_id(name),
                                                         ctypes.byref(seq_out)) != 0:
        return None
    return seq_out.value, ins, rec.op_index


def _binder(original):
    """A function (args, kwargs) -> {parameter: argument, defaults applied},
    as inspect.Signature.bind + apply_defaults give, prepared once per
    function: binding is on every collective call's path. Raises TypeError
    where bind would (the call itself then raises it)."""
    signature = inspect.signature(original)
    params = list(signature.parameters.values())
    kinds = {p.kind for p in params}
    if not kinds <= {inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY}:
        def bind_general(args, kwargs):
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            return bound.arguments
        return bind_general
    positional = tuple(p.name for p in params
                       if p.kind == inspect.Parameter.POSITIONAL_OR_KEYWORD)
    names = frozenset(p.name for p in params)
    defaults = {p.name: p.default for p in params if p.default is not p.empty}

    def bind(args, kwargs):
        if len(args) > len(positional):
            raise TypeError("too many positional arguments")
        arguments = dict(defaults)
        arguments.update(zip(positional, args))
        if kwargs:
            for name in kwargs:
                if name not in names or name in positional[:len(args)]:
                    raise TypeError(f"unexpected or repeated argument {name!r}")
            arguments.update(kwargs)
        if len(arguments) != len(names):
            raise TypeError("missing a required argument")
        return arguments

    return bind


def _wrap(kind, original):
    bind = _binder(original)

    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        try:
            arguments = bind(args, kwargs)
            inputs, outputs, root, reduce_op = _split(kind, arguments)
            comm = _communicator(arguments.get("group"))
            first = (inputs or outputs or [None])[0]
            dtype = _DTYPES.get(getattr(first, "dtype", None), 0)
            count = first.numel() if first is not None else 0
            site = _user_site()
            entered = _record(1, kind, comm, _AUTO, count, dtype, root, reduce_op, inputs, [],
                              site)
        except Exception:
            entered = None
        work = original(*args, **kwargs)
        if entered is None:
            return work
        seq, entered_inputs, entered_at = entered

        def complete():
            try:
                _record(0, kind, comm, seq, count, dtype, root, reduce_op, inputs, outputs, site,
                        entered_inputs, entered_at)
            except Exception:
                pass

        if arguments.get("async_op") and work is not None:
            return _CompletingWork(work, complete)
        complete()
        return work

    wrapper.__opguard_wrapped__ = original
    return wrapper


def install(shim, adapter, skip_prefixes):
    """Wraps torch.distributed's collectives (once per process)."""
    if _state["installed"]:
        return
    _state["shim"], _state["adapter"] = shim, adapter
    _state["skip"] = tuple(p for p in skip_prefixes.split(":") if p)
    shim.opguard_intern.restype = ctypes.c_uint64
    shim.opguard_intern.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
    shim.opguard_site.restype = ctypes.c_uint64
    shim.opguard_site.argtypes = [ctypes.c_char_p, ctypes.c_uint32, ctypes.c_char_p]
    shim.opguard_source_file.restype = ctypes.c_uint64
    shim.opguard_source_file.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.c_size_t]
    adapter.opguard_torch_record_collective.argtypes = [
        ctypes.POINTER(_Collective), ctypes.c_uint64, ctypes.POINTER(ctypes.c_uint64)]
    adapter.opguard_torch_record_collective.restype = ctypes.c_int
    shim.opguard_fingerprint_host.argtypes = [
        ctypes.c_void_p, ctypes.c_uint8, ctypes.POINTER(ctypes.c_int64), ctypes.c_uint32,
        ctypes.POINTER(ctypes.c_int64), ctypes.POINTER(_Tensor)]
    shim.opguard_communicator_define.restype = ctypes.c_uint64
    shim.opguard_record_collective.argtypes = [ctypes.POINTER(_Collective),
                                               ctypes.POINTER(ctypes.c_uint64)]
    for kind in _KINDS:
        original = getattr(dist, kind, None)
        if original is None or hasattr(original, "__opguard_wrapped__"):
            continue
        setattr(dist, kind, _wrap(kind, original))
    _state["installed"] = True


def enable_at_init_process_group(enable):
    """Defers `enable` until the process group exists, exporting the rank it
    gives into the environment the shim reads (torch.multiprocessing.spawn
    children and programs that pass rank= explicitly)."""
    original = dist.init_process_group
    if hasattr(original, "__opguard_wrapped__"):
        return

    @functools.wraps(original)
    def init_process_group(*args, **kwargs):
        result = original(*args, **kwargs)
        try:
            os.environ.setdefault("RANK", str(dist.get_rank()))
            os.environ.setdefault("WORLD_SIZE", str(dist.get_world_size()))
            os.environ.setdefault("LOCAL_RANK", os.environ["RANK"])
            enable()
        except Exception:
            pass
        return result

    init_process_group.__opguard_wrapped__ = original
    dist.init_process_group = init_process_group
