"""inferwire: a gRPC inference service with pluggable backends."""

__version__ = "0.1.0"
