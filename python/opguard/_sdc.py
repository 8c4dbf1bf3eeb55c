"""Online SDC mode: OPGUARD_SDC=1 records replica state only, once per step.

Meant to stay on in production (docs/torch.md, "Online SDC mode"): no op is
observed, so torch's RecordFunction machinery stays off and forward and
backward run at full speed. After every torch.optim step, each parameter and
its optimizer state (momentum, Adam's moments and step count) are
fingerprinted, one replicated record per parameter named
"opguard::replica_state[OPTIMIZER:NAME]" with those tensors as its outputs.
Data-parallel replicas must hold identical bits there, so
`opguard ranks RUN --replicas R0,R1,...` names the replica, and the step,
whose state parted from the majority: memory, a
device or a reduction that silently corrupted it. The job itself is left as
it is (no determinism settings unless OPGUARD_DETERMINISM=on asks for them).

OPGUARD_SDC is unset, empty or 0 for the other modes, 1 for this one. It
needs torch 2.0 or newer (torch.optim's global step hooks); older torches
record in full mode instead, which compares replicas as well.
"""
import atexit
import sys

_state = {"installed": False, "warned": False, "labels": {}, "recorded": 0}


def parse(value):
    """Whether OPGUARD_SDC's `value` asks for the mode. Raises ValueError
    (one line) for anything but unset, empty, 0 or 1."""
    value = (value or "").strip()
    if value in ("", "0"):
        return False
    if value == "1":
        return True
    raise ValueError(f"OPGUARD_SDC={value!r} is not 0 or 1")


def supported():
    """torch.optim has global step hooks (torch 2.0 and newer)."""
    from torch.optim import optimizer
    return hasattr(optimizer, "register_optimizer_step_post_hook")


def install():
    """Records every torch.optim optimizer's replica state after its step
    (once per process)."""
    if _state["installed"]:
        return
    from torch.optim.optimizer import register_optimizer_step_post_hook
    _state["installed"] = True
    register_optimizer_step_post_hook(_after_step)
    atexit.register(_say_if_nothing_was_recorded)


def _say_if_nothing_was_recorded():
    # Not a silent no-op: a job whose update is not a torch.optim step
    # records nothing in this mode unless it says what its state is.
    if _state["recorded"] == 0:
        sys.stderr.write("opguard-torch warning: OPGUARD_SDC=1 recorded no replica state in this "
                         "process: it ran no torch.optim step (a hand-written update records its "
                         "state with opguard.record_replica_state())\n")


def _after_step(optimizer, args, kwargs):
    # Runs inside Optimizer.step's range: the records belong to its step.
    try:
        record(_optimizer_state(optimizer))
    except Exception as e:  # never into the training program
        if not _state["warned"]:
            _state["warned"] = True
            sys.stderr.write(f"opguard-torch warning: replica state not recorded ({e})\n")


def _labels(optimizer):
    """Each parameter's label: "SGD:head.weight" where the optimizer knows
    its parameters' names (param_names, torch 2.6 and newer, when built from
    named_parameters()), else "SGD:GROUP.INDEX"."""
    key = tuple(len(group["params"]) for group in optimizer.param_groups)
    cached = _state["labels"].get(id(optimizer))
    if cached is not None and cached[0] == key:
        return cached[1]
    kind = type(optimizer).__name__
    labels = []
    for g, group in enumerate(optimizer.param_groups):
        names = group.get("param_names")
        for i in range(len(group["params"])):
            name = names[i] if names and i < len(names) else f"{g}.{i}"
            labels.append(f"{kind}:{name}")
    _state["labels"][id(optimizer)] = (key, labels)
    return labels


def _optimizer_state(optimizer):
    """(label, [parameter, its state tensors by key]) for each parameter."""
    import torch
    params = [p for group in optimizer.param_groups for p in group["params"]]
    out = []
    for label, p in zip(_labels(optimizer), params):
        state = optimizer.state.get(p, {})
        tensors = [p] + [state[k] for k in sorted(state) if isinstance(state[k], torch.Tensor)]
        out.append((label, tensors))
    return out


def record(named_state):
    """Records one replicated op per (label, tensors) pair of `named_state`:
    "opguard::replica_state[LABEL]" with `tensors` as its outputs, read now.
    Returns how many were recorded."""
    import torch
    names, flat, counts = [], [], []
    with torch.no_grad():  # reading state builds no autograd graph
        for label, tensors in named_state:
            # A DTensor (or another subclass) is recorded by its local part:
            # the bytes this rank holds.
            local = [t.to_local() if hasattr(t, "to_local") else t for t in tensors]
            names.append(f"opguard::replica_state[{label}]")
            flat.extend(t.detach() for t in local)
            counts.append(len(local))
    if not names:
        return 0
    recorded = int(torch.ops.opguard.replica_state(names, flat, counts))
    _state["recorded"] += recorded
    return recorded
