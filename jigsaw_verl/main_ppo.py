"""``python -m jigsaw_verl.main_ppo``: verl's ``main_ppo`` plus the ``jigsaw`` config group (the entry point; the
code is :mod:`jigsaw_verl.integration.main_ppo`)."""

from jigsaw_verl.integration.main_ppo import main

if __name__ == "__main__":
    main()
