"""ruvllm's MLX backend: a compact Llama-family forward pass in MLX.

Runs on the Metal GPU of Apple Silicon and on the CPU elsewhere (``mlx[cpu]`` on Linux). The
engine-facing pieces are :class:`ruvllm_mlx.backend.MlxBackend` (request level) and
:class:`ruvllm_mlx.executor.MlxBatchExecutor` (iteration level). Nothing here imports MLX at
package import, so a machine without MLX still lists the backend with its reason.
"""

from ruvllm_mlx.cpu_blas import preload as _preload_blas

# Before anything imports MLX: let its CPU matmul use an optimized sgemm_ (see cpu_blas).
_preload_blas()
