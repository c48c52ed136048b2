"""Experiments: preference family (see README.md in this folder)."""
