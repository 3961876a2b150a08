import time

import jax
import jax.numpy as jnp

from ntk_tt.training._timing import Stopwatch


def test_stopwatch_separates_compilation_from_running():
    @jax.jit
    def f(x):
        for _ in range(30):  # a program big enough that compiling it takes measurable time
            x = jnp.sin(x) @ x.T / x.shape[0]
        return x

    x = jnp.ones((64, 64))
    with Stopwatch() as first:
        jax.block_until_ready(f(x))
    with Stopwatch() as second:
        jax.block_until_ready(f(x))
        time.sleep(0.05)
    assert first.compile_seconds > 0.0  # the first call traced, lowered and compiled f
    assert second.compile_seconds == 0.0  # the second reused the executable
    assert 0.05 <= second.seconds < 0.05 + 1.0  # the sleep is run time, not compile time
