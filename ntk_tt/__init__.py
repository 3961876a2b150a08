"""ntk_tt: predict fine-tuning curves and training time without training.

The package mirrors the pipeline (STYLE.md §1): model → linearisation → empirical NTK (exact |
sketched) → function-space dynamics (closed form | ODE | SDE | exact discrete) → predicted
curve → T_ε and wall-clock time; beside it, real fine-tuning → measured curve → comparison.
"""

from ntk_tt._batches import batch_indices as batch_indices
from ntk_tt._losses import error_rate as error_rate
from ntk_tt._losses import mean_loss as mean_loss
from ntk_tt._model import from_nnx as from_nnx
from ntk_tt._model import num_params as num_params

# --- empirical NTK (foundation issue) ---

# --- dynamics and training time (dynamics issue) ---

# --- data, models, fine-tuning, comparison (fine-tuning issue) ---

__version__ = "0.1.0"
