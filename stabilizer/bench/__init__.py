"""Benchmarks: remediation (``python -m stabilizer.bench``), calibration against the corpus,
latency and in-job overhead. Each is run as a module; none is imported by the client."""
