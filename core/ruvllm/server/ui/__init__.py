"""The chat page: static files a browser loads from ``/`` or ``/ui``, and the middleware that serves them."""
