"""The fake torch._C: the one binding the agent calls directly."""


def _cuda_attach_out_of_memory_observer(observer):
    from . import cuda

    cuda._fake.init()  # as torch: at::globalContext().lazyInitDevice(CUDA)
    cuda._fake.oom_observers.append(observer)
