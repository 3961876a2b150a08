"""Function-space training dynamics from a given Θ (closed form, ODE, SDE, discrete) and T_ε."""
