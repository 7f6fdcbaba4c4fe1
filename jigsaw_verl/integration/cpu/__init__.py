"""CPU backend for verl: runs verl's own trainer, worker groups and agent loop on a machine without a GPU."""
