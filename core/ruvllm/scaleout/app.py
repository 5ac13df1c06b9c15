"""Build and run ``ruvllm serve --ray``: engine replicas on Ray Serve, HTTP in the command's process.

One Serve application per model, ``<name>``, of one deployment, ``<name>-replicas``
(``EngineReplica``: a ServingEngine each, routed by ``PrefixAffinityRouter``; ``num_replicas`` or
``autoscaling_config``, ``ray_actor_options``). The OpenAI app of ``ruvllm serve`` runs over a
``RemoteEngine`` in the process that runs the command, listening on ``[server] host/port``
itself, as vLLM's API server does over its Ray workers. Serve's HTTP proxy is not started:
in front of a separate ingress deployment it cost every request a proxy -> ingress call and
the ingress's call back to the proxy for the body (6.5 ms of the 10 ms Ray added to the first
token across nodes; docs/scale-out.md). The server therefore lives as long as the command,
like ``ruvllm serve``; Serve still places, restarts and redeploys the replicas.

Routing choice: Serve's pluggable ``RequestRouter`` (``request_router_config``) rather than
routing in the engine. A DeploymentHandle cannot address one replica, so routing in the
engine would need one deployment per replica, losing Serve's autoscaling, health checks and
restarts of a single deployment; the router keeps all of that and sees every request's
arguments (the prefix key) and Serve's per-replica queue lengths.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
from collections.abc import Iterator, Mapping
from typing import Any, ClassVar

import attrs

from ruvllm.config import Config
from ruvllm.engine.options import EngineOptions
from ruvllm.options import positive_int
from ruvllm.scaleout.metrics_board import start_board
from ruvllm.scaleout.remote_engine import RemoteEngine
from ruvllm.scaleout.replica import EngineReplica
from ruvllm.scaleout.serve_env import FRONT_ENV, SERVE_ENV
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
    #: Environment of the replicas' processes (added to their ``runtime_env``): Serve's latency
    #: settings (``serve_env.SERVE_ENV``).
    serve_env: Mapping[str, str] = attrs.field(factory=lambda: dict(SERVE_ENV))
    #: Route each tenant's requests (OpenAI ``user``, Anthropic ``metadata.user_id``) to one
    #: replica, where SONA learns that tenant's adapter; None: when ``[sona]`` is enabled.
    tenant_affinity: bool | None = None

    @property
    def deployment(self) -> str:
        """The replicas' deployment: ``build_replicas`` names it, ``open_remote_engine`` finds it."""
        return f"{self.name}-replicas"

    @property
    def board(self) -> str:
        """The replicas' metrics board (``metrics_board``): they report to it, the server reads it."""
        return f"{self.name}-metrics"


async def open_remote_engine(config: Config, scale: ScaleOutSettings) -> RemoteEngine:
    """The engine of the HTTP app: a RemoteEngine over the running ``scale.name`` application's
    replicas, with the model's tokenizer loaded here and the replicas' metrics board."""
    from ray import serve

    replicas = serve.get_deployment_handle(scale.deployment, app_name=scale.name)
    board = start_board(scale.board)
    description = await replicas.describe.remote()
    baseline = await replicas.metrics.remote()
    # The replicas' own backend, not the config's name: `auto` may have picked by what
    # `ruvllm tune` measured for their load, and the tokenizer must be the one they use.
    owner = await asyncio.to_thread(load_tokenizer_backend, config, description.backend_name)
    options = EngineOptions.from_mapping(config.engine)
    return RemoteEngine(replicas, description, owner.tokenizer, options=options,
                        affinity_blocks=scale.affinity_blocks, retries=scale.retries, board=board,
                        baseline=baseline, owner=owner, tenant_affinity=_tenant_affinity(config, scale))


def create_ray_app(engine: RemoteEngine, config: Config, *, served_name: str | None = None,
                   max_context: int | None = None) -> tuple[Any, Any]:
    """``ruvllm serve``'s unchanged app over ``engine`` (plus ``/ray/replicas``, and feedback
    that waits for the replica), and its settings."""
    from ruvllm.server.app import create_app
    from ruvllm.server.runner import settings_for

    settings = settings_for(config, engine, served_name=served_name, max_context=max_context)
    app = create_app(engine, settings)
    _route_feedback_to_replicas(app, engine)

    @app.get("/ray/replicas")
    async def replicas() -> dict[str, Any]:
        """Per-replica engine counters (latest report of each replica, dead ones included),
        and this server's resends, mid-stream failures after replica deaths and requests running
        on each replica now."""
        latest = await engine.refresh_metrics()
        return {"ingress": {"resent": engine.resent, "died_mid_stream": engine.died_mid_stream,
                            "running": engine.running_by_replica()},
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

    return app, settings


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


def build_replicas(config: Config, scale: ScaleOutSettings | None = None) -> Any:
    """The Serve application of ``config``'s replicas: ``serve.run`` it under ``scale.name``, with
    no route (``open_remote_engine`` reaches it by handle). Running it again over a live one is
    a rolling redeploy: Serve replaces the replicas a few at a time."""
    from ray import serve
    from ray.serve.config import RequestRouterConfig

    from ruvllm.scaleout.serve_router import PrefixAffinityRouter

    scale = scale or ScaleOutSettings()
    sizing: dict[str, Any] = {"autoscaling_config": dict(scale.autoscaling_config)} \
        if scale.autoscaling_config else {"num_replicas": scale.replicas}
    if scale.prefix_affinity:
        sizing["request_router_config"] = RequestRouterConfig(
            request_router_class=PrefixAffinityRouter,
            request_router_kwargs={"busy_threshold": scale.busy_threshold})
    replica = serve.deployment(EngineReplica).options(
        name=scale.deployment, ray_actor_options=_with_env(scale.ray_actor_options, scale.serve_env),
        max_ongoing_requests=scale.max_ongoing_requests, **sizing)
    return replica.bind(config, scale.board)


def init_ray(num_cpus: int | None = None) -> None:
    """Join ``$RAY_ADDRESS`` when set, else start a local Ray instance (no dashboard)."""
    import ray

    if ray.is_initialized():
        return
    address = os.environ.get("RAY_ADDRESS")
    if address:
        ray.init(address=address, log_to_driver=False)
    else:
        ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=False)


def serve_on_ray(config: Config, scale: ScaleOutSettings, *, served_name: str | None = None,
                 max_context: int | None = None, log_level: str = "info") -> None:
    """What ``ruvllm serve --ray`` does: start (or join) Ray, deploy the replicas, then serve HTTP
    here until Ctrl-C, and remove the application."""
    from ruvllm.server.runner import check_port_free

    check_port_free(config.server.host, config.server.port)
    # Serve reads them when it is imported: this process's handle routes on its own event loop and
    # calls the replicas over gRPC. Given values win.
    for key, value in FRONT_ENV.items():
        os.environ.setdefault(key, value)
    from ray import serve

    init_ray()
    serve.start(proxy_location="Disabled")
    try:
        serve.run(build_replicas(config, scale), name=scale.name, route_prefix=None)
    except BaseException:  # Ctrl-C while the replicas load, or a replica that cannot start
        serve.delete(scale.name)
        raise
    asyncio.run(_serve_until_interrupted(config, scale, served_name=served_name, max_context=max_context,
                                         log_level=log_level))


async def _serve_until_interrupted(config: Config, scale: ScaleOutSettings, **kwargs: Any) -> None:
    from ray import serve

    try:
        server = await http_server(config, scale, **kwargs)
        await server.serve()
    finally:
        # On this loop, which the handle's router listens for Serve's updates on: deleting once
        # it has stopped leaves Serve's long-poll client logging that its loop is gone.
        await asyncio.to_thread(serve.delete, scale.name)


async def http_server(config: Config, scale: ScaleOutSettings, *, served_name: str | None = None,
                      max_context: int | None = None, log_level: str = "info") -> Any:
    """The uvicorn server (not started: ``await`` its ``serve()``) of the HTTP app over the running
    ``scale.name`` application, on ``[server] host/port``, once the banner is printed. Its engine
    and routing live on the event loop that awaits this."""
    import uvicorn

    from ruvllm.server.runner import announce, startup_banner, uvicorn_config

    engine = await open_remote_engine(config, scale)
    app, settings = create_ray_app(engine, config, served_name=served_name, max_context=max_context)
    replicas = "autoscaled replicas" if scale.autoscaling_config else f"{scale.replicas} replica(s)"
    announce(config, settings, f"{startup_banner(engine, settings)}\nruvllm: on Ray Serve, {replicas}",
             log_level)
    return uvicorn.Server(uvicorn_config(app, config, log_level))


@contextlib.contextmanager
def http_in_thread(config: Config, scale: ScaleOutSettings, *, timeout: float = 120.0) -> Iterator[str]:
    """``http_server`` on a thread of this process, for tests and benchmarks that are the Ray
    driver themselves (they deploy with ``build_replicas`` and inspect Serve): yields the base
    URL once it accepts connections, and stops the server on exit."""
    box: dict[str, Any] = {}

    async def main() -> None:
        box["server"] = await http_server(config, scale, log_level="warning")
        await box["server"].serve()

    def run() -> None:
        try:
            asyncio.run(main())
        except BaseException as exc:  # reported by the waiting thread below
            box["error"] = exc

    thread = threading.Thread(target=run, name="ruvllm-ray-http", daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout
    while not getattr(box.get("server"), "started", False):
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError(f"the HTTP server over {scale.name!r} did not start: {box.get('error')!r}")
        time.sleep(0.05)
    try:
        yield f"http://{config.server.host}:{config.server.port}"
    finally:
        box["server"].should_exit = True
        thread.join(timeout=30)
