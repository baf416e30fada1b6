"""Running one specjax program as several JAX processes (multi-host TPU slices, GPU clusters).

JAX runs a multi-host job as one process per host (multi-controller): every process runs the
same Python program, sees all devices of the job in `jax.devices()` but holds data only on its
own (`jax.local_devices()`), and `jax.distributed.initialize` must connect the processes before
any other JAX call. After that a ('data', 'model') mesh over `jax.devices()` spans the hosts and
the decode and training programs run unchanged: inputs that every process builds identically
(the tokenised prompt batch, the initial parameters) are placed with `jax.device_put`, which
copies each host's shards to its own devices, and results are read back with
`sharding.to_host`, which gathers arrays split over other hosts.

`initialize` reads where the job's coordinator is from the environment:

  * `JAX_COORDINATOR_ADDRESS` (host:port of process 0), `JAX_NUM_PROCESSES` and
    `JAX_PROCESS_ID`, when set (any launcher, e.g. one shell command per host);
  * otherwise JAX's own cluster detection: Cloud TPU slices (the TPU metadata), SLURM
    (`srun`), Open MPI (`mpirun`), Kubernetes jobs.

See docs/multihost.md for launch commands.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

ADDRESS, NUM_PROCESSES, PROCESS_ID = "JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID"


class DistributedError(ValueError):
    """Environment variables that do not describe a multi-process job."""


def _int_var(env: Mapping[str, str], name: str) -> int | None:
    value = env.get(name)
    if value is None or value == "":
        return None
    try:
        return int(value)
    except ValueError:
        raise DistributedError(f"{name}={value!r} is not an integer") from None


def process_args(env: Mapping[str, str] = os.environ) -> dict:
    """Keyword arguments for `jax.distributed.initialize` from `env` (unset ones left to JAX's detection).

    Raises:
      DistributedError: a count or id that is not an integer, a process id outside [0, num_processes),
        or a process count / id without a coordinator address.
    """
    address = env.get(ADDRESS) or None
    num, pid = _int_var(env, NUM_PROCESSES), _int_var(env, PROCESS_ID)
    if num is not None and num < 1:
        raise DistributedError(f"{NUM_PROCESSES}={num} must be at least 1")
    if num is not None and pid is not None and not 0 <= pid < num:
        raise DistributedError(f"{PROCESS_ID}={pid} must be in [0, {NUM_PROCESSES}={num})")
    if address is None and (num is not None or pid is not None):
        raise DistributedError(f"{NUM_PROCESSES} / {PROCESS_ID} are set but {ADDRESS} (host:port of process 0) is not")
    args = {"coordinator_address": address, "num_processes": num, "process_id": pid}
    return {k: v for k, v in args.items() if v is not None}


def initialize(env: Mapping[str, str] = os.environ) -> None:
    """Connects this process to the others of its job (`jax.distributed.initialize`); call it first.

    Does nothing when JAX's distributed client is already running (a second call, or a
    launcher that initialised it).

    Raises:
      DistributedError: malformed environment variables (see `process_args`), or neither the
        variables nor a launcher JAX detects say where the coordinator is.
    """
    import jax

    args = process_args(env)
    if jax.distributed.is_initialized():
        return
    try:
        jax.distributed.initialize(**args)
    except ValueError as e:  # JAX's checks of the (partly detected) layout, before any connection
        raise DistributedError(
            f"{e} Set {ADDRESS}, {NUM_PROCESSES} and {PROCESS_ID}, or launch under Cloud TPU, SLURM, Open MPI or "
            "Kubernetes (docs/multihost.md)") from None


def is_primary() -> bool:
    """True in the process that writes files and prints results (process 0; the only one when single)."""
    import jax

    return jax.process_index() == 0
