"""Determinism control: pin what can be pinned and record what was done.

OPGUARD_DETERMINISM=off leaves the job as it is (and the run metadata says
so). Every setting is reported to the daemon as key -> applied value.
"""
import os
import sys

# Environment settings that must be in place before the libraries read them.
_ENV_PINS = {
    "CUBLAS_WORKSPACE_CONFIG": ":16:8",  # deterministic cuBLAS workspaces
    "NCCL_ALGO": "Ring",                 # same reduction tree in every run
    "NCCL_PROTO": "Simple",
    "TORCHINDUCTOR_DETERMINISTIC": "1",  # torch.compile's inductor reads it on import
}


def apply(shim):
    mode = os.environ.get("OPGUARD_DETERMINISM", "on")
    if mode == "off":
        shim.opguard_set_run_info(4, b"mode", b"off")
        return {}
    import torch

    applied = {"mode": "on"}
    for key, value in _ENV_PINS.items():
        # A value the user set on purpose wins; record what is in force.
        os.environ.setdefault(key, value)
        applied[key] = os.environ[key]
    # What torch.use_deterministic_algorithms does, but for importing
    # torch._inductor.config to set inductor's flag: the autoload hook runs
    # this inside `import torch`, where importing inductor is slow and, on
    # torch 2.14, left every process group alive after destroy_process_group
    # (its gloo threads and store with it). An inductor imported later reads
    # TORCHINDUCTOR_DETERMINISTIC, pinned above.
    inductor_config = sys.modules.get("torch._inductor.config")
    if inductor_config is not None:
        inductor_config.deterministic = True
    torch._C._set_deterministic_algorithms(True, warn_only=True)
    applied["torch.use_deterministic_algorithms"] = "True (warn_only)"
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    applied["torch.backends.cudnn.deterministic"] = "True"
    applied["torch.backends.cudnn.benchmark"] = "False"
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    applied["allow_tf32"] = "False"
    for key, value in applied.items():
        shim.opguard_set_run_info(4, key.encode(), str(value).encode())
    for key in ("NCCL_ALGO", "NCCL_PROTO", "CUBLAS_WORKSPACE_CONFIG", "OMP_NUM_THREADS",
                "MKL_NUM_THREADS", "PYTHONHASHSEED"):
        if key in os.environ:
            shim.opguard_set_run_info(5, key.encode(), os.environ[key].encode())
    return applied
