"""``python -m service.demo_runtime --port P [flags]``: run the demo runtime."""

import sys

from service.demo_runtime.process import main

if __name__ == "__main__":
    sys.exit(main())
