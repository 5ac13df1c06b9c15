"""Anthropic's API surface: the Messages API, count_tokens and Message Batches."""
