"""Server halves of the algorithms, one per module."""
