"""Wire facts of the protocols inferwire speaks besides its own: names, datatypes and
encodings that the api and backends layers both need. A leaf below both: it imports the
standard library only, never inferwire.api, core or backends.

Modules: `oip` (the Open Inference Protocol, KServe v2 gRPC as Triton speaks it).
"""
