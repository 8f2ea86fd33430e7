"""Operators. Each is a folder: a plain reference beside its kernels and one interface."""
