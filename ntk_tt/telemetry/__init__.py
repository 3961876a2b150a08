"""Early-training telemetry of real runs and the outcome predictors fitted on it (METHOD §9)."""
