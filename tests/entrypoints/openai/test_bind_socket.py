"""The server's listening socket: accepted connections get TCP_NODELAY from asyncio (no delayed-ACK stalls)."""

from __future__ import annotations

import asyncio
import socket

from brigade.entrypoints.openai.api_server import bind_socket


def test_accepted_connections_have_tcp_nodelay():
    async def main() -> int:
        sock = bind_socket("127.0.0.1", 0)
        seen: asyncio.Future = asyncio.get_running_loop().create_future()

        def on_connect(reader, writer) -> None:
            conn = writer.get_extra_info("socket")
            seen.set_result(conn.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            writer.close()

        server = await asyncio.start_server(on_connect, sock=sock)
        async with server:
            _, writer = await asyncio.open_connection(*sock.getsockname())
            nodelay = await asyncio.wait_for(seen, 10)
            writer.close()
        return nodelay

    assert asyncio.run(main()) != 0
