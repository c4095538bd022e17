"""Training: device and precision, the process group, the optimiser engines (plain torch/DDP and DeepSpeed
ZeRO: ``optim`` and ``zero`` groups) and checkpoints."""
