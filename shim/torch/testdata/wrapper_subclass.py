"""A wrapper tensor subclass holding a plain tensor, as AsyncCollectiveTensor
and DTensor do: its __torch_dispatch__ runs each op on the inner tensors and
returns the plain results (adapter_test's subclass scripts)."""
import torch
from torch.utils._pytree import tree_map


class Wrapper(torch.Tensor):
    @staticmethod
    def __new__(cls, elem):
        r = torch.Tensor._make_wrapper_subclass(cls, elem.size(), strides=elem.stride(),
                                                dtype=elem.dtype, device=elem.device)
        r.elem = elem
        return r

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        def unwrap(e):
            return e.elem if isinstance(e, Wrapper) else e
        return func(*tree_map(unwrap, args), **tree_map(unwrap, kwargs or {}))
