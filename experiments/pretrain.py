"""Pre-train the small ResNet on the CIFAR-10 source set and write an orbax checkpoint.

    python experiments/pretrain.py --out ntk_tt/assets/checkpoints/small_resnet_cifar10

Adam (optax) on ``cifar10_source`` (10,000 real CIFAR-10 train images, ../shared/data) or on a
prepared TFDS ``cifar10`` (``--dataset cifar10 --data-dir ...``), random horizontal flips,
cross-entropy; reports accuracy on ``cifar10_test`` (official test split, disjoint).
"""

from __future__ import annotations

import argparse
import json
import time

import jax.numpy as jnp
import numpy as np
import optax
from _args import at_least, fail, positive  # experiments/_args.py, beside this script
from flax import nnx
from tqdm import tqdm

from ntk_tt import load_checkpoint, load_dataset, prepare_images, save_checkpoint
from ntk_tt.data._checkpoint import ARCHITECTURES, check_save_path


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--overwrite", action="store_true", help="replace a checkpoint at --out")
    p.add_argument("--dataset", default="cifar10_source")
    p.add_argument("--data-dir", default=None)
    p.add_argument("--test-dataset", default="cifar10_test")
    p.add_argument("--epochs", type=int, default=12)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--arch", default="SmallResNet", choices=("SmallResNet", "ResNet18"))
    p.add_argument("--widths", default="16,32,64", help="SmallResNet stage widths")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    try:  # before training: a folder that cannot take the checkpoint fails now, not at the end
        check_save_path(a.out, a.overwrite)
    except ValueError as err:
        fail(p, str(err))
    # a fresh user's --lr -1 trained and saved a checkpoint; --epochs 0, --batch-size 0 and
    # --widths 16,abc were tracebacks after the data loaded
    at_least(p, "--epochs", a.epochs, 1, integer=True)
    at_least(p, "--batch-size", a.batch_size, 1, integer=True)
    positive(p, "--lr", a.lr)
    try:
        widths = tuple(int(w) for w in a.widths.split(","))
    except ValueError:
        widths = (0,)
    if min(widths) < 1:
        fail(p, f"--widths takes a comma list of integers >= 1, got {a.widths!r}.")
    t0 = time.time()
    try:
        train = load_dataset(a.dataset, split="train", data_dir=a.data_dir)
        test = load_dataset(a.test_dataset, split="test", data_dir=a.data_dir)
    except ValueError as err:
        fail(p, str(err))
    if len(train.images) < a.batch_size:
        fail(p, f"--batch-size {a.batch_size} exceeds the {len(train.images)} training images "
                f"of {a.dataset}.")
    shape = (32, 32, 3)
    raw = train.images.astype(np.float32) / 255.0
    mean, std = raw.mean(axis=(0, 1, 2)), raw.std(axis=(0, 1, 2))
    x = np.asarray(prepare_images(train.images, shape, mean=mean, std=std))
    x_test = prepare_images(test.images, shape, mean=mean, std=std)
    kwargs = {"widths": list(widths)} if a.arch == "SmallResNet" else {}
    model = ARCHITECTURES[a.arch](len(train.class_names), rngs=nnx.Rngs(a.seed), **kwargs)
    steps_per_epoch = len(x) // a.batch_size
    schedule = optax.cosine_decay_schedule(a.lr, a.epochs * steps_per_epoch)
    opt = nnx.Optimizer(model, optax.adam(schedule), wrt=nnx.Param)

    @nnx.jit
    def step(model, opt, xb, yb):
        def loss_fn(m):
            return optax.softmax_cross_entropy_with_integer_labels(m(xb), yb).mean()

        loss, grads = nnx.value_and_grad(loss_fn)(model)
        opt.update(model, grads)
        return loss

    @nnx.jit
    def _accuracy(model, xs, ys):
        return jnp.mean(jnp.argmax(model(xs), -1) == ys)

    def accuracy(model, xs, ys):
        model.eval()  # ResNet18: frozen batch-norm statistics, as in fine-tuning
        acc = float(_accuracy(model, xs, ys))
        model.train()
        return acc

    rng = np.random.default_rng(a.seed)
    for epoch in range(a.epochs):
        perm = rng.permutation(len(x))
        bar = tqdm(range(steps_per_epoch), desc=f"epoch {epoch + 1}/{a.epochs}", leave=False)
        for i in bar:
            idx = perm[i * a.batch_size:(i + 1) * a.batch_size]
            flip = rng.random(len(idx)) < 0.5
            xb = np.where(flip[:, None, None, None], x[idx][:, :, ::-1], x[idx])
            loss = step(model, opt, jnp.asarray(xb), jnp.asarray(train.labels[idx]))
            bar.set_postfix(loss=f"{float(loss):.3f}")
        acc = accuracy(model, x_test, jnp.asarray(test.labels))
        print(f"epoch {epoch + 1}: last loss {float(loss):.3f}, source-test accuracy {acc:.4f}")
    seconds = time.time() - t0
    meta = {
        "architecture": a.arch, "kwargs": kwargs,
        "num_classes": len(train.class_names), "input_shape": list(shape),
        "mean": mean.tolist(), "std": std.tolist(), "class_names": list(train.class_names),
        "pretrain": {"dataset": a.dataset, "test_dataset": a.test_dataset, "epochs": a.epochs,
                     "batch_size": a.batch_size, "lr": a.lr, "seed": a.seed,
                     "optimizer": "adam + cosine decay, random horizontal flips",
                     "source_test_accuracy": acc, "wall_seconds": round(seconds, 1)},
    }
    path = save_checkpoint(a.out, model, meta, overwrite=a.overwrite)
    reloaded, _ = load_checkpoint(path)
    assert accuracy(reloaded, x_test, jnp.asarray(test.labels)) == acc
    print(json.dumps(meta["pretrain"]))
    print(f"wrote {path} in {seconds:.0f} s")


if __name__ == "__main__":
    main()
