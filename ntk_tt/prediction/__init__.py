"""Model and data to predicted curves and T_ε: predict, the main job, subsets, intervals."""
