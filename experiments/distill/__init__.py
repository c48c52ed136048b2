"""Experiments: distill family (see README.md in this folder)."""
