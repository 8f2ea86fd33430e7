"""Bridges to other libraries. Each module imports its library only when it is imported."""
