"""llama-server's API surface: /completion, /infill, /apply-template, /props, /slots, its embeddings."""
