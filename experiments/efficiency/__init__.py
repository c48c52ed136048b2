"""Experiments: efficiency family (see README.md in this folder)."""
