"""`wpk devices`: the GPU presets, the GPUs detected here and the host CPU."""

from __future__ import annotations

import json
from dataclasses import asdict

import click
from rich.console import Group
from rich.table import Table
from rich.text import Text

from wpk.commands.common import echo
from wpk.core.devices import GPU_PRESETS, detect_gpus, host_cpu


def device_listing() -> dict:
    """Presets, detected GPUs (with their matching preset) and the host CPU, as JSON-able data."""
    cpu = host_cpu()
    return {
        "host_cpu": {"description": cpu.description, "arch": cpu.arch, "cores": cpu.cores,
                     "vector_bits": cpu.vector_bits, "fingerprint": cpu.fingerprint},
        "detected_gpus": [asdict(gpu) for gpu in detect_gpus()],
        "presets": {name: {"description": spec.description, "arch": spec.arch,
                           "sms": spec.sm_count, "memory_gib": spec.memory_bytes // 2**30,
                           "bandwidth_gbs": spec.memory_bandwidth_gbs,
                           "fp32_tflops": spec.fp32_tflops,
                           "smem_per_block_kib": spec.shared_memory_per_block_optin // 1024}
                    for name, spec in GPU_PRESETS.items()},
    }


def render_devices(info: dict):
    """A rich renderable of `device_listing`'s result."""

    presets = Table(title="GPU presets (--gpu NAME)")
    for column in ("preset", "device", "arch", "SMs", "memory", "bandwidth", "fp32",
                   "smem/block"):
        presets.add_column(column)
    for name, p in info["presets"].items():
        presets.add_row(name, p["description"], p["arch"], str(p["sms"]),
                        f"{p['memory_gib']} GiB", f"{p['bandwidth_gbs']:.0f} GB/s",
                        f"{p['fp32_tflops']:.1f} TFLOP/s", f"{p['smem_per_block_kib']} KiB")
    gpus = info["detected_gpus"]
    detected = (Text("no NVIDIA GPU detected: --gpu NAME builds need --offline")
                if not gpus else Table(title="detected GPUs (--gpu auto)"))
    if gpus:
        for column in ("index", "name", "compute capability", "preset"):
            detected.add_column(column)
        for gpu in gpus:
            cc = ".".join(map(str, gpu["compute_capability"]))
            detected.add_row(str(gpu["index"]), gpu["name"], cc, gpu["preset"] or "none")
    cpu = info["host_cpu"]
    host = Text(f"host CPU (--cpu): {cpu['description']}, {cpu['cores']} cores, "
                f"{cpu['vector_bits']}-bit SIMD ({cpu['fingerprint']})")
    return Group(presets, detected, host)


@click.command("devices")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def command(as_json: bool) -> None:
    """List the GPU presets, the detected GPUs and the host CPU."""
    info = device_listing()
    echo(json.dumps(info, indent=2) if as_json else render_devices(info))
