"""The game server that ``coroutine_game.py`` plays, a program of its own (standard library only).

A walker on a line, one per TCP connection: ``RESET seed`` starts it at a random place in
[-3, 3], ``STEP a`` moves it by ``a - 1``; the episode ends at |x| >= 5 (reward +1 at +5, -1
at -5). Every reply comes after a random 5-15 ms, standing in for a real server's latency.
It serves on a free loopback port, prints the port on its first line, and runs until killed:

    python examples/game_server.py
"""

from __future__ import annotations

import asyncio
import random


async def play(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """One connection's game: a line per request, ``x reward done`` per reply."""
    x = 0
    try:
        while line := await reader.readline():
            cmd, arg = line.decode().split()
            await asyncio.sleep(random.uniform(0.005, 0.015))
            if cmd == "RESET":
                x = random.Random(None if arg == "-" else int(arg)).randint(-3, 3)
                writer.write(f"{x} 0 0\n".encode())
            else:
                x += int(arg) - 1
                done = abs(x) >= 5
                writer.write(f"{x} {int(done) * (1 if x > 0 else -1)} {int(done)}\n".encode())
            await writer.drain()
    except ConnectionError:  # the client left with a step in flight (its collector shut down)
        pass
    finally:
        writer.close()


async def serve() -> None:
    """Serve the game on a free loopback port, print the port, run until killed."""
    server = await asyncio.start_server(play, "127.0.0.1", 0)
    print(server.sockets[0].getsockname()[1], flush=True)
    await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(serve())
