"""Benchmarks: each connector measured side by side with what users would use instead."""
