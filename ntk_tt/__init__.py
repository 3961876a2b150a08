"""ntk_tt: predict fine-tuning curves and training time without training.

The package mirrors the pipeline: model → linearisation → empirical NTK (exact | sketched) →
function-space dynamics (closed form | ODE | SDE | exact discrete) → predicted curve →
T_ε and wall-clock time; beside it, real fine-tuning → measured curve → comparison.

Names are imported on first use (PEP 562), so ``import ntk_tt`` and ``ntk-tt -h`` do not
import JAX.
"""

import importlib

_EXPORTS = {
    "batch_indices": "ntk_tt._batches",
    "error_rate": "ntk_tt._losses",
    "mean_loss": "ntk_tt._losses",
    "from_nnx": "ntk_tt._model",
    "num_params": "ntk_tt._model",
    "linearize": "ntk_tt._linearize",
    "NTKMemoryError": "ntk_tt._memory",
    "available_memory": "ntk_tt._memory",
    "empirical_ntk": "ntk_tt._ntk",
    "ntk_top_eigenvalues": "ntk_tt._ntk",
    "ntk_vector_product": "ntk_tt._ntk",
    "SketchedNTK": "ntk_tt._sketch",
    "sketched_ntk": "ntk_tt._sketch",
    "gradient_variance": "ntk_tt._noise",
    "noise_features": "ntk_tt._noise",
    "Prediction": "ntk_tt._predict",
    "predict": "ntk_tt._predict",
    "KernelPrediction": "ntk_tt._predict_kernel",
    "predict_from_kernel": "ntk_tt._predict_kernel",
    "smooth_training_time": "ntk_tt._training_time",
    "training_time": "ntk_tt._training_time",
    "training_time_array": "ntk_tt._training_time",
    "training_time_report": "ntk_tt._training_time",
    "wall_clock_time": "ntk_tt._training_time",
    "load_checkpoint": "ntk_tt._checkpoint",
    "save_checkpoint": "ntk_tt._checkpoint",
    "compare": "ntk_tt._compare",
    "Dataset": "ntk_tt._data",
    "Task": "ntk_tt._data",
    "known_datasets": "ntk_tt._data",
    "load_dataset": "ntk_tt._data",
    "prepare_images": "ntk_tt._data",
    "sample_task": "ntk_tt._data",
    "FineTuneRun": "ntk_tt._finetune",
    "finetune": "ntk_tt._finetune",
    "step_time": "ntk_tt._finetune",
    "Telemetry": "ntk_tt._telemetry",
    "TelemetrySpec": "ntk_tt._telemetry",
    "load_telemetry": "ntk_tt._telemetry",
    "model_features": "ntk_tt._telemetry",
    "save_telemetry": "ntk_tt._telemetry",
    "predict_task": "ntk_tt._job",
    "replace_head": "ntk_tt.models",
    "HeadAwareKernel": "ntk_tt._head_aware",
    "head_aware_kernel": "ntk_tt._head_aware",
    "predict_head_aware": "ntk_tt._head_aware",
    "predict_head_aware_refreshed": "ntk_tt._head_aware_refresh",
    "split_head": "ntk_tt._head_aware",
    "Spectrum": "ntk_tt._extrapolate",
    "extrapolate_spectrum": "ntk_tt._extrapolate",
    "fit_power_law": "ntk_tt._extrapolate",
    "kernel_spectrum": "ntk_tt._extrapolate",
    "nystrom_spectrum": "ntk_tt._extrapolate",
    "predict_curve_from_spectrum": "ntk_tt._extrapolate",
    "SubsetPrediction": "ntk_tt._subset",
    "predict_from_subset": "ntk_tt._subset",
    "sharded_empirical_ntk": "ntk_tt._sharding",
    "IntervalCalibrator": "ntk_tt._intervals",
    "default_calibrator": "ntk_tt._intervals",
    "fit_intervals": "ntk_tt._intervals",
    "intervals": "ntk_tt._intervals",
    "OutcomePredictor": "ntk_tt._outcome",
    "default_outcome_predictor": "ntk_tt._outcome",
    "fit_models": "ntk_tt._outcome",
    "fit_outcome": "ntk_tt._outcome",
    "predict_models": "ntk_tt._outcome",
    "outcome_features": "ntk_tt._outcome",
    "parametric_baseline": "ntk_tt._outcome",
    "truncate": "ntk_tt._telemetry",
    "Sensitivities": "ntk_tt._whatif",
    "WhatIfGrid": "ntk_tt._whatif",
    "divergence_boundary": "ntk_tt._whatif",
    "plot_whatif": "ntk_tt._whatif",
    "sensitivities": "ntk_tt._whatif",
    "Suggestion": "ntk_tt._suggest",
    "suggest": "ntk_tt._suggest",
    "suggest_task": "ntk_tt._suggest",
}
__all__ = sorted(_EXPORTS)
__version__ = "0.1.0"


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'ntk_tt' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
