"""``python -m service.cli``: the ``vramd`` command, as the tests and ``make`` run it."""

from service.cli import main

main()
