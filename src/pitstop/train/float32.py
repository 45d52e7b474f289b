"""float32 instead of float64, for a script to call: a float64 model runs every matmul and convolution at
half the float32 rate or less, and moves twice the bytes. The functions are the float32 component's
(``pitstop.recipes.float32``), served here under the names scripts use.

The model's float64 parameters and buffers become float32 in place (the ``Parameter`` objects stay, so
an optimizer built on them keeps working, provided it has no state yet), and float64 batches float32.
Tensors of other dtypes are left as they are.
"""

from __future__ import annotations

from pitstop.recipes.float32 import apply_input as float32_inputs
from pitstop.recipes.float32 import apply_model as float32_model
from pitstop.recipes.float32 import apply_output as float64_outputs
from pitstop.recipes.float32 import has_float64

__all__ = ["float32_inputs", "float32_model", "float64_outputs", "has_float64"]
