"""``python -m jigsaw_verl.main_ppo``: verl's ``main_ppo`` plus the ``jigsaw`` config group and the CPU backend.

Every verl override works unchanged; with ``jigsaw.enable=false`` the run is verl's own
(``verl.trainer.main_ppo.main``). ``trainer.device=cpu`` switches the run onto the CPU backend
(:mod:`jigsaw_verl.integration.cpu.backend`) after checking it, before verl or Ray start.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf

from jigsaw_verl.integration.mux_checks import check_mux_policy, check_mux_run
from jigsaw_verl.integration.pipeline_spec import mux_pipeline_name
from jigsaw_verl.integration.settings import (
    CONFIG_FILE,
    KNOWN_KEYS,
    JigsawConfigError,
    JigsawSettings,
    refuse_unknown,
)

# JigsawConfigError is imported from here by recipes (recipes/legacy_dropin/main.py)
__all__ = ["JigsawConfigError", "check_jigsaw_config", "check_jigsaw_overrides", "check_mux_policy", "main", "prepare"]
from jigsaw_verl.runtime.recipe_entry import CHECK_ENV

# environment the launcher gives a pipeline that its Ray actors need too
FORWARDED_ENV = ("VERL_FILE_LOGGER_PATH",)


def check_jigsaw_overrides(argv: list[str]) -> None:
    """Reject an unknown ``jigsaw.*`` command-line key before hydra does (hydra's own error is a six-line
    traceback); :meth:`JigsawSettings.from_config` repeats this for keys that come from elsewhere."""
    for arg in argv:
        key = arg.split("=", 1)[0].lstrip("+~")
        if "=" not in arg or not key.startswith("jigsaw."):
            continue
        parts = key.split(".")[1:]
        refuse_unknown("jigsaw", parts[0])
        if len(parts) > 1 and f"jigsaw.{parts[0]}" in KNOWN_KEYS:
            refuse_unknown(f"jigsaw.{parts[0]}", parts[1])


def check_jigsaw_config(config: DictConfig) -> JigsawSettings:
    """Parse the ``jigsaw`` group of ``config`` and check it against the rest of the verl config, before Ray.

    Returns:
        The run's :class:`JigsawSettings`.

    Raises:
        JigsawConfigError: one line naming the key at fault.
    """
    settings = JigsawSettings.from_config(config)
    if settings.enable:
        check_mux_run(settings.mux, config)
    check_migration(settings, config)
    return settings


def check_migration(settings: JigsawSettings, config: DictConfig) -> None:
    """The checks of ``jigsaw.migration.enable=true`` against verl's trainer mode and rollout backend."""
    if not settings.migration.enable:
        return
    mode = config.trainer.v1.get("trainer_mode", "sync")
    if mode not in ("sync", "jigsaw"):
        raise JigsawConfigError(
            f"jigsaw.migration.enable=true runs trainer.v1.trainer_mode=jigsaw (sync + migration); "
            f"trainer.v1.trainer_mode={mode!r} is not supported with it"
        )


# hydra's flags that choose the primary config
PRIMARY_CONFIG_FLAGS = ("--config-name", "-cn", "--config-path", "-cp")


def split_primary_config(argv: list[str]) -> list[str]:
    """``argv`` without its ``--config-name`` / ``--config-path`` flags (``flag=value`` or ``flag value``), which
    must name verl's ``ppo_trainer`` (the entry point composes it plus the ``jigsaw`` group); refuses another primary
    config, e.g. verl's Megatron recipes', in one line."""
    rest, i = [], 0
    while i < len(argv):
        flag, eq, value = argv[i].partition("=")
        if flag not in PRIMARY_CONFIG_FLAGS:
            rest.append(argv[i])
            i += 1
            continue
        if not eq:  # its value is the next word
            value, i = (argv[i + 1] if i + 1 < len(argv) else ""), i + 1
        i += 1
        if flag in ("--config-name", "-cn") and value.removesuffix(".yaml") in ("ppo_trainer", "jigsaw_ppo_trainer"):
            continue
        if flag in ("--config-path", "-cp") and value in ("config", str(CONFIG_FILE.parent)):
            continue
        raise JigsawConfigError(
            f"{flag}={value}: jigsaw_verl.main_ppo composes verl's ppo_trainer config plus the jigsaw group; a "
            "recipe with another primary config (verl's Megatron recipes: ppo_megatron_trainer) cannot join a "
            "group yet"
        )
    return rest


def select_jigsaw_trainer(config: DictConfig) -> None:
    """Select the ``jigsaw`` trainer mode and the migrating load balancer (both verl extension points)."""
    from pathlib import Path

    from omegaconf import open_dict

    with open_dict(config):
        config.trainer.v1.trainer_mode = "jigsaw"
        config.actor_rollout_ref.rollout.router_config_path = str(
            Path(__file__).resolve().parent / "config" / "migrating_router.yaml"
        )
    set_ray_env(config, "JIGSAW_VERL_TRAINER_MODES", "1")  # the plugin registers trainer mode `jigsaw` everywhere


def set_ray_env(config: DictConfig, name: str, value: str) -> None:
    """Give this process and every Ray worker of the run environment variable ``name`` (through the job's runtime
    env, which also reaches workers of a cluster the run joins rather than starts)."""
    from omegaconf import OmegaConf

    os.environ[name] = value
    OmegaConf.update(config, f"ray_kwargs.ray_init.runtime_env.env_vars.{name}", value, force_add=True)


# verl's agent-loop manager with the workers on the trainer's node (integration/trainer/agent_loop_placement.py; named,
# not imported: it imports verl, which prepare() must run before)
NODE_LOCAL_MANAGER = "jigsaw_verl.integration.trainer.agent_loop_placement.NodeLocalAgentLoopManager"


def prepare(config: DictConfig) -> JigsawSettings:
    """All checks and adjustments that must happen before verl is imported.

    Returns:
        The run's :class:`JigsawSettings` (parsed once, here).
    """
    settings = check_jigsaw_config(config)
    if settings.enable or settings.migration.enable or config.trainer.v1.get("trainer_mode") == "jigsaw":
        select_jigsaw_trainer(config)
    if settings.enable:
        # pipelines of a group share a Ray cluster; each keeps its own TransferQueue
        # (patches/transfer_queue_namespace.py)
        namespace = f"transfer_queue.{settings.mux.group}.{mux_pipeline_name(settings.mux, config)}"
        set_ray_env(config, "JIGSAW_VERL_TQ_NAMESPACE", namespace)
        agent = config.actor_rollout_ref.rollout.get("agent", {})
        if not agent.get("agent_loop_manager_class"):
            # its agent-loop workers beside its trainer, not on nodes other pipelines live on
            OmegaConf.update(
                config, "actor_rollout_ref.rollout.agent.agent_loop_manager_class", NODE_LOCAL_MANAGER, force_add=True
            )
        if config.actor_rollout_ref.rollout.get("name") == "vllm":
            from omegaconf import open_dict

            # vLLM updates the queue gauges the group's scheduler reads (rollout/server_metrics.py) only with its
            # stat logging on, which verl turns off by default
            with open_dict(config):
                config.actor_rollout_ref.rollout.disable_log_stats = False
    if config.trainer.get("device") == "cpu":
        from jigsaw_verl.integration.cpu.backend import prepare_cpu_run

        changed = prepare_cpu_run(config)
        print(f"jigsaw_verl.main_ppo: CPU backend; set for the CPU: {', '.join(changed) or 'nothing'}", flush=True)
    if os.environ.get("RAY_ADDRESS"):
        from omegaconf import open_dict

        # joining a running cluster (the mux launcher's): Ray refuses resource sizes from a connecting driver
        with open_dict(config):
            config.ray_kwargs.get("ray_init", {}).pop("num_cpus", None)
    for name in FORWARDED_ENV:
        if name in os.environ:
            set_ray_env(config, name, os.environ[name])
    return settings


@hydra.main(config_path="config", config_name="jigsaw_ppo_trainer", version_base=None)
def hydra_main(config: DictConfig) -> None:
    """hydra's entry: :func:`prepare` (bad input: one line on stderr, exit code 2), then verl's ``main_ppo``."""
    from jigsaw_verl.integration.cpu.backend import CPUConfigError

    if os.environ.get(CHECK_ENV):  # jigsaw-verl check / the launcher: every pre-Ray check, then stop
        from jigsaw_verl.integration.entry_check import check_report

        report = check_report(config)
        sys.exit(write_verdict(Path(os.environ[CHECK_ENV]), **report))
    try:
        prepare(config)
    except (JigsawConfigError, CPUConfigError) as err:
        print(f"jigsaw_verl.main_ppo: error: {err}", file=sys.stderr)
        sys.exit(2)
    from verl.trainer.main_ppo import main as verl_main

    verl_main(config)  # hydra's decorator passes a given config straight through


def write_verdict(path: Path, problems: list[str], *, composing: bool = False, **found) -> int:
    """Write the check mode's verdict for the launcher (the problems, and what :func:`check_report` found: the
    planning spec, where its steps came from, the engine reservation, the slot memory), print each problem; the
    exit code: 0 or 2."""
    path.write_text(json.dumps({"problems": problems, "how": "", "composing": composing, **found}))
    for line in problems:
        print(f"jigsaw_verl.main_ppo: error: {line}", file=sys.stderr)
    return 2 if problems else 0


def main() -> None:
    """``python -m jigsaw_verl.main_ppo``: the command-line checks, then hydra (:func:`hydra_main`)."""
    argv = sys.argv[1:]
    try:
        argv = split_primary_config(argv)  # verl's own, which the entry point composes anyway
        check_jigsaw_overrides(argv)
    except JigsawConfigError as err:
        if os.environ.get(CHECK_ENV):
            sys.exit(write_verdict(Path(os.environ[CHECK_ENV]), [str(err)]))
        print(f"jigsaw_verl.main_ppo: error: {err}", file=sys.stderr)
        sys.exit(2)
    if os.environ.get(CHECK_ENV):
        write_verdict(Path(os.environ[CHECK_ENV]), [], composing=True)  # replaced once hydra has composed
    sys.argv[1:] = argv
    hydra_main()


if __name__ == "__main__":
    main()
