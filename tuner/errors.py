"""User-facing errors: each carries one line that the CLI prints as is."""


class TunerError(Exception):
    """An error caused by input or environment, reported without a traceback."""


class NoGpuError(TunerError):
    """No usable CUDA GPU (or pycuda) on this machine."""
