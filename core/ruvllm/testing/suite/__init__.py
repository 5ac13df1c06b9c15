"""The conformance tests, one module per part of the backend contract.

- ``test_kv_reset``: request isolation, the bug that broke ruvllm's ancestor (KV state kept
  across ``generate()`` calls);
- ``test_sampling``: greedy determinism, seeded sampling;
- ``test_outputs``: streaming, max_tokens, stop strings, stop ids, EOS, usage, logprobs;
- ``test_tokenizer``: round trips and special tokens;
- ``test_errors``: bad input gives typed errors and leaves the backend healthy.

Every test takes ``ruvllm_llm`` (one loaded model per backend per session, see
:mod:`ruvllm.testing.pytest_plugin`) and skips with a stated reason when a capability it needs
is absent.
"""
