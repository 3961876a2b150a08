"""Defaults of the main job (:func:`ntk_tt.predict_task`, ``ntk-tt predict``), importable
without JAX so that ``ntk-tt -h`` answers at once."""

DEFAULTS = dict(checkpoint=None, dataset="flowers5", data_dir=None, split="train",
                num_classes=5, per_class=150, test_per_class=50, steps=150,
                learning_rate=0.002, batch_size=None, momentum=0.0, nesterov=False,
                loss="cross_entropy", method="auto", kernel="exact", sketch_dim=None,
                num_paths=32, seed=0, resize=True, head_scale=0.3, predictor="auto",
                backbone=None, subspace_dim=None, segments=1, subset=None,
                subset_method="power_law",
                loss_targets=(), error_targets=(), accuracy_targets=(),
                # the optimiser (ntk_tt._options_optimizer): None = the default it describes
                optimizer="sgd", schedule="constant", warmup=None, decay_start=None,
                decay_end=None, end_lr=None, decay_rate=None, weight_decay=None, l2=False,
                b1=None, b2=None, adam_eps=None)

# ``ntk-tt suggest`` / :func:`ntk_tt.suggest_task` (the same task as ``ntk-tt predict``)
SUGGEST_DEFAULTS = dict(checkpoint=None, dataset="flowers5", data_dir=None, split="train",
                        num_classes=5, per_class=150, seed=0, resize=True, head_scale=0.3,
                        target=0.5, target_kind="fraction", steps=150,
                        batch_sizes=(None, 50), momenta=(0.0, 0.5, 0.9, 0.95),
                        kappa_min=0.05, kappa_max=50.0, num_kappas=16, refine_steps=8,
                        num_paths=4, loss="cross_entropy", predictor="auto", top=5,
                        kappa_eff_max=None)
