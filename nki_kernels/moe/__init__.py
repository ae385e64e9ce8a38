"""Mixture-of-Experts layer: NKI router, token grouping and blockwise expert MLP."""
