"""dscluster: turn a set of machines into a working multi-node DeepSpeed cluster."""

__version__ = "0.2.0"
