"""Trusted mode: OPGUARD_TRUSTED names ops recorded without fingerprints.

Their records keep the op's name, call site, dtypes and shapes, but no
tensor's bytes are read for them, which is most of what recording a wide
model costs (docs/torch.md, "Trusted mode"). The aligner does not compare
them; when a later op's inputs differ, the report names the latest trusted op
that could have made them, and a second recording without OPGUARD_TRUSTED
pinpoints the op for sure. Ops in the optimizer's step (and opguard.replicated()
regions) are always fingerprinted: replicas are compared on them.

OPGUARD_TRUSTED is unset, empty or 0 for full mode; 1 or "default" for
DEFAULT; or a comma-separated list of op names, where "default" stands for
DEFAULT ("default,aten::layer_norm").
"""
import re

# Ops whose kernels are the best-tested code a training job runs (the paper
# behind OpGuard trusts GEMMs and basic elementwise ops), and views and copies
# that compute nothing. A difference they make still shows at the next
# fingerprinted op that reads their output.
DEFAULT = (
    # GEMMs
    "aten::mm", "aten::bmm", "aten::addmm", "aten::baddbmm", "aten::addbmm", "aten::matmul",
    "aten::linear",
    # elementwise arithmetic and activations
    "aten::add", "aten::add_", "aten::sub", "aten::sub_", "aten::mul", "aten::mul_", "aten::div",
    "aten::div_", "aten::neg", "aten::exp", "aten::sqrt", "aten::rsqrt", "aten::pow", "aten::tanh",
    "aten::sigmoid", "aten::relu", "aten::relu_", "aten::gelu", "aten::gelu_backward", "aten::silu",
    "aten::silu_backward", "aten::threshold_backward", "aten::tanh_backward",
    "aten::sigmoid_backward", "aten::addcmul_", "aten::addcdiv_", "aten::lerp_",
    # views and copies
    "aten::t", "aten::transpose", "aten::permute", "aten::view", "aten::reshape",
    "aten::_reshape_alias", "aten::_unsafe_view", "aten::expand", "aten::squeeze",
    "aten::unsqueeze", "aten::flatten", "aten::detach", "aten::alias", "aten::slice",
    "aten::select", "aten::as_strided", "aten::contiguous", "aten::clone", "aten::copy_",
)

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*::[A-Za-z_][A-Za-z0-9_.]*$")


def parse(value):
    """The op names OPGUARD_TRUSTED's `value` asks for: () for full mode.
    Raises ValueError (one line) for a name that is not "ns::op"."""
    value = (value or "").strip()
    if value in ("", "0"):
        return ()
    names = []
    for item in value.split(","):
        item = item.strip()
        if item in ("1", "default"):
            names.extend(DEFAULT)
        elif _NAME.match(item):
            names.append(item)
        elif item:
            raise ValueError(f"OPGUARD_TRUSTED: {item!r} is not an op name such as aten::mm "
                             "(nor 'default')")
    return tuple(dict.fromkeys(names))
