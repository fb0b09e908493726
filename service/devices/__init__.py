"""Device probes: how much accelerator (or host) memory there is, and who holds it.

``create_probe`` picks the backend; ``DeviceProbe`` is all the rest of vramd depends on.
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
