"""Recorded by adapter_test (shim/torch/adapter_test.cc) under OPGUARD=1 in
trusted mode: aten::mm and aten::sin are trusted (recorded without
fingerprints), aten::cos is not, and a trusted op inside opguard.replicated()
is fingerprinted all the same. Also how OPGUARD_TRUSTED's values parse.
With TRUSTED_MALFORMED=1 in the environment, the list is malformed: the
package warns in one line and records every op with fingerprints."""
import os
import torch

import opguard
from opguard import _trusted

assert _trusted.parse("") == () and _trusted.parse("0") == ()
assert _trusted.parse(" aten::mm , aten::sin ") == ("aten::mm", "aten::sin")
assert _trusted.parse("default,aten::layer_norm,aten::mm") == _trusted.DEFAULT + ("aten::layer_norm",)
assert _trusted.parse("1") == _trusted.DEFAULT

malformed = os.environ.get("TRUSTED_MALFORMED") == "1"
os.environ["OPGUARD_TRUSTED"] = "aten::mm,mm" if malformed else "aten::mm, aten::sin"
assert opguard.enable(), "recording did not start"
torch.manual_seed(0)
a = torch.randn(64, 64)
b = torch.randn(64, 64)
c = a.mm(b)
c.cos()  # reads the trusted op's output: hashed here
a.sin()
with opguard.replicated():
    a.sin()
