"""The edge: what every door does with a call, written once, without any door's types.

Every RPC and every HTTP route is one `Call` (`calls`), made by the house's `Reception` as
it arrives, with its method's facts from the one table both doors read (`methods`: its
scope, whether it is inference, the field naming its model): it finds who is calling
(`authentication`), the tenant and priority hint it runs as (`tenancy`: the inference
gateway's headers), checks model permission before any lookup, keeps its span
(`tracing`), joins the core's record of its request, counts it in its door's series and
writes its one access line (`access`). A domain error becomes a canonical code and a
bounded answer in one table (`errors`), the core's field violations named as the caller
sent them; the `server.tls` files both doors serve are read and checked in
`certificates`. A door only reads its own wire
(headers, metadata, certificates) and writes its own answers.
"""
