"""A stand-in for `tensorflow` at the agent's boundary (tests only): an eager context that
starts on first use (as TensorFlow's maps the GPUs' memory then) and the
`tf.config.experimental` memory calls."""

__version__ = "2.20.0+fake"

from .python.eager import context as _context  # noqa: E402


class _LogicalDevice:
    def __init__(self, name):
        self.name, self.device_type = name, "GPU"


class _Experimental:
    def __init__(self):
        self.current, self.peak = 0, 0

    def get_memory_info(self, device):
        _context.context().ensure_initialized()
        if device != "GPU:0":
            raise ValueError(f"no device {device!r}")
        return {"current": self.current, "peak": self.peak}

    def reset_memory_stats(self, device):
        _context.context().ensure_initialized()
        self.peak = self.current


class _Config:
    def __init__(self):
        self.experimental = _Experimental()

    def list_logical_devices(self, device_type=None):
        _context.context().ensure_initialized()
        return [_LogicalDevice("/device:GPU:0")]


config = _Config()


def constant(nbytes):
    """Stands for a tensor on the GPU: starts the context, counted in `current`."""
    _context.context().ensure_initialized()
    config.experimental.current += nbytes
    config.experimental.peak = max(config.experimental.peak, config.experimental.current)
