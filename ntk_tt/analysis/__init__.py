"""Hyperparameter questions answered from one kernel: suggest, sensitivities, divergence edge."""
