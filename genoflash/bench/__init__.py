"""Benchmarks and demonstrations. Depends on genoflash's ops; nothing depends on it."""
