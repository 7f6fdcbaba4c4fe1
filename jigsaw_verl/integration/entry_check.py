"""The entry point's check mode: every check it runs before Ray, reported at once, and the planning spec.

``jigsaw-verl check RECIPE.sh`` and the launcher run a recipe with ``JIGSAW_VERL_CHECK`` set
(:mod:`jigsaw_verl.runtime.recipe_entry`); ``jigsaw_verl.main_ppo`` then composes the config as for a run and,
instead of starting it, reports: the ``jigsaw.*`` rules, the multiplexed run's checks against verl's keys
(:mod:`.mux_checks`: the model lookup, the step count, slots, nodes, engines), the migration checks and the CPU
backend's, one line per problem; with none, the :class:`~jigsaw_verl.model.spec.PipelineSpec` the group's
scheduler would plan with.
"""

from __future__ import annotations

import dataclasses

from omegaconf import DictConfig

from jigsaw_verl.integration.mux_checks import mux_problems
from jigsaw_verl.integration.pipeline_spec import (
    engine_reservation_from_verl,
    mux_pipeline_name,
    mux_slot_spec,
    pipeline_spec_from_verl,
)
from jigsaw_verl.integration.settings import JigsawConfigError, JigsawSettings
from jigsaw_verl.integration.step_count import planned_steps


def check_report(config: DictConfig) -> dict:
    """``{"problems": [line, ...], "spec": PipelineSpec fields or None, "how": where the step count came from}``."""
    from jigsaw_verl.integration.cpu.backend import CPUConfigError, check_cpu_config
    from jigsaw_verl.integration.main_ppo import check_migration

    try:
        settings = JigsawSettings.from_config(config)
    except JigsawConfigError as err:
        return {"problems": [str(err)]}
    problems = mux_problems(settings.mux, config) if settings.enable else []
    try:
        check_migration(settings, config)
        if config.trainer.get("device") == "cpu":
            check_cpu_config(config)
    except (JigsawConfigError, CPUConfigError) as err:
        problems.append(str(err))
    if problems or not settings.enable:
        return {"problems": problems}
    count = planned_steps(config)
    spec = pipeline_spec_from_verl(mux_pipeline_name(settings.mux, config), config, steps=count.steps)
    return {
        "problems": [],
        "spec": dataclasses.asdict(spec),
        "how": count.how,
        "engine": dataclasses.asdict(engine_reservation_from_verl(settings.mux, config, spec)),
        "slot_memory_bytes": mux_slot_spec(settings.mux, config, spec).memory_bytes,
    }
