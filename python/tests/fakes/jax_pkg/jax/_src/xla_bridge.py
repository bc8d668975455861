_backends = {}
init_calls = 0
POOL = 0.75 * 143771 * (1 << 20)  # XLA_PYTHON_CLIENT_MEM_FRACTION's default share


class _Device:
    def __init__(self, backend, index):
        self.id, self.platform, self.device_kind = index, "gpu", "NVIDIA H200"
        self._backend = backend
        self.in_use = self.peak = 0

    def memory_stats(self):
        return {
            "bytes_in_use": self.in_use,
            "peak_bytes_in_use": self.peak,
            "num_allocs": 3,
            "largest_alloc_size": self.in_use,
            "bytes_limit": int(POOL),
            "bytes_reserved": 0,
            "peak_bytes_reserved": 0,
            "largest_free_block_bytes": int(POOL) - self.in_use,
            "pool_bytes": int(POOL),
            "peak_pool_bytes": int(POOL),
        }


class _Backend:
    def __init__(self):
        self.devices = [_Device(self, 0)]

    def local_devices(self):
        return list(self.devices)

    def allocate(self, nbytes):
        d = self.devices[0]
        d.in_use += nbytes
        d.peak = max(d.peak, d.in_use)


def backend():
    global init_calls
    if "cuda" not in _backends:
        init_calls += 1
        _backends["cuda"] = _Backend()
    return _backends["cuda"]
