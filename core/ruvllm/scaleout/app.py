"""Build and run the Ray Serve application of ``ruvllm serve --ray``.

One application per model: ``<name>-replicas`` (``EngineReplica``: a ServingEngine each, routed
by ``PrefixAffinityRouter``; ``num_replicas`` or ``autoscaling_config``, ``ray_actor_options``)
and ``<name>-ingress`` (the OpenAI app of ``ruvllm serve`` over a ``RemoteEngine``). Serve's HTTP
proxy listens on ``[server] host/port`` (127.0.0.1:8000 unless configured otherwise).

Routing choice: Serve's pluggable ``RequestRouter`` (``request_router_config``) rather than
routing in the proxy engine. A DeploymentHandle cannot address one replica, so routing in the
proxy would need one deployment per replica, losing Serve's autoscaling, health checks and
restarts of a single deployment; the router keeps all of that and sees every request's
arguments (the prefix key) and Serve's per-replica queue lengths.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping
from typing import Any, ClassVar

import attrs

from ruvllm.config import Config
from ruvllm.engine.options import EngineOptions
from ruvllm.options import positive_int
from ruvllm.scaleout.metrics_board import HEAD_RESOURCE, start_board
from ruvllm.scaleout.remote_engine import RemoteEngine
from ruvllm.scaleout.replica import EngineReplica
from ruvllm.scaleout.serve_env import PROXY_ENV, SERVE_ENV
from ruvllm.scaleout.tokenizer_host import load_tokenizer_backend


@attrs.frozen(kw_only=True)
class ScaleOutSettings:
    """How the model is spread over Ray: replica count or autoscaling, resources, routing."""

    TABLE: ClassVar[str] = "ray"

    #: Application name (also prefixes the deployments and the metrics board).
    name: str = "ruvllm"
    replicas: int = attrs.field(default=1, validator=positive_int())
    #: Serve ``autoscaling_config`` (min_replicas, max_replicas, target_ongoing_requests...);
    #: when given it replaces ``replicas``.
    autoscaling_config: Mapping[str, Any] | None = None
    #: Resources of one replica, e.g. ``{"num_cpus": 1}`` or ``{"num_gpus": 1}``.
    ray_actor_options: Mapping[str, Any] = attrs.field(factory=lambda: {"num_cpus": 1})
    #: The ingress does no model work (tokenizer calls only). It stays on the head node, beside
    #: Serve's controller and HTTP proxy: a worker node lost then takes only its replicas.
    ingress_actor_options: Mapping[str, Any] = attrs.field(
        factory=lambda: {"num_cpus": 0, "resources": {HEAD_RESOURCE: 0.001}})
    #: Requests one replica takes before Serve queues them in the router (Serve's default, 5, is
    #: below one engine's batch).
    max_ongoing_requests: int = attrs.field(default=32, validator=positive_int())
    #: Prefix affinity: how many leading KV blocks make a request's key (see prefix_key).
    affinity_blocks: int = attrs.field(default=3, validator=positive_int())
    #: Ongoing requests from which the key's home replica counts as busy.
    busy_threshold: int = attrs.field(default=4, validator=positive_int())
    #: Resends of a request whose replica died before it produced a token.
    retries: int = 1
    #: Route by prompt prefix (PrefixAffinityRouter); False keeps Serve's default router (power
    #: of two choices), the baseline of benchmarks/ray_serve.py, under which /v1/feedback cannot
    #: be sent to the replica that served the request.
    prefix_affinity: bool = True
    #: Environment of the ingress's and replicas' processes (added to their ``runtime_env``): Serve's
    #: latency settings (``serve_env.SERVE_ENV``).
    serve_env: Mapping[str, str] = attrs.field(factory=lambda: dict(SERVE_ENV))
    #: Route each tenant's requests (OpenAI ``user``, Anthropic ``metadata.user_id``) to one
    #: replica, where SONA learns that tenant's adapter; None: when ``[sona]`` is enabled.
    tenant_affinity: bool | None = None


@attrs.frozen(kw_only=True)
class _IngressArgs:
    config: Config
    served_name: str | None
    max_context: int | None
    scale: ScaleOutSettings
    board_name: str


class OpenAIIngress:
    """Serve ingress: the unchanged ``create_app`` over a RemoteEngine (plus ``/ray/replicas``)."""

    async def __init__(self, replicas: Any, args: _IngressArgs):
        self._args = args
        board = start_board(args.board_name)
        description = await replicas.describe.remote()
        baseline = await replicas.metrics.remote()
        # The replicas' own backend, not the config's name: `auto` may have picked by what
        # `ruvllm tune` measured for their load, and the tokenizer must be the one they use.
        owner = await asyncio.to_thread(load_tokenizer_backend, args.config, description.backend_name)
        options = EngineOptions.from_mapping(args.config.engine)
        self.engine = RemoteEngine(replicas, description, owner.tokenizer, options=options,
                                   affinity_blocks=args.scale.affinity_blocks, retries=args.scale.retries,
                                   board=board, baseline=baseline, owner=owner,
                                   tenant_affinity=_tenant_affinity(args.config, args.scale))

    def __serve_build_asgi_app__(self) -> Any:
        from ruvllm.server.app import create_app
        from ruvllm.server.runner import settings_for

        a = self._args
        settings = settings_for(a.config, self.engine, served_name=a.served_name, max_context=a.max_context)
        app = create_app(self.engine, settings)
        engine = self.engine
        _route_feedback_to_replicas(app, engine)

        @app.get("/ray/replicas")
        async def replicas() -> dict[str, Any]:
            """Per-replica engine counters (latest report of each replica, dead ones included),
            and this ingress's resends and mid-stream failures after replica deaths."""
            latest = await engine.refresh_metrics()
            return {"ingress": {"resent": engine.resent, "died_mid_stream": engine.died_mid_stream},
                    "replicas": [
                {"replica_id": m.replica_id, "pid": m.pid, "node_ip": m.node_ip, "feedback": m.feedback,
                 "reported_at": m.reported_at,
                 "prefix_cache_queries": m.snapshot.prefix_cache_queries,
                 "prefix_cache_hits": m.snapshot.prefix_cache_hits,
                 "prompt_tokens": m.snapshot.prompt_tokens,
                 "generation_tokens": m.snapshot.generation_tokens,
                 "requests_finished": m.snapshot.requests_finished,
                 "running": m.snapshot.running, "waiting": m.snapshot.waiting}
                for m in sorted(latest.values(), key=lambda m: m.replica_id)]}

        return app


def _route_feedback_to_replicas(app: Any, engine: RemoteEngine) -> None:
    """``POST /v1/feedback`` awaiting ``RemoteEngine.feedback``'s delivery to the replica that
    served the request. The app's own route hands the score to its engine as a call that returns
    nothing to wait for (an in-process learning plugin records it at once), so it is replaced
    here rather than made to wait on every server."""
    from ruvllm.server.extensions.feedback import register_feedback

    app.router.routes[:] = [r for r in app.router.routes if getattr(r, "path", None) != "/v1/feedback"]
    register_feedback(app, engine.feedback)


def _with_env(options: Mapping[str, Any], env: Mapping[str, str]) -> dict[str, Any]:
    """Ray actor options with ``env`` under their ``runtime_env``'s env_vars (those given win)."""
    if not env:
        return dict(options)
    runtime_env = dict(options.get("runtime_env") or {})
    runtime_env["env_vars"] = {**env, **(runtime_env.get("env_vars") or {})}
    return {**options, "runtime_env": runtime_env}


def _tenant_affinity(config: Config, scale: ScaleOutSettings) -> bool:
    if scale.tenant_affinity is not None:
        return scale.tenant_affinity
    return bool((config.sona or {}).get("enabled", False))


def build_app(config: Config, scale: ScaleOutSettings | None = None, *, served_name: str | None = None,
              max_context: int | None = None) -> Any:
    """The Serve application (``serve.run`` it) for ``config``'s model."""
    from ray import serve
    from ray.serve.config import RequestRouterConfig

    from ruvllm.scaleout.serve_router import PrefixAffinityRouter

    scale = scale or ScaleOutSettings()
    board_name = f"{scale.name}-metrics"
    sizing: dict[str, Any] = {"autoscaling_config": dict(scale.autoscaling_config)} \
        if scale.autoscaling_config else {"num_replicas": scale.replicas}
    if scale.prefix_affinity:
        sizing["request_router_config"] = RequestRouterConfig(
            request_router_class=PrefixAffinityRouter,
            request_router_kwargs={"busy_threshold": scale.busy_threshold})
    replica = serve.deployment(EngineReplica).options(
        name=f"{scale.name}-replicas", ray_actor_options=_with_env(scale.ray_actor_options, scale.serve_env),
        max_ongoing_requests=scale.max_ongoing_requests, **sizing)
    ingress_cls = serve.ingress()(OpenAIIngress)
    ingress = serve.deployment(ingress_cls).options(
        name=f"{scale.name}-ingress", max_ongoing_requests=1024,
        ray_actor_options=_with_env(scale.ingress_actor_options, scale.serve_env))
    args = _IngressArgs(config=config, served_name=served_name, max_context=max_context, scale=scale,
                        board_name=board_name)
    return ingress.bind(replica.bind(config, board_name), args)


def init_ray(num_cpus: int | None = None) -> None:
    """Join ``$RAY_ADDRESS`` when set, else start a local Ray instance (no dashboard) whose
    processes, Serve's HTTP proxy among them, get ``PROXY_ENV`` where this environment does not
    set those variables (a cluster's head gets them from its own ``ray start``'s environment)."""
    import ray

    if ray.is_initialized():
        return
    address = os.environ.get("RAY_ADDRESS")
    if address:
        ray.init(address=address, log_to_driver=False)
    else:
        for key, value in PROXY_ENV.items():
            os.environ.setdefault(key, value)
        ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=False)


def serve_on_ray(config: Config, scale: ScaleOutSettings, *, served_name: str | None = None,
                 max_context: int | None = None) -> None:
    """What ``ruvllm serve --ray`` does: start (or join) Ray, run the app, block until Ctrl-C."""
    from ray import serve

    from ruvllm.server.runner import check_port_free

    srv = config.server
    check_port_free(srv.host, srv.port)
    init_ray()
    # One HTTP entry, on the head with the ingress (a proxy on every node would only forward to it).
    serve.start(http_options={"host": srv.host, "port": srv.port}, proxy_location="HeadOnly")
    app = build_app(config, scale, served_name=served_name, max_context=max_context)
    serve.run(app, name=scale.name, route_prefix="/", blocking=True)
