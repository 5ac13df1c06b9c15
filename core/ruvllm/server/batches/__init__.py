"""OpenAI's Batch and Files APIs, and its batch file format (also read by ``ruvllm run-batch``)."""
