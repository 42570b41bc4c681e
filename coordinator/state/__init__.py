"""The farm's state: the Redis store (every state change one Lua script in `lua/`), its read side,
the blob files on the coordinator's disk and the embedded Redis server. Knows no planner."""
