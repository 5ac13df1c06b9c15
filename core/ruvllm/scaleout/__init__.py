"""Scale-out of ``ruvllm serve`` on Ray Serve (the optional ``ruvllm[ray]`` extra).

One Serve application per model: a replica deployment whose replicas each own a real
:class:`ruvllm.engine.ServingEngine` (``replica``), the ingress (the ``ruvllm serve --ray``
process itself) serving the unchanged OpenAI app (``ruvllm.server.app.create_app``) over a proxy
engine (``remote_engine``), and a Serve request router that sends prompts sharing their first
KV blocks to the same replica (``prefix_router`` holds the policy, ``serve_router`` plugs it into
Serve). ``app`` builds and runs it. Only ``prefix_router`` and ``wire`` import without Ray installed.
"""
