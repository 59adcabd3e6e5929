"""Hardware fakes for tests: they stand in for the driver (pynvml's functions) and for the `dcgmi` executable, nothing above."""
