"""The asyncio client of hqueue servers (hqueue://): the engine, its groups, cursors and transport."""
