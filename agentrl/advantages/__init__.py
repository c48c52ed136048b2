"""Advantages: outcome estimators (estimators), the efficiency methods' (efficiency), and the
seed methods' reshaping of rewards and advantages (shaping, exploration)."""
