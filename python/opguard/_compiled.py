"""torch.compile regions, told to the adapter (docs/torch.md, "Compiled regions").

A compiled graph runs its fused kernels outside torch's dispatcher: no op
shows what it computes. Each call of a module or function compiled with
torch.compile (or Module.compile) is therefore bracketed by the adapter's
opguard::compiled_region_enter/exit ops and recorded as one op, named for
what was compiled ("compiled::Block", "compiled::gelu_mlp"), at the caller's
line, with the call's tensors and the module's parameters and buffers as
inputs and the tensors it returns as outputs. What the region runs is nested
in it (recorded with OPGUARD_DEPTH=all where torch's dispatcher sees it).

torch.compile imports dynamo lazily, and importing it at enable would cost
every recorded process seconds: dynamo's compile entry point is wrapped when
torch.compile is first called, or at enable if dynamo is already imported.
"""
import functools
import sys

_state = {"enabled": None, "installed": False}


def _plain_tensors(value):
    """The plain tensors (parameters included) among the leaves of `value`.
    Tensor subclasses that dispatch to Python (DTensor, FakeTensor) are left
    out: the subclass would be asked to run OpGuard's own op."""
    import torch
    from torch.utils import _pytree
    return [leaf for leaf in _pytree.tree_leaves(value)
            if type(leaf) in (torch.Tensor, torch.nn.Parameter)]


def _describe(fn):
    """(region name, module or None) of a callable dynamo compiles: a
    module's bound __call__/_call_impl/forward is named for its class."""
    import torch
    owner = getattr(fn, "__self__", None)
    if isinstance(owner, torch.nn.Module):
        return f"compiled::{type(owner).__name__}", owner
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or type(fn).__name__
    return f"compiled::{name}", None


def _region(compiled, fn):
    """`compiled` (dynamo's wrapper of `fn`) recorded as one region."""
    import torch
    name, module = _describe(fn)
    ops = torch.ops.opguard

    @functools.wraps(compiled)
    def compiled_region(*args, **kwargs):
        # Dynamo tracing an outer compiled function through this one, or not
        # recording: nothing to bracket.
        if torch.compiler.is_compiling() or not _state["enabled"]():
            return compiled(*args, **kwargs)
        try:
            inputs = _plain_tensors((args, kwargs))
            if module is not None:
                inputs += _plain_tensors((list(module.parameters()), list(module.buffers())))
            token = ops.compiled_region_enter(name, inputs)
        except Exception:  # never into the training program: run it unrecorded
            return compiled(*args, **kwargs)
        completed = False
        try:
            result = compiled(*args, **kwargs)
            completed = True
            return result
        finally:
            try:
                ops.compiled_region_exit(token, _plain_tensors(result) if completed else [],
                                         completed)
            except Exception:  # noqa: BLE001  (the region stays unrecorded)
                pass

    compiled_region.__opguard_wrapped__ = compiled
    return compiled_region


def _wrap_dynamo():
    """Wraps what OptimizeContext (torch.compile's context) returns for a
    function: OptimizedModule's forward is such a function too."""
    if _state["installed"]:
        return
    _state["installed"] = True
    from torch._dynamo import eval_frame
    context = eval_frame.OptimizeContext
    original = context.__call__
    if hasattr(original, "__opguard_wrapped__"):
        return

    @functools.wraps(original)
    def __call__(self, fn):
        compiled = original(self, fn)
        # A module (an OptimizedModule, whose forward comes through here) or
        # a class: only plain callables are regions.
        if isinstance(compiled, type) or not callable(compiled) or \
                isinstance(compiled, sys.modules["torch"].nn.Module):
            return compiled
        try:
            return _region(compiled, getattr(eval_frame, "innermost_fn", lambda f: f)(fn))
        except Exception:  # noqa: BLE001  (never into the training program: unrecorded)
            return compiled

    __call__.__opguard_wrapped__ = original
    context.__call__ = __call__


def install(enabled):
    """`enabled()` says whether this process records. Wraps torch.compile
    (absent in torch 1.x: nothing to do) once per process."""
    import torch
    if _state["enabled"] is not None or not hasattr(torch, "compile"):
        return
    _state["enabled"] = enabled
    if "torch._dynamo.eval_frame" in sys.modules:
        _wrap_dynamo()
        return
    original = torch.compile

    @functools.wraps(original)
    def compile(*args, **kwargs):
        try:
            _wrap_dynamo()
        except Exception:  # noqa: BLE001  (a torch without this layout: unrecorded regions)
            pass
        return original(*args, **kwargs)

    compile.__opguard_wrapped__ = original
    torch.compile = compile
