"""The gRPC floor: a bare grpc.aio server answering one unary method by echoing the
request's bytes, with no interceptors, no servicer class and no (de)serialisation.

Run as `python -m bench.echo_server METHOD`; prints the bound port on stdout, then serves
until SIGTERM or SIGINT.
"""

from __future__ import annotations

import asyncio
import signal
import sys

import grpc


async def serve(method: str) -> None:
    service, name = method.strip("/").rsplit("/", 1)

    async def echo(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        return request

    server = grpc.aio.server()
    server.add_generic_rpc_handlers(
        [
            grpc.method_handlers_generic_handler(
                service, {name: grpc.unary_unary_rpc_method_handler(echo)}
            )
        ]
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    print(port, flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    await stop.wait()
    await server.stop(0)


if __name__ == "__main__":
    asyncio.run(serve(sys.argv[1]))
