"""A stand-in for `torch` at the agent's boundary (tests only): the `torch.cuda` calls the
agent makes, over a small model of the CUDA caching allocator with its real rules (block
rounding to 512 B, the small/large pools, 2 MiB / 20 MiB / 2 MiB-rounded segments, best fit
with splitting, coalescing of free neighbours, empty_cache returning only wholly free
segments, the retry-after-freeing-the-cache path and OOMs), so that the classic pinned
segment (a 4 MiB tensor placed inside a cached 8 GiB block) happens here as it does on a
GPU. Sizes in bytes; no memory is allocated.

Tests drive it like torch: `torch.empty(n, dtype=torch.uint8, device="cuda")`, `del t`,
`torch.cuda.CUDAGraph().capture_begin()`. `torch.cuda._fake` exposes the model's state
(calls counted, captures invalidated) for assertions.
"""

__version__ = "2.11.0+fake"

from . import version  # noqa: E402
from . import cuda  # noqa: E402
from . import _C  # noqa: E402,F401


class dtype:
    def __init__(self, name, itemsize):
        self.name, self.itemsize = name, itemsize

    def __repr__(self):
        return f"torch.{self.name}"


uint8 = dtype("uint8", 1)
float16 = dtype("float16", 2)
bfloat16 = dtype("bfloat16", 2)
float32 = dtype("float32", 4)


class Tensor:
    """A tensor whose elements all hold one value (enough for the checks the tests and the
    GPU script's smoke run make)."""

    def __init__(self, block, numel, dtype_, value=0):
        self._block = block
        self._numel = numel
        self.dtype = dtype_
        self.value = value

    def fill_(self, value):
        self.value = value
        return self

    def __mul__(self, k):
        return _new(self._numel, self.dtype, self._block.segment.device, self.value * k)

    def __eq__(self, other):
        return _Scalar(self.value == other)

    def all(self):
        return _Scalar(bool(self.value))

    def sum(self):
        return _Scalar(self.value * self._numel)

    def __repr__(self):
        return f"tensor(<{self._numel} x {self.value}>, device='cuda')"

    @property
    def nbytes(self):
        return self._numel * self.dtype.itemsize

    def numel(self):
        return self._numel

    def __del__(self):
        block, self._block = self._block, None
        if block is not None:
            cuda._free(block)


class _Scalar:
    def __init__(self, value):
        self.value = value

    def all(self):
        return self

    def item(self):
        return self.value


def _new(numel, dtype_, index, value):
    return Tensor(cuda._malloc(index, numel * dtype_.itemsize), numel, dtype_, value)


def ones(*size, dtype=None, device="cuda"):
    return empty(*size, dtype=dtype, device=device).fill_(1)


def empty(*size, dtype=None, device="cuda"):
    dtype = dtype or float32
    numel = 1
    for s in size:
        numel *= int(s)
    device = str(device)
    index = int(device.split(":", 1)[1]) if ":" in device else 0
    if not device.startswith("cuda"):
        raise RuntimeError("the fake torch only allocates on cuda")
    block = cuda._malloc(index, numel * dtype.itemsize)
    return Tensor(block, numel, dtype)
