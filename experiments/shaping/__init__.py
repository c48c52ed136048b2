"""Experiments: shaping family (see README.md in this folder)."""
