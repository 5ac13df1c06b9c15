"""Relevance scoring (vLLM's /score, the rerank endpoints) and Cohere's embed API."""
