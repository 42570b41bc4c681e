"""The benches behind `farm bench ...`, one module each; farm_cli.benches declares their commands and
imports a bench's module only when its command runs (as mlx-lm's CLI imports a command's module)."""
