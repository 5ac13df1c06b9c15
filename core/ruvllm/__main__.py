"""``python -m ruvllm``: the same CLI as the ``ruvllm`` command."""

from ruvllm.cli import main

if __name__ == "__main__":
    main()
