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
# isort: split
from ntk_tt._linearize import linearize as linearize
from ntk_tt._memory import NTKMemoryError as NTKMemoryError
from ntk_tt._memory import available_memory as available_memory
from ntk_tt._ntk import empirical_ntk as empirical_ntk
from ntk_tt._ntk import ntk_top_eigenvalues as ntk_top_eigenvalues
from ntk_tt._ntk import ntk_vector_product as ntk_vector_product
from ntk_tt._sketch import SketchedNTK as SketchedNTK
from ntk_tt._sketch import sketched_ntk as sketched_ntk

# --- dynamics and training time (dynamics issue) ---
# isort: split
from ntk_tt._head_aware import HeadAwareKernel as HeadAwareKernel
from ntk_tt._head_aware import head_aware_kernel as head_aware_kernel
from ntk_tt._head_aware import predict_head_aware as predict_head_aware
from ntk_tt._head_aware import predict_head_aware_refreshed as predict_head_aware_refreshed
from ntk_tt._head_aware import split_head as split_head
from ntk_tt._noise import gradient_variance as gradient_variance
from ntk_tt._noise import noise_features as noise_features
from ntk_tt._predict import Prediction as Prediction
from ntk_tt._predict import predict as predict
from ntk_tt._predict_kernel import KernelPrediction as KernelPrediction
from ntk_tt._predict_kernel import predict_from_kernel as predict_from_kernel
from ntk_tt._training_time import smooth_training_time as smooth_training_time
from ntk_tt._training_time import training_time as training_time
from ntk_tt._training_time import training_time_array as training_time_array
from ntk_tt._training_time import training_time_report as training_time_report
from ntk_tt._training_time import wall_clock_time as wall_clock_time

# --- data, models, fine-tuning, comparison (fine-tuning issue) ---
# isort: split
from ntk_tt._checkpoint import load_checkpoint as load_checkpoint
from ntk_tt._checkpoint import save_checkpoint as save_checkpoint
from ntk_tt._compare import compare as compare
from ntk_tt._data import Dataset as Dataset
from ntk_tt._data import Task as Task
from ntk_tt._data import known_datasets as known_datasets
from ntk_tt._data import load_dataset as load_dataset
from ntk_tt._data import prepare_images as prepare_images
from ntk_tt._data import sample_task as sample_task
from ntk_tt._finetune import FineTuneRun as FineTuneRun
from ntk_tt._finetune import finetune as finetune
from ntk_tt._finetune import step_time as step_time
from ntk_tt._job import predict_task as predict_task
from ntk_tt.models import replace_head as replace_head

# --- scale (issue 12) ---
# isort: split
from ntk_tt._extrapolate import Spectrum as Spectrum
from ntk_tt._extrapolate import extrapolate_spectrum as extrapolate_spectrum
from ntk_tt._extrapolate import fit_power_law as fit_power_law
from ntk_tt._extrapolate import kernel_spectrum as kernel_spectrum
from ntk_tt._extrapolate import nystrom_spectrum as nystrom_spectrum
from ntk_tt._extrapolate import predict_curve_from_spectrum as predict_curve_from_spectrum
from ntk_tt._sharding import sharded_empirical_ntk as sharded_empirical_ntk

__version__ = "0.1.0"
