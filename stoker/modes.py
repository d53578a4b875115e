"""The string-valued modes of an experiment, as types: the config's schema declares its
keys with them, and the code that acts on a mode takes the same type, so a misspelt
mode is a type error, not a silent fallback. A leaf: no import of stoker, nothing heavy
(the data loader, the runtime and the planner import it on a rank or a login node)."""

from __future__ import annotations

from typing import Literal

Precision = Literal["auto", "bf16", "fp32"]
"""train.precision: bf16 autocast (fp32 weights) or fp32; auto: bf16 where native."""
ResolvedPrecision = Literal["bf16", "fp32"]
"""What a rank trains in, once `auto` met its device."""
ActivationCheckpointing = Literal["none", "selective", "full"]
"""train.activation_checkpointing."""
Sharding = Literal["node", "all"]
"""train.sharding: FSDP2 over one node's ranks (HSDP across nodes) or over all."""
Mixing = Literal["random", "exact"]
"""data.mixing: how the sources of a mixture share the stream."""
KernelChoice = Literal["auto", "triton", "reference"]
"""model.kernels."""
RunEnd = Literal["FINISHED", "FAILED", "KILLED", "REQUEUE"]
"""How a start of the trainer ended: REQUEUE leaves the MLflow run open for the next."""
