"""OpenAI's API surface: chat, completions and embeddings' routes, their JSON and chunks and their
delivery, stored chat completions, the Responses and Conversations APIs."""
