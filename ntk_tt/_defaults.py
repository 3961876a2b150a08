"""Defaults of the main job (:func:`ntk_tt.predict_task`, ``ntk-tt predict``), importable
without JAX so that ``ntk-tt -h`` answers at once."""

DEFAULTS = dict(checkpoint=None, dataset="flowers5", data_dir=None, split="train",
                num_classes=5, per_class=150, test_per_class=50, steps=150,
                learning_rate=0.002, batch_size=None, momentum=0.0, nesterov=False,
                loss="cross_entropy", method="auto", kernel="exact", sketch_dim=None,
                num_paths=32, seed=0, resize=True, head_scale=0.3, predictor="auto",
                backbone="isotropic", segments=1, subset=None, subset_method="power_law")
