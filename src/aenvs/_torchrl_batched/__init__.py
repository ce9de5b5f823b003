"""TorchRL's ``SerialEnv`` / ``ParallelEnv`` on the aenvs core (exported by :mod:`aenvs.torchrl`)."""
