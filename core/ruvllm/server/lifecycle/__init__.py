"""The request lifecycle every API surface shares: a neutral request (request_input: ChatInput,
RequestInput), into which each surface translates its own body, to a running submission
(start_chat, start_completion), its outputs read as neutral events (events, answer_events) that
each surface renders, its answer (stream, whole or 499), the model pool, parameters, embeddings
and the lane batch lines run through. No surface's routes or schemas live here, so each surface
imports it and none imports another."""
