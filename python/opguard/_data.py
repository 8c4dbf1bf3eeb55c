"""torch.utils.data: the DataLoader's own work is not recorded.

Fetching and collating a batch, receiving batches from worker processes (in
whatever order they arrive: the iterator puts them back in order afterwards)
and pinning them run aten ops on the training thread or the pin-memory
thread. Their order is not the training's, so two runs would disagree on it.
They run in an unrecorded region of their thread (the adapter leaves their
ops out); the batch is fingerprinted where the training code first uses it.
"""
import functools

_state = {"adapter": None}


def _unrecorded(original):
    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        adapter = _state["adapter"]
        adapter.opguard_torch_unrecorded_begin()
        try:
            return original(*args, **kwargs)
        finally:
            adapter.opguard_torch_unrecorded_end()

    wrapper.__opguard_wrapped__ = original
    return wrapper


def install(adapter):
    """Wraps the DataLoader iterator's __next__ and the pin-memory thread's
    loop (once per process)."""
    if _state["adapter"] is not None:
        return
    try:
        from torch.utils.data import dataloader
        from torch.utils.data._utils import pin_memory
    except ImportError:
        return
    _state["adapter"] = adapter
    for owner, name in ((dataloader._BaseDataLoaderIter, "__next__"),
                        (pin_memory, "_pin_memory_loop")):
        original = getattr(owner, name, None)
        if original is not None and not hasattr(original, "__opguard_wrapped__"):
            setattr(owner, name, _unrecorded(original))
