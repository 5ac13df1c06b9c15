"""The request lifecycle every API surface shares: a parsed body to a running submission (start_chat,
start_completion), its answer (stream, whole or 499), the model pool, parameters, formatters,
embeddings and the lane batch lines run through. No surface's routes live here, so each surface
imports it and none imports another."""
