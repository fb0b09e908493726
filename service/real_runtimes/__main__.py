"""``python -m service.real_runtimes install | show | exec KIND --port P``.

``install`` is ``make real-runtimes``; ``show`` prints ``runtimes.json``'s commands;
``exec`` replaces itself with one kind's runtime (``config/real.yaml`` starts them so).
"""

import sys

from service.real_runtimes.launch import main

if __name__ == "__main__":
    sys.exit(main())
