"""OpenAI's API surface beyond chat and completions' routes (in app.py): their delivery, stored chat
completions, the Responses and Conversations APIs."""
