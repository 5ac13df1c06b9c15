"""What the pytest runs this suite starts as children (conformance suites, the crash test's
inner xdist run) turn off: plugins installed for this project's own tests that no child uses.
schemathesis's imports hypothesis, and pytest assertion-rewrites all 230 modules of both at each
start; with langsmith's, 2.2 s of CPU per child start-up (2.9 s -> 0.7 s). Not for the xdist
workers themselves: test_schema_fuzz.py needs schemathesis."""

SKIP_UNUSED_PLUGINS = "-p no:langsmith_plugin -p no:schemathesis -p no:anyio -p no:hypothesispytest"
