"""OpGuard's PyTorch integration.

With OPGUARD=1 in the environment, the `opguard-autoload.pth` hook installed
beside this package enables recording as soon as the training program imports
torch — no change to the training code. Explicit use:

    import opguard
    opguard.enable()      # same as the hook does
    opguard.mark_step()   # explicit step boundaries (found on their own otherwise)
    with opguard.replicated():  # ops every data-parallel replica must agree on
        ...
    with opguard.paused():  # not observed at all (evaluation, checkpointing)
        ...
    opguard.record_replica_state({"w": w})  # a hand-written update's state

Everything here follows the shim's rule: never raise into, block or crash the
training process. Failures print one warning line and recording stays off.
"""
import contextlib
import ctypes
import os
import sys
import threading

from . import _native

__all__ = ["enable", "enabled", "mark_step", "replicated", "paused", "record_replica_state",
           "counters"]

_state = {"shim": None, "torch": None, "enabled": False, "pending_rank": False, "user_daemon": None}
_pause_lock = threading.Lock()
_pause_depth = [0]


def _warn(message):
    sys.stderr.write(f"opguard-torch warning: {message}\n")


def _load():
    if _state["torch"] is None:
        import torch
        _native.check_torch(torch.__version__)
        _state["shim"], _state["torch"] = _native.load()
    return _state["shim"], _state["torch"]


_RANK_VARIABLES = ("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK")  # the shim's order


def _has_rank_env():
    return any(v in os.environ for v in _RANK_VARIABLES)


def _env_rank():
    """The rank the shim will read from the environment ("" if none)."""
    return next((os.environ[v] for v in _RANK_VARIABLES if v in os.environ), "")


# A recording process exports "PID:RANK" here; its children inherit it.
_RECORDER_VARIABLE = "OPGUARD_RECORDER"


def _helper_of_recorder():
    """True in a process started by a recording process under the same rank:
    a DataLoader worker or other helper started with the spawn or forkserver
    method (it inherits OPGUARD=1 and the rank). Recording it too would put
    a second stream of ops under the rank's lanes. (A forked child needs no
    check: the shim turns itself off in it.)"""
    pid, _, rank = os.environ.get(_RECORDER_VARIABLE, "").partition(":")
    return pid not in ("", str(os.getpid())) and rank == _env_rank()


def _skip_prefixes():
    """Path prefixes that are not user code: torch, OpGuard, the standard library."""
    import sysconfig
    import torch
    prefixes = {os.path.dirname(torch.__file__) + os.sep, os.path.dirname(__file__) + os.sep}
    for key in ("stdlib", "platstdlib"):
        path = sysconfig.get_paths().get(key)
        if path:
            prefixes.add(path + os.sep)
    return ":".join(sorted(prefixes))


def enable(depth=None):
    """Starts recording this process's ops. Returns True if recording.

    depth: "top" (default: the top-level aten op of each call from user code)
    or "all" (every aten op); OPGUARD_DEPTH sets the default.
    """
    try:
        if _helper_of_recorder():
            return False
        import torch  # noqa: F401  (the adapter needs torch's libraries loaded)
        from . import _autograd, _collectives, _compiled, _data, _determinism, _trusted
        shim, adapter = _load()
        depth = depth or os.environ.get("OPGUARD_DEPTH", "top")
        if depth not in ("top", "all"):
            _warn(f"OPGUARD_DEPTH={depth!r} is not 'top' or 'all'; recording stays off")
            return False
        if not _choose_daemon():
            return False
        if shim.opguard_init() != 1:
            return False
        if _sdc_mode(adapter):
            return _enable_sdc(shim, adapter, depth)
        _determinism.apply(shim)
        try:
            trusted = _trusted.parse(os.environ.get("OPGUARD_TRUSTED"))
        except ValueError as e:  # full mode records more and loses nothing
            _warn(f"{e}; recording every op with fingerprints")
            trusted = ()
        adapter.opguard_torch_set_trusted(",".join(trusted).encode())
        if trusted:
            shim.opguard_set_run_info(5, b"OPGUARD_TRUSTED", os.environ["OPGUARD_TRUSTED"].encode())
        _collectives.install(shim, adapter)
        _data.install(adapter)
        _autograd.install(adapter)
        _compiled.install(enabled)
        return _start(shim, adapter, depth)
    except _native.TorchMismatch as e:
        _warn(f"{e}; training continues without recording")
        return False
    except Exception as e:  # never into the training program
        _warn(f"could not enable recording ({e}); training continues without it")
        return False


def _choose_daemon():
    """Points the shim at the daemon this process records to: OPGUARD_ENDPOINT,
    the node's, or this user's own, started now if it is not running
    (_local_daemon). False, after one line, when there is none to be had."""
    from . import _local_daemon
    try:
        endpoint, user, _ = _local_daemon.choose(os.environ)
    except _local_daemon.Unavailable as e:
        _warn(f"no daemon to record to: {e}; training continues without recording")
        return False
    if user is not None:
        os.environ["OPGUARD_ENDPOINT"] = endpoint  # what the shim reads
        os.environ[_local_daemon.USER_DAEMON_VARIABLE] = user.lock
        _state["user_daemon"] = user
    return True


def _watch_user_daemon():
    """While recording to this user's daemon: started again when it is gone
    and records wait for it."""
    user = _state["user_daemon"]
    if user is None:
        return
    from . import _local_daemon

    def pending():
        c = counters()
        return c.get("pending_batches", 0) > 0 or c.get("buffered_bytes", 0) > 0
    _local_daemon.watch(user, pending, _warn)


def _sdc_mode(adapter):
    """Whether OPGUARD_SDC asks for online SDC mode and it can run here
    (otherwise one warning line, and full mode: it compares replicas too)."""
    from . import _sdc
    try:
        if not _sdc.parse(os.environ.get("OPGUARD_SDC")):
            return False
    except ValueError as e:
        _warn(f"{e}; recording every op with fingerprints")
        return False
    if not _sdc.supported():
        _warn("OPGUARD_SDC=1 needs torch 2.0 or newer (torch.optim's step hooks); "
              "recording every op with fingerprints instead")
        return False
    if adapter.opguard_torch_set_sdc(1) != 1:
        _warn("OPGUARD_SDC=1 after recording started in another mode; that mode stays")
        return False
    return True


def _enable_sdc(shim, adapter, depth):
    """Online SDC mode (opguard/_sdc.py): no op, collective or data loader
    is observed; the optimizer's steps are, for their replica state and as
    step boundaries. The job's settings are left alone unless
    OPGUARD_DETERMINISM=on asks for determinism control."""
    from . import _autograd, _determinism, _sdc
    if os.environ.get("OPGUARD_DETERMINISM") == "on":
        _determinism.apply(shim)
    else:
        shim.opguard_set_run_info(4, b"mode", b"off (online SDC mode)")
    shim.opguard_set_run_info(5, b"OPGUARD_SDC", b"1")
    _autograd.install_optimizer_steps(adapter)
    _sdc.install()
    return _start(shim, adapter, depth)


def _start(shim, adapter, depth):
    """The run's framework and versions, then the adapter: recording starts."""
    import torch
    shim.opguard_set_run_info(1, b"", b"pytorch")
    shim.opguard_set_run_info(3, b"torch", torch.__version__.encode())
    shim.opguard_set_run_info(3, b"python", sys.version.split()[0].encode())
    ok = adapter.opguard_torch_enable(1 if depth == "all" else 0, _skip_prefixes().encode()) == 1
    _state["enabled"] = ok
    if ok:
        os.environ[_RECORDER_VARIABLE] = f"{os.getpid()}:{shim.opguard_rank()}"
        _watch_user_daemon()
    return ok


def enabled():
    """True while this process records (False in a forked child of a recording
    process, or once recording stopped on an error)."""
    return _state["enabled"] and _state["torch"].opguard_torch_recording() == 1


def mark_step():
    """Marks a step boundary explicitly: the next op starts the next step, and
    from then on only mark_step() ends steps. Loops need not call it: steps
    are found from backward() and the update that follows it (docs/torch.md,
    "Steps")."""
    if _state["enabled"]:
        return int(_state["torch"].opguard_torch_mark_step())
    return 0


@contextlib.contextmanager
def replicated():
    """Marks the ops this thread records in the body as replicated: every
    data-parallel replica must compute identical bits for them (the flag
    `opguard ranks --replicas` compares). Ops inside a torch.optim
    Optimizer.step are marked on their own; this is for replicated computation
    elsewhere (a hand-written update, EMA weights). Regions nest; usable as a
    decorator too. Does nothing while not recording."""
    adapter = _state["torch"] if _state["enabled"] else None
    if adapter is not None:
        adapter.opguard_torch_replicated_begin()
    try:
        yield
    finally:
        if adapter is not None:
            adapter.opguard_torch_replicated_end()


@contextlib.contextmanager
def paused():
    """Ops run in the body, on any thread, are neither observed nor recorded:
    OpGuard unregisters its torch callbacks on entry and registers them again
    on exit, so the body runs at full speed (an evaluation loop, a
    checkpoint). Two runs compare op for op only if they pause at the same
    points; an optimizer step inside does not count as a step. Regions nest;
    usable as a decorator too. Does nothing while not recording."""
    adapter = _state["torch"] if _state["enabled"] else None
    if adapter is not None:
        with _pause_lock:
            _pause_depth[0] += 1
            if _pause_depth[0] == 1:
                adapter.opguard_torch_pause(1)
    try:
        yield
    finally:
        if adapter is not None:
            with _pause_lock:
                _pause_depth[0] -= 1
                if _pause_depth[0] == 0:
                    adapter.opguard_torch_pause(0)


def record_replica_state(state):
    """Records replica state now: for each name and tensor (or list of
    tensors) of the dict `state`, one op "opguard::replica_state[NAME]"
    flagged replicated, whose outputs are the tensors' bytes as they are.
    Every data-parallel replica must record the same names in the same order
    and hold the same bits in them; `opguard ranks RUN --replicas` compares
    them. For a hand-written update in online SDC mode (OPGUARD_SDC=1
    records torch.optim's steps on its own); in any mode. Returns how many
    were recorded (0 when not recording)."""
    if not _state["enabled"]:
        return 0
    try:
        from . import _sdc
        pairs = [(name, list(value) if isinstance(value, (list, tuple)) else [value])
                 for name, value in dict(state).items()]
        return _sdc.record(pairs)
    except Exception as e:  # never into the training program
        _warn(f"replica state not recorded ({e})")
        return 0


def counters():
    """The shim's counters as a dict (all zero when not recording), and
    daemon_restarts: how often this process started your own daemon again
    after it was gone (_local_daemon.watch)."""
    if _state["shim"] is None:
        return {}
    c = _native.Counters()
    c.struct_size = ctypes.sizeof(_native.Counters)
    _state["shim"].opguard_get_counters(ctypes.byref(c))
    values = {name: getattr(c, name) for name, _ in _native.Counters._fields_[1:]}
    user = _state["user_daemon"]
    values["daemon_restarts"] = user.restarts if user is not None else 0
    return values


def _autoload_enable():
    """Called by the import hook once torch is imported (OPGUARD=1)."""
    if _is_launcher():
        return
    if _has_rank_env():
        enable()
    else:
        # torch.multiprocessing.spawn children and plain `python train.py`:
        # the rank is known once the process group exists.
        from . import _collectives
        _collectives.enable_at_init_process_group(enable)


def _is_launcher():
    """torchrun / torch.distributed.launch parents start ranks; they train nothing."""
    argv0 = os.path.basename(sys.argv[0]) if sys.argv else ""
    if argv0 in ("torchrun",):
        return True
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    return spec is not None and spec.name in ("torch.distributed.run", "torch.distributed.launch")
