"""A process's own peak as NVML lists it per process, sampled on a thread (issue 36).

    peak = NvmlPeak("GPU-...")   # the UUID of the GPU this process computes on
    peak.start()
    ...                          # the job
    figures = peak.stop()        # {"nvml_peak_bytes", "nvml_other_gpus_peak_bytes", ...}

The figure is NVML's usedGpuMemory for this PID (what nvidia-smi shows per process),
sampled every NVML_INTERVAL_S as `vramctl run --interval 20ms` samples a single-GPU case:
the peak on the process's own GPU, and apart from it the peak of what it holds on every
other GPU together (a CUDA context made there by mistake is memory the job holds too).
`nvml_peak_bytes` is None when NVML never listed the process on its GPU (another PID
namespace, say), so that no zero is taken for a measurement. Needs pynvml (nvidia-ml-py).
"""
import os
import threading

NVML_INTERVAL_S = 0.02


class NvmlPeak:
    def __init__(self, uuid, pid=None, interval_s=NVML_INTERVAL_S):
        import pynvml
        self.nvml = pynvml
        pynvml.nvmlInit()
        self.handles = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            u = pynvml.nvmlDeviceGetUUID(h)
            self.handles.append((u.decode() if isinstance(u, bytes) else u, h))
        if uuid not in [u for u, _ in self.handles]:
            pynvml.nvmlShutdown()
            raise SystemExit(f"error: NVML lists no GPU '{uuid}' (it lists {', '.join(u for u, _ in self.handles)})")
        self.uuid = uuid
        self.pid = os.getpid() if pid is None else pid
        self.interval_s = interval_s
        self.peak_bytes = 0
        self.other_gpus_peak_bytes = 0
        self.samples = 0
        self.listed = 0
        self.errors = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="nvml-peak", daemon=True)

    def sample(self):
        own = other = 0
        listed = False
        for u, h in self.handles:
            try:
                procs = self.nvml.nvmlDeviceGetComputeRunningProcesses(h)
            except self.nvml.NVMLError:
                self.errors += 1
                continue
            for proc in procs:
                used = proc.usedGpuMemory
                if proc.pid != self.pid or used is None:
                    continue
                if u == self.uuid:
                    own += used
                    listed = True
                else:
                    other += used
        self.samples += 1
        self.listed += listed
        self.peak_bytes = max(self.peak_bytes, own)
        self.other_gpus_peak_bytes = max(self.other_gpus_peak_bytes, other)

    def _loop(self):
        while not self._stop.wait(self.interval_s):
            self.sample()

    def start(self):
        self.sample()
        self._thread.start()

    def stop(self):
        self._stop.set()
        if self._thread.ident is not None:
            self._thread.join()
        self.sample()
        self.nvml.nvmlShutdown()
        return {"nvml_peak_bytes": self.peak_bytes if self.listed else None,
                "nvml_other_gpus_peak_bytes": self.other_gpus_peak_bytes,
                "nvml_samples": self.samples, "nvml_listed_samples": self.listed,
                "nvml_errors": self.errors}
