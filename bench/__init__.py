"""Benchmarks: run with `make bench`; each module's `run()` returns its figures as a dict."""
