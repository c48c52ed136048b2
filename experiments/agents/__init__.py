"""Experiments: agents family (see README.md in this folder)."""
