"""What autograd runs from Python, told to the adapter.

  * torch.autograd.backward (Tensor.backward calls it): a top-level call is
    where the adapter finds step boundaries without torch.optim (the next
    step starts at the first op, after the update, from code before it);
  * a custom torch.autograd.Function's backward, saved-tensor hooks
    (torch.utils.checkpoint's recompute) and tensor hooks: Python code run
    during backward, whose ops get their own call sites (the backward line)
    and, run with grad enabled, are marked as recompute.
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


def install(adapter):
    """Wraps backward, Function backward, saved-tensor hooks and tensor hooks
    (once per process)."""
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
