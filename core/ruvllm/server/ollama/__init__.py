"""Ollama's API surface: /api/chat, /api/generate, the model listings and embeddings."""
