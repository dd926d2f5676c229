"""A Flower app whose model updates travel as mucsc messages (see README.md beside this package)."""
