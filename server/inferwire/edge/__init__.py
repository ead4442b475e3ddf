"""The edge: what every transport does with a call, written once, without its types.

gRPC (`inferwire.api`) and any other door into the core call the same code to find
who is calling (`callers`), to turn a domain error into a status and a bounded message
(`errors`), and to write the call's one access line (`access`). The scope a method
needs, the tenant and priority a request runs under and the request's record are the
core's (`core.auth`, `core.tenants`, `core.record`); a transport only reads its own
wire (headers, metadata, certificates) and writes its own answers.
"""
