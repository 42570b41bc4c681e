"""The engine's pure rules and math (numpy, tables, headers; no model library): the only engine modules the coordinator may import."""
