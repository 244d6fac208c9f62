"""siphon's Python error type."""


class DatasetError(ValueError):
    """A dataset that cannot be read as asked: a missing run.json or manifest, an unknown hook,
    a bad rank, a shard that does not match its manifest line. The message names what is wrong."""
