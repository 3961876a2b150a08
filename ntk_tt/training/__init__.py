"""Real fine-tuning with optax, wall-clock timing, and predictions compared with real runs."""
