"""Side-by-side benchmark of cronoq against its Python peers: ``python -m bench.peers``.

See README.md in this directory for what is measured, how, and every setting.
"""
