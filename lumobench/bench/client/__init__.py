"""The replay client's own benchmark (`lumobench bench client`, `command.py`) and the scripted SSE
server it streams from (`scripted_server.py`, also the harness tests' stand-in engine)."""
