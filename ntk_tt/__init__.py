"""ntk_tt: predict fine-tuning curves and training time without training.

The package mirrors the pipeline: model → linearisation → empirical NTK (exact | sketched) →
function-space dynamics (closed form | ODE | SDE | exact discrete) → predicted curve →
T_ε and wall-clock time; beside it, real fine-tuning → measured curve → comparison.

Names are imported on first use (PEP 562), so ``import ntk_tt`` and ``ntk-tt -h`` do not
import JAX.
"""

import importlib

_EXPORTS = {
    "batch_indices": "ntk_tt.data._batches",
    "error_rate": "ntk_tt.dynamics._losses",
    "mean_loss": "ntk_tt.dynamics._losses",
    "from_nnx": "ntk_tt.data._model",
    "num_params": "ntk_tt.data._model",
    "linearize": "ntk_tt.kernels._linearize",
    "NTKMemoryError": "ntk_tt.kernels._memory",
    "available_memory": "ntk_tt.kernels._memory",
    "empirical_ntk": "ntk_tt.kernels._ntk",
    "ntk_top_eigenvalues": "ntk_tt.kernels._matvec",
    "ntk_vector_product": "ntk_tt.kernels._matvec",
    "SketchedNTK": "ntk_tt.kernels._sketch",
    "sketched_ntk": "ntk_tt.kernels._sketch",
    "gradient_variance": "ntk_tt.dynamics._noise",
    "noise_features": "ntk_tt.dynamics._noise",
    "Prediction": "ntk_tt.prediction._result",
    "predict": "ntk_tt.prediction._predict",
    "KernelPrediction": "ntk_tt.dynamics._predict_kernel",
    "predict_from_kernel": "ntk_tt.dynamics._predict_kernel",
    "REASONS": "ntk_tt.dynamics._training_time",
    "INVALID": "ntk_tt.dynamics._training_time",
    "OUTCOMES": "ntk_tt.dynamics._divergence",
    "smooth_training_time": "ntk_tt.dynamics._training_time",
    "training_time": "ntk_tt.dynamics._training_time",
    "training_time_array": "ntk_tt.dynamics._training_time",
    "training_time_report": "ntk_tt.dynamics._training_time",
    "wall_clock_time": "ntk_tt.dynamics._training_time",
    "steps_to_target": "ntk_tt.dynamics._targets",
    "steps_to_target_array": "ntk_tt.dynamics._targets",
    "steps_to_target_report": "ntk_tt.dynamics._targets",
    "load_checkpoint": "ntk_tt.data._checkpoint",
    "save_checkpoint": "ntk_tt.data._checkpoint",
    "compare": "ntk_tt.prediction._compare",
    "Dataset": "ntk_tt.data._data",
    "Task": "ntk_tt.data._data",
    "known_datasets": "ntk_tt.data._data",
    "load_dataset": "ntk_tt.data._data",
    "prepare_images": "ntk_tt.data._data",
    "sample_task": "ntk_tt.data._data",
    "FineTuneRun": "ntk_tt.training._finetune",
    "finetune": "ntk_tt.training._finetune",
    "step_time": "ntk_tt.training._finetune",
    "Telemetry": "ntk_tt.telemetry._telemetry",
    "TelemetrySpec": "ntk_tt.telemetry._telemetry",
    "load_telemetry": "ntk_tt.telemetry._telemetry",
    "read_corpus": "ntk_tt.sweep._corpus_files",
    "model_features": "ntk_tt.telemetry._recorder",
    "save_telemetry": "ntk_tt.telemetry._telemetry",
    "predict_task": "ntk_tt.prediction._job",
    "replace_head": "ntk_tt.models",
    "HeadAwareKernel": "ntk_tt.kernels._head_aware",
    "head_aware_kernel": "ntk_tt.kernels._head_aware",
    "predict_head_aware": "ntk_tt.dynamics._predict_head_aware",
    "predict_head_aware_refreshed": "ntk_tt.prediction._head_aware_refresh",
    "split_head": "ntk_tt.kernels._head_aware",
    "Spectrum": "ntk_tt.prediction._extrapolate",
    "extrapolate_spectrum": "ntk_tt.prediction._extrapolate",
    "fit_power_law": "ntk_tt.prediction._extrapolate",
    "kernel_spectrum": "ntk_tt.prediction._extrapolate",
    "nystrom_spectrum": "ntk_tt.prediction._extrapolate",
    "predict_curve_from_spectrum": "ntk_tt.prediction._extrapolate",
    "SubsetPrediction": "ntk_tt.prediction._subset",
    "predict_from_subset": "ntk_tt.prediction._subset",
    "sharded_empirical_ntk": "ntk_tt.kernels._sharding",
    "CalibrationRangeWarning": "ntk_tt.prediction._intervals_range",
    "IntervalCalibrator": "ntk_tt.prediction._intervals",
    "default_calibrator": "ntk_tt.prediction._intervals",
    "fit_intervals": "ntk_tt.prediction._intervals_fit",
    "intervals": "ntk_tt.prediction._intervals",
    "BeyondEdgeWarning": "ntk_tt.dynamics._edge_warnings",
    "LinearRegimeWarning": "ntk_tt.dynamics._regime",
    "weight_travel": "ntk_tt.dynamics._regime",
    "calibrated_for": "ntk_tt.prediction._intervals",
    "OutcomePredictor": "ntk_tt.telemetry._outcome",
    "default_outcome_predictor": "ntk_tt.telemetry._outcome",
    "fit_models": "ntk_tt.telemetry._outcome_fit",
    "fit_outcome": "ntk_tt.telemetry._outcome",
    "predict_models": "ntk_tt.telemetry._outcome_fit",
    "outcome_features": "ntk_tt.telemetry._outcome_features",
    "parametric_baseline": "ntk_tt.telemetry._outcome",
    "truncate": "ntk_tt.telemetry._telemetry",
    "OptimizerSensitivities": "ntk_tt.analysis._whatif_optimizer",
    "Sensitivities": "ntk_tt.analysis._whatif_core",
    "WhatIfGrid": "ntk_tt.analysis._whatif_core",
    "divergence_boundary": "ntk_tt.analysis._whatif",
    "plot_whatif": "ntk_tt.analysis._whatif_plot",
    "sensitivities": "ntk_tt.analysis._whatif",
    "Suggestion": "ntk_tt.analysis._suggest_report",
    "TargetNotReachedWarning": "ntk_tt.analysis._suggest",
    "suggest": "ntk_tt.analysis._suggest",
    "suggest_task": "ntk_tt.analysis._suggest_task",
    "Optimizer": "ntk_tt._optimizer",
    "adam": "ntk_tt._optimizer",
    "adamw": "ntk_tt._optimizer",
    "sgd": "ntk_tt._optimizer",
    "Schedule": "ntk_tt._schedules",
    "constant": "ntk_tt._schedules",
    "exponential": "ntk_tt._schedules",
    "schedule": "ntk_tt._schedules",
    "warmup_cosine": "ntk_tt._schedules",
    "warmup_stable_decay": "ntk_tt._schedules",
    "weight_tangent": "ntk_tt.dynamics._optim_linear",
    "sgd_trajectory": "ntk_tt.dynamics._optim_linear",
    "head_aware_sgd_trajectory": "ntk_tt.dynamics._optim_head_aware",
    "AdamKernel": "ntk_tt.dynamics._adam_head_aware",
    "adam_head_aware_kernel": "ntk_tt.dynamics._adam_head_aware",
    "adam_kernel_for_batch": "ntk_tt.dynamics._adam_batch",
    "head_aware_adam_trajectory": "ntk_tt.dynamics._adam_head_aware",
    "ReferenceRun": "ntk_tt.prediction._linearised_reference",
    "linearised_reference": "ntk_tt.prediction._linearised_reference",
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
