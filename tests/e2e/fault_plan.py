"""The training scripts' fault plan: which planted fault or benign variant a
rank runs now (--fault NAME:RANK:STEP, RANK -1 for every rank; --variant NAME)."""


class Plan:
    """Which fault or variant this rank runs now."""

    def __init__(self, fault, variant, rank):
        name, fault_rank, fault_step = (fault.split(":") + ["", "-1", "0"])[:3] if fault else (
            "", "-1", "0")
        self.fault, self.variant = name, variant
        self.rank, self.fault_rank, self.fault_step = rank, int(fault_rank), int(fault_step)
        self.step = 0

    def on(self, name):
        return (self.fault == name and self.step >= self.fault_step
                and self.fault_rank in (-1, self.rank))
