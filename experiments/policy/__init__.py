"""Experiments: policy family (see README.md in this folder)."""
