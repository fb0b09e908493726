"""Check vramd's view of a real NVIDIA GPU: ``python -m service.gpucheck [--json]``.

checks.py    GpuCheck: context, attribution, device used, process tree, foreign, settle
children.py  the processes that allocate a known amount and hold it (torch, cupy, simgpu)
__main__.py  the command: run the checks, print the table or JSON, or be a child
"""
