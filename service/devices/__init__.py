"""Device probes: how much accelerator (or host) memory there is, and who holds it.

``create_probe`` picks the backend; ``DeviceProbe`` is all the rest of vramd depends on.

base.py        DeviceProbe (read, placement_env) and create_probe, which picks the backend
host.py        HostProbe: the machine's RAM as device 0, for machines without a GPU
nvml.py        NvmlProbe: NVIDIA GPUs through pynvml (memory info v2, per-pid usage)
amdsmi.py      AmdsmiProbe: AMD GPUs and APUs (VRAM + GTT) through ROCm's amdsmi
gpu_shared.py  what both GPU probes share: selected (device.gpus), LastGood readings
tree.py        process trees and their host memory (PSS): sample_trees, Footprints
"""

from service.devices.amdsmi import AmdsmiProbe, AmdsmiUnavailable
from service.devices.base import DeviceProbe, create_probe
from service.devices.host import HostProbe
from service.devices.nvml import NvmlProbe, NvmlUnavailable

__all__ = [
    "AmdsmiProbe",
    "AmdsmiUnavailable",
    "DeviceProbe",
    "HostProbe",
    "NvmlProbe",
    "NvmlUnavailable",
    "create_probe",
]
