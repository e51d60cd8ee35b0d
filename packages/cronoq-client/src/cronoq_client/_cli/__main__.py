"""``python -m cronoq_client._cli``: the ``cronoq`` command without its script."""

from cronoq_client._cli import main

main()
