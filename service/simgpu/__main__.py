"""``python -m service.simgpu``: init, hold, fail, show (see ``service.simgpu.cli``)."""

import sys

from service.simgpu.cli import main

if __name__ == "__main__":
    sys.exit(main())
