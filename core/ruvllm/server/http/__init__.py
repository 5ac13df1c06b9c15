"""What every surface shares on the wire, beneath the lifecycle: error shapes, body limits, SSE, strict JSON
bodies, path aliases, field-name tables and cursor pages. Imports nothing else of the server."""
