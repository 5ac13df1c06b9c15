"""ruvllm's MLX backend: a compact Llama-family forward pass in MLX.

Runs on the Metal GPU of Apple Silicon and on the CPU elsewhere (``mlx[cpu]`` on Linux). The
engine-facing pieces are :class:`ruvllm_mlx.backend.MlxBackend` (request level) and
:class:`ruvllm_mlx.executor.MlxBatchExecutor` (iteration level). Nothing here imports MLX at
package import, so a machine without MLX still lists the backend with its reason, and a process
serving another backend never loads MLX or its BLAS (MLX is imported through
:mod:`ruvllm_mlx.mlx_core`).
"""
