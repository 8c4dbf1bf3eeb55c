"""torch.distributed collectives as OpGuard collective records.

Most collectives reach c10d's dispatcher ops (c10d::allreduce_, ...), and
the adapter records them there, in C++ (shim/torch/collectives.cc): an Entered
record (inputs fingerprinted at launch) and, once the work has completed, a
Completed record with the output fingerprints. That covers the collectives
DDP's reducer issues from C++ as well. What this module adds:

  * the communicator of each process group: torch's default group is the
    world; a subgroup is announced to the adapter the first time a wrapped
    call (or DistributedDataParallel's constructor) uses it;
  * the torch.distributed functions that do not go through c10d's
    dispatcher in the installed torch (all_gather_into_tensor and friends in
    torch 1.13) are recorded here: Entered before the call, Completed after
    it returns or, for async_op=True, when the caller's work.wait() returns
    (an async all-reduce's output is not final before that).

The adapter fingerprints host (CPU) tensors; a collective with other tensors
is not recorded.
"""
import ctypes
import functools
import inspect
import os
import threading

import torch
import torch.distributed as dist

from . import _native

# The torch.distributed functions this module can record itself where they do
# not reach c10d's dispatcher (torch 1.13's all_gather_into_tensor and
# friends): the ones _split knows the arguments of. Their kinds and c10d ops
# come from the adapter's table (_native.collectives).
_RECORDED_HERE = frozenset((
    "all_reduce", "broadcast", "reduce", "all_gather", "all_gather_into_tensor",
    "_all_gather_base", "reduce_scatter", "reduce_scatter_tensor", "all_to_all",
    "all_to_all_single", "send", "recv", "barrier", "gather", "scatter"))
_REDUCE = {"SUM": 0, "PRODUCT": 1, "MAX": 2, "MIN": 3, "AVG": 4}

_state = {"shim": None, "adapter": None, "installed": False, "comms": {}, "names": {},
          "reduce_ops": {}, "ops": None, "announced": {}}


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
    comm = _native.Communicator(ctypes.sizeof(_native.Communicator), len(ranks), 0, name.encode(),
                                members)
    comm_id = _as_int64(_state["shim"].opguard_communicator_define(ctypes.byref(comm)))
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
    """Wraps an async collective's Work: records Completed once, when wait()
    returns or when the work's future completes, whichever comes first."""

    def __init__(self, work, complete):
        self._work = work
        self._complete = complete
        self._lock = threading.Lock()

    def _finish(self):
        with self._lock:
            complete, self._complete = self._complete, None
        if complete is not None:
            complete()

    def wait(self, *args, **kwargs):
        result = self._work.wait(*args, **kwargs)
        self._finish()
        return result

    def get_future(self):
        """The work's future, chained so that it completes only after the
        Completed record is taken: what waits on it, or runs a callback on
        it, sees the outputs recorded first. A failed work records nothing."""
        def completed(future):
            value = future.value()
            self._finish()
            return value

        return self._work.get_future().then(completed)

    def __getattr__(self, name):
        return getattr(self._work, name)


def _as_int64(value):
    """A uint64 id as the int64 a dispatcher op takes (same bits)."""
    return value - (1 << 64) if value >= (1 << 63) else value


def _name_id(name):
    name_id = _state["names"].get(name)
    if name_id is None:
        encoded = name.encode()
        name_id = _as_int64(_state["shim"].opguard_intern(encoded, len(encoded)))
        _state["names"][name] = name_id
    return name_id


def _ops():
    """The adapter's dispatcher ops (registered when recording is enabled):
    they take the tensors themselves, fingerprint them, find the call site
    (the innermost frame outside torch, OpGuard and the stdlib) and record
    the op boundary and the collective record of one phase."""
    ops = _state.get("ops")
    if ops is None:
        ops = (torch.ops.opguard.collective_enter.default,
               torch.ops.opguard.collective_complete.default)
        _state["ops"] = ops
    return ops


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


def _wrap(kind, code, original):
    bind = _binder(original)
    names = []  # interned "c10d::<kind> [enter]" and "c10d::<kind>", on first use

    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        # The Entered record (input fingerprints at launch) and, once the
        # work has completed, the Completed record (outputs): the adapter
        # builds both (see _ops) and keeps what Completed repeats under the
        # token Entered returns (0: nothing recorded).
        try:
            arguments = bind(args, kwargs)
            inputs, outputs, root, reduce_op = _split(kind, arguments)
            comm = _communicator(arguments.get("group"))
            if not names:
                names.extend((_name_id(f"c10d::{kind} [enter]"), _name_id(f"c10d::{kind}")))
            enter, complete_op = _ops()
            token = enter(inputs, outputs, code, comm, root if isinstance(root, int) else -1,
                          reduce_op, names[0])
        except Exception:
            token = 0
        work = original(*args, **kwargs)
        if not token:
            return work

        def complete():
            try:
                complete_op(token, outputs, names[1])
            except Exception:
                pass

        if arguments.get("async_op") and work is not None:
            return _CompletingWork(work, complete)
        complete()
        return work

    wrapper.__opguard_wrapped__ = original
    return wrapper


def _dispatched(op):
    """Whether the installed torch has the c10d dispatcher op `op`."""
    try:
        getattr(torch.ops.c10d, op)
        return True
    except (AttributeError, RuntimeError):
        return False


def _call_announcing(group, original, args, kwargs):
    """Calls `original` with `group`'s communicator announced to the adapter:
    the first group it has not seen that a c10d op of this thread takes gets
    this communicator id."""
    adapter = _state["adapter"]
    try:
        adapter.opguard_torch_announce_group(_communicator(group) & ((1 << 64) - 1))
    except Exception:
        return original(*args, **kwargs)
    try:
        return original(*args, **kwargs)
    finally:
        adapter.opguard_torch_announce_group(0)
        _state["announced"][id(group)] = group  # the reference keeps id() unique


def _announcing(original, group_param):
    """Wraps a function that takes a process group as `group_param` so that a
    subgroup is announced the first time it is used (torch's default group
    needs no announcement: see CommunicatorOf in the adapter)."""
    params = list(inspect.signature(original).parameters)
    index = params.index(group_param) if group_param in params else None
    announced = _state["announced"]

    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        if index is not None and len(args) > index:
            group = args[index]
        else:
            group = kwargs.get(group_param)
        if group is None or id(group) in announced or group is dist.group.WORLD:
            return original(*args, **kwargs)
        return _call_announcing(group, original, args, kwargs)

    wrapper.__opguard_wrapped__ = original
    return wrapper


def _wrap_ddp():
    """DistributedDataParallel over a subgroup: its constructor's first
    collective (C++, on that group) learns the group's communicator."""
    try:
        from torch.nn.parallel import DistributedDataParallel
    except ImportError:
        return
    original = DistributedDataParallel.__init__
    if hasattr(original, "__opguard_wrapped__"):
        return
    DistributedDataParallel.__init__ = _announcing(original, "process_group")


def _forget(group):
    """Before torch.distributed.destroy_process_group(group): the adapter and
    this module forget the groups it destroys (every group for the default
    one), and drop the references they held, so that the groups are really
    destroyed (their backends' threads joined) and a new group at a reused
    address or id() is not taken for them. A live group with the same members
    as a destroyed one is announced again the next time it is used."""
    adapter = _state["adapter"]
    if group is None or group is dist.group.WORLD:
        adapter.opguard_torch_forget_groups(0)
        _state["comms"].clear()
        _state["announced"].clear()
        return
    comm = _state["comms"].get(id(group))
    if comm is None:
        return
    adapter.opguard_torch_forget_groups(comm & ((1 << 64) - 1))
    for key in [key for key, value in _state["comms"].items() if value == comm]:
        del _state["comms"][key]
        _state["announced"].pop(key, None)


def _wrap_destroy():
    original = dist.destroy_process_group
    if hasattr(original, "__opguard_wrapped__"):
        return
    params = list(inspect.signature(original).parameters)

    @functools.wraps(original)
    def destroy_process_group(*args, **kwargs):
        try:
            _forget(args[0] if args else kwargs.get(params[0]) if params else None)
        except Exception:
            pass
        return original(*args, **kwargs)

    destroy_process_group.__opguard_wrapped__ = original
    dist.destroy_process_group = destroy_process_group


def _wrap_future_callbacks(adapter):
    """Callbacks given to a torch Future (then, add_done_callback) record
    their ops on a lane of their own, taken when they are registered,
    whichever thread runs them. A DDP comm hook's `fut.then(decompress)` runs
    inline on the autograd thread when the all-reduce has already completed,
    else later on the backend's thread, and the buckets' callbacks finish in
    any order: per-thread lanes, or one lane for them all, would order their
    ops differently from run to run."""
    cls = getattr(torch._C, "Future", None)
    for name in ("then", "add_done_callback"):
        original = getattr(cls, name, None)
        if original is None or hasattr(original, "__opguard_wrapped__"):
            continue

        def wrapper(self, callback, *args, _original=original, **kwargs):
            lane = adapter.opguard_torch_callback_lane()

            @functools.wraps(callback)
            def in_region(future):
                adapter.opguard_torch_callback_begin(lane)
                try:
                    return callback(future)
                finally:
                    adapter.opguard_torch_callback_end()

            return _original(self, in_region, *args, **kwargs)

        wrapper.__opguard_wrapped__ = original
        functools.update_wrapper(wrapper, original, updated=())
        setattr(cls, name, wrapper)


def install(shim, adapter):
    """Wraps torch.distributed's collectives (once per process)."""
    if _state["installed"]:
        return
    _state["shim"], _state["adapter"] = shim, adapter
    for kind, (code, op) in _native.collectives(adapter).items():
        original = getattr(dist, kind, None)
        if original is None or hasattr(original, "__opguard_wrapped__"):
            continue
        if _dispatched(op):
            setattr(dist, kind, _announcing(original, "group"))
        elif kind in _RECORDED_HERE:
            setattr(dist, kind, _wrap(kind, code, original))
    _wrap_ddp()
    _wrap_destroy()
    _wrap_future_callbacks(adapter)
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
