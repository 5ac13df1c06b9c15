"""OpenAI's Batch and Files APIs, and the batch lane both batch APIs run their lines through."""
