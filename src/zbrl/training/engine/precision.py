"""Mixed precision of the training engines (docs/precision.md).

The trained weights (the *master* weights) and the optimizer state are always float32; the forward
and backward passes run in the *compute* dtype (``model.dtype``). The single-process and DDP
engines compute under :func:`autocast` (matrix products in the compute dtype, reductions such as
softmax and norms in float32, gradients back in float32 on the float32 parameters); the FSDP2
engine casts its gathered parameters to the compute dtype and reduces gradients in float32 (its
mixed-precision policy, built in :mod:`.fsdp2`). AdamW then updates float32 weights: an update
far below the weight's own magnitude (lr 1e-6 on a weight of 0.02) still lands, where on
bfloat16 weights (8 bits of mantissa) almost every such update rounds away.

float16 is refused: its 5-bit exponent needs dynamic loss scaling to keep small gradients from
flushing to zero, which zbrl does not do; bfloat16 has float32's range and needs none.
"""

from __future__ import annotations

import torch

from zbrl.config.model import FLOAT16_REFUSED

MASTER_DTYPE = torch.float32
"""dtype of the trained weights and of the optimizer state, whatever the compute dtype."""
COMPUTE_DTYPES = (torch.float32, torch.bfloat16)
"""Compute dtypes the engines accept."""


def check_compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """``dtype`` when an engine can compute in it; ValueError (float16: saying to use bfloat16)."""
    if dtype == torch.float16:
        raise ValueError(FLOAT16_REFUSED)
    if dtype not in COMPUTE_DTYPES:
        raise ValueError(f"compute dtype {dtype} is not one of {COMPUTE_DTYPES}")
    return dtype


def check_master(model: torch.nn.Module, what: str) -> None:
    """ValueError unless every floating-point parameter of ``model`` is float32 (a trained model's
    parameters are the master weights; load them in float32 and compute in a lower dtype)."""
    wrong = {p.dtype for p in model.parameters() if p.is_floating_point()} - {MASTER_DTYPE}
    if wrong:
        names = ", ".join(sorted(str(d) for d in wrong))
        raise ValueError(
            f"the {what}'s parameters are {names}; trained weights must be float32 (the master "
            "copy the optimizer updates): load the model in float32 and pass the lower dtype as "
            "the engine's compute_dtype"
        )
