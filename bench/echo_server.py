"""The gRPC floor: a bare grpc.aio server answering one unary method by echoing the
request's bytes, with no interceptors, no servicer class and no (de)serialisation.

Run as `python -m bench.echo_server METHOD`; prints the bound port on stdout, then serves
until SIGTERM or SIGINT.
"""

from __future__ import annotations

import asyncio
import sys

import grpc

from bench.baseline_servers import serve_until_signalled


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
    await serve_until_signalled(server)


if __name__ == "__main__":
    asyncio.run(serve(sys.argv[1]))
