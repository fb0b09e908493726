"""Request traces for ``bench.replay``: the seeded generator and the committed traces."""
