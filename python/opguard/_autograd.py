"""What autograd runs from Python, told to the adapter.

  * torch.autograd.backward (Tensor.backward calls it): a top-level call is
    where the adapter finds step boundaries without torch.optim (the next
    step starts at the first op, after the update, from code before it);
  * a custom torch.autograd.Function's backward, saved-tensor hooks
    (torch.utils.checkpoint's recompute) and tensor hooks: Python code run
    during backward, whose ops get their own call sites (the backward line)
    and, run with grad enabled, are marked as recompute;
  * torch.optim's Optimizer.step, which runs inside
    torch.autograd.profiler.record_function("Optimizer.step#<Class>.step"):
    its ops are replicated. The range is told to the adapter from here, where
    torch opens and closes it, rather than by observing USER_SCOPE
    RecordFunctions: with a USER_SCOPE observer registered, every c10d work
    object also captures the thread's state and opens a profiling range of
    its own on the backend's thread, which each collective waits for.
"""
import functools

_state = {"adapter": None}


def _region(original, begin, end):
    """`original` run between the adapter's begin() and end()."""
    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        begin()
        try:
            return original(*args, **kwargs)
        finally:
            end()

    wrapper.__opguard_wrapped__ = original
    return wrapper


def _python_region(function):
    adapter = _state["adapter"]
    return _region(function, adapter.opguard_torch_python_region_begin,
                   adapter.opguard_torch_python_region_end)


def _wrap(owner, name, make):
    original = getattr(owner, name, None)
    if original is not None and not hasattr(original, "__opguard_wrapped__"):
        setattr(owner, name, make(original))


def _optimizer_step_ranges(adapter):
    """Wraps record_function's enter and exit so that an Optimizer.step range
    is told to the adapter where its USER_SCOPE RecordFunction opens and
    closes: before the original enter (torch 1.13's enter op opens the range,
    then makes its handle, an aten::empty inside it) and after the original
    exit."""
    from torch.autograd import profiler
    cls = profiler.record_function

    def is_step(self):
        name = getattr(self, "name", None)
        return isinstance(name, str) and name.startswith("Optimizer.step#")

    def enter(original):
        @functools.wraps(original)
        def __enter__(self):
            if not is_step(self):
                return original(self)
            adapter.opguard_torch_optimizer_step_begin()
            try:
                return original(self)
            except BaseException:
                adapter.opguard_torch_optimizer_step_end()
                raise
        __enter__.__opguard_wrapped__ = original
        return __enter__

    def exit_(original):
        @functools.wraps(original)
        def __exit__(self, *exc):
            try:
                return original(self, *exc)
            finally:
                # A range left open for a future (run_callbacks_on_exit
                # False) ends later, on its own: not a step's.
                if is_step(self) and getattr(self, "run_callbacks_on_exit", True):
                    adapter.opguard_torch_optimizer_step_end()
        __exit__.__opguard_wrapped__ = original
        return __exit__

    _wrap(cls, "__enter__", enter)
    _wrap(cls, "__exit__", exit_)


def install_optimizer_steps(adapter):
    """Only the Optimizer.step ranges (online SDC mode: steps end with the
    optimizer's, and its replica state is recorded inside them)."""
    _optimizer_step_ranges(adapter)


def install(adapter):
    """Wraps backward, Function backward, saved-tensor hooks, tensor hooks and
    record_function's enter and exit (once per process)."""
    if _state["adapter"] is not None:
        return
    import torch
    from torch.autograd import function, graph
    _state["adapter"] = adapter
    _wrap(torch.autograd, "backward", lambda original: _region(
        original, adapter.opguard_torch_backward_begin, adapter.opguard_torch_backward_end))
    _wrap(function.BackwardCFunction, "apply", _python_region)

    def hooks_init(original):
        @functools.wraps(original)
        def __init__(self, pack_hook, unpack_hook, *args, **kwargs):
            original(self, pack_hook, _python_region(unpack_hook), *args, **kwargs)
        __init__.__opguard_wrapped__ = original
        return __init__

    _wrap(graph.saved_tensors_hooks, "__init__", hooks_init)

    def register_hook(original):
        @functools.wraps(original)
        def wrapper(self, hook):
            return original(self, _python_region(hook))
        wrapper.__opguard_wrapped__ = original
        return wrapper

    _wrap(torch.Tensor, "register_hook", register_hook)
    _optimizer_step_ranges(adapter)
