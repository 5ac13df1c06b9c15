"""The server's own routes beside the APIs it speaks: metrics, LoRA loading, feedback, tokenizer info."""
