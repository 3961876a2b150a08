"""Empirical NTK Θ = J Jᵀ of the linearised network: exact, sketched, sharded, head-aware."""
