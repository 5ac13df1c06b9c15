"""A minimal complete ruvllm backend; read docs/writing-a-backend.md alongside it."""
