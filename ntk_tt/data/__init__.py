"""Real image data, task sampling, minibatch order, the model convention, orbax checkpoints."""
