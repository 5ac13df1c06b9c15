"""Pure-PyTorch reference backend for ruvllm."""
