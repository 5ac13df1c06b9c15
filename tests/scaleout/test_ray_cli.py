"""``ruvllm serve --ray`` options (the real Serve app is tested in test_ray_serve_app.py)."""

from __future__ import annotations

from click.testing import CliRunner
from ruvllm.cli import main


def test_serve_lists_the_ray_options():
    out = CliRunner().invoke(main, ["serve", "--help"])
    assert out.exit_code == 0
    assert "--ray" in out.output and "--replicas" in out.output and "RAY_ADDRESS" in out.output


def test_replicas_without_ray_is_refused_before_anything_loads():
    out = CliRunner().invoke(main, ["serve", "--replicas", "2"])
    assert out.exit_code == 2 and "--replicas needs --ray" in out.output
    out = CliRunner().invoke(main, ["serve", "--ray", "--replicas", "0"])
    assert out.exit_code == 2 and "--replicas" in out.output


def test_ray_refuses_several_models_before_starting_ray():
    out = CliRunner().invoke(main, ["serve", "--ray", "--model", "a=default", "--model", "b=default"])
    assert out.exit_code == 2 and "one model per Ray application" in out.output


def test_ray_refuses_runtime_lora_before_starting_ray():
    # An adapter loaded through a Serve handle would reach one replica only: refused, not ignored.
    out = CliRunner().invoke(main, ["serve", "--ray", "--allow-runtime-lora"])
    assert out.exit_code == 2 and "--allow-runtime-lora does not work with --ray" in out.output
