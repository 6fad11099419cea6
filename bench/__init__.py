"""Benchmarks of T1's planes: each prints a table and writes JSON with --out (see bench/README.md)."""
