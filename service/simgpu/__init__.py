"""Simulated NVIDIA GPUs: a pynvml that reads a shared state, and processes that fill it.

vramd's end-to-end tests, and an operator trying vramd on a machine without a GPU, run
the real daemon on ``device.backend: nvml`` against GPUs that exist only in a JSON file
named by ``VRAMD_SIMULATED_GPUS``. With that variable set, ``service.devices`` imports
``service.simgpu.nvml`` in place of ``pynvml``, and the unchanged ``NvmlProbe`` reads
it; demo runtimes started with ``--gpu-memory`` hold "device memory" there on the
devices their ``CUDA_VISIBLE_DEVICES`` names, so placement, foreign processes, the
release lag after an exit, out-of-memory with free memory (fragmentation) and creep are
all seen through NVML's own calls. Its parts::

    state.py    the state file: devices, allocations, release lag, largest free block,
                scripted errors; locked, atomically replaced, settled against live pids
    cuda.py     what a process sees through CUDA: visible devices by CUDA_VISIBLE_DEVICES
                and CUDA_DEVICE_ORDER, allocations that fail with out-of-memory
    nvml.py     the pynvml surface NvmlProbe calls, with pynvml's own error classes
    cli.py      python -m service.simgpu init | hold | fail | show
    __main__.py ``python -m service.simgpu``: cli.main
"""

from service.simgpu.cuda import CudaError, CudaProcess, NoDevice, OutOfMemory, visible_devices
from service.simgpu.state import ENV, State, StateError, StateFile, new_state

__all__ = [
    "ENV",
    "CudaError",
    "CudaProcess",
    "NoDevice",
    "OutOfMemory",
    "State",
    "StateError",
    "StateFile",
    "new_state",
    "visible_devices",
]
