"""The fake CUDA graphs: capture state per graph, thread-local 'current stream' semantics
for is_current_stream_capturing (as in torch, where current streams are per thread)."""

import threading

_capturing = set()  # graphs with a capture underway


class _CUDAGraph:
    """Stands for torch._C._CUDAGraph, the C++ base class."""

    def __init__(self, keep_graph=False):
        self._thread = None
        self._invalidated = False
        self._captured = False

    def capture_begin(self, pool=None, capture_error_mode="global"):
        from . import _fake

        _fake.init()
        if self in _capturing:
            raise RuntimeError("capture already underway")
        self._thread = threading.get_ident()
        self._invalidated = False
        _capturing.add(self)

    def capture_end(self):
        if self not in _capturing:
            raise RuntimeError("no capture underway")
        _capturing.discard(self)
        if self._invalidated:
            raise RuntimeError("CUDA error: operation failed due to a previous error during capture")
        self._captured = True

    def replay(self):
        if not self._captured:
            raise RuntimeError("nothing captured")


class CUDAGraph(_CUDAGraph):
    def capture_begin(self, pool=None, capture_error_mode="global"):
        super().capture_begin(pool=pool, capture_error_mode=capture_error_mode)

    def capture_end(self):
        super().capture_end()


class graph:
    def __init__(self, cuda_graph, pool=None, stream=None, capture_error_mode="global"):
        self.cuda_graph = cuda_graph
        self.pool = pool
        self.capture_error_mode = capture_error_mode

    def __enter__(self):
        self.cuda_graph.capture_begin(self.pool, capture_error_mode=self.capture_error_mode)

    def __exit__(self, *exc):
        self.cuda_graph.capture_end()


def is_current_stream_capturing():
    me = threading.get_ident()
    return any(g._thread == me for g in _capturing)
