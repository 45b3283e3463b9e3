"""``python -m agentrl.devices --gpus N -- COMMAND ...``: run COMMAND on N GPUs of its own.

Snakemake's ``--resources gpu=8`` only counts: it keeps the GPUs of the running jobs at 8 or
fewer, but it tells no job which GPUs are its own, so every job would see all of them and the
CUDA libraries would put each one on GPU 0. Rules that use GPUs therefore start their command
through this module (``on_gpus(...)`` in rules/common.smk), which claims N devices from the
machine's pool, sets ``CUDA_VISIBLE_DEVICES`` to them and replaces itself with COMMAND.

- The pool: ``AGENTRL_GPUS`` (device ids, ``0,1,2,3``) if set, else ``CUDA_VISIBLE_DEVICES``
  (what this process was given, e.g. by SLURM), else every GPU ``nvidia-smi -L`` lists.
- A claim is an exclusive ``flock`` on one file per device in the lock folder
  (``AGENTRL_GPU_LOCK_DIR``, else ``/tmp/agentrl-gpus-<uid>``; inside a SLURM job a folder of
  that job's own, since SLURM numbers each job's devices from 0). The locked descriptors stay
  open across ``exec``, so the claim lasts exactly as long as COMMAND and its children run, and
  a killed job frees its devices with no cleanup. Jobs of two workflows on one machine share
  the pool and never share a device.
- ``--gpus 0`` runs COMMAND unchanged (a CPU job). When fewer than N devices are free (another
  workflow holds them), the claim waits, saying so once.
"""

from __future__ import annotations

import argparse
import fcntl
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

POLL_SECONDS = 2.0


class DeviceError(RuntimeError):
    """The GPUs asked for cannot be had on this machine."""


def device_pool(env: Mapping[str, str]) -> list[str]:
    """The device ids jobs on this machine (or in this SLURM job) may claim, in order."""
    for key in ("AGENTRL_GPUS", "CUDA_VISIBLE_DEVICES"):
        if key in env:
            return [d.strip() for d in env[key].split(",") if d.strip() and d.strip() != "-1"]
    if shutil.which("nvidia-smi") is None:
        return []
    listing = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, check=False).stdout
    return [str(i) for i, line in enumerate(listing.splitlines()) if line.startswith("GPU ")]


def lock_dir(env: Mapping[str, str]) -> Path:
    if env.get("AGENTRL_GPU_LOCK_DIR"):
        return Path(env["AGENTRL_GPU_LOCK_DIR"])
    name = f"agentrl-gpus-{os.getuid()}"
    if env.get("SLURM_JOB_ID"):
        name += f"-slurm{env['SLURM_JOB_ID']}"
    return Path("/tmp") / name


def _try_lock(path: Path) -> int | None:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def try_claim(count: int, pool: Sequence[str], folder: Path) -> tuple[list[str], list[int]] | None:
    """Lock ``count`` free devices of ``pool``: (their ids, the open locked descriptors), or None.

    A folder-wide lock around the scan makes a claim all-or-nothing, so two jobs never each
    hold part of what both need.
    """
    folder.mkdir(parents=True, exist_ok=True)
    guard = os.open(folder / "pool.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(guard, fcntl.LOCK_EX)
        ids, fds = [], []
        for device in pool:
            fd = _try_lock(folder / f"gpu{device}.lock")
            if fd is not None:
                ids.append(device)
                fds.append(fd)
                if len(ids) == count:
                    return ids, fds
        for fd in fds:
            os.close(fd)
        return None
    finally:
        os.close(guard)


def claim(count: int, env: Mapping[str, str], *, wait: bool = True) -> tuple[list[str], list[int]]:
    """Claim ``count`` devices, waiting while other jobs hold them; raises DeviceError if impossible."""
    pool = device_pool(env)
    if count > len(pool):
        raise DeviceError(
            f"{count} GPU(s) asked for, but this machine's pool has {len(pool)} ({','.join(pool) or 'none'}): "
            "set AGENTRL_GPUS or CUDA_VISIBLE_DEVICES to the devices to use, and keep Snakemake's "
            "--resources gpu=N at most that many"
        )
    folder = lock_dir(env)
    said = False
    while True:
        got = try_claim(count, pool, folder)
        if got is not None:
            return got
        if not wait:
            raise DeviceError(f"fewer than {count} of the GPUs {','.join(pool)} are free")
        if not said:
            print(f"agentrl.devices: waiting for {count} free GPU(s) of {','.join(pool)} ({folder})", file=sys.stderr)
            said = True
        time.sleep(POLL_SECONDS)


def run_on_gpus(count: int, command: Sequence[str], env: Mapping[str, str] | None = None) -> None:
    """Replace this process with ``command`` running on ``count`` devices of its own."""
    env = dict(os.environ if env is None else env)
    if count > 0:
        ids, fds = claim(count, env)
        for fd in fds:
            os.set_inheritable(fd, True)  # the claim lives as long as the command
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode())
        env["CUDA_VISIBLE_DEVICES"] = ",".join(ids)
        print(f"agentrl.devices: CUDA_VISIBLE_DEVICES={env['CUDA_VISIBLE_DEVICES']}", file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execvpe(command[0], list(command), env)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m agentrl.devices", description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpus", type=int, required=True, help="devices to claim (0: run the command unchanged)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command and its arguments")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command given (python -m agentrl.devices --gpus N -- COMMAND ...)")
    if args.gpus < 0:
        parser.error(f"--gpus must be >= 0, got {args.gpus}")
    try:
        run_on_gpus(args.gpus, command)
    except DeviceError as exc:
        parser.exit(2, f"agentrl.devices: {exc}\n")
    return 0  # not reached: run_on_gpus replaces the process


if __name__ == "__main__":
    sys.exit(main())
