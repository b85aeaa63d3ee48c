"""Scale-out: a trainer runs unchanged under `accelerate launch` (DDP over gloo on CPU); both ranks end identical.

`accelerate launch --cpu --num_processes 2` starts ONE process in accelerate 1.x (`--cpu` selects the simple launcher,
which only spawns several through `--mpirun_hostfile`). The torchrun launcher behind `--multi_gpu` starts two, and the
training arguments' `use_cpu=True` makes them CPU ranks joined by gloo; that is what this test runs."""
import hashlib
import json
import socket
import subprocess
import sys
from pathlib import Path

from safetensors.torch import load_file

SCRIPT = Path(__file__).parents[1] / "scripts" / "ddp_aligner.py"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_aligner_sft_under_accelerate_two_processes(tiny_model_dir, tmp_path):
    accelerate = Path(sys.executable).parent / "accelerate"
    cmd = [
        str(accelerate),
        "launch",
        "--multi_gpu",
        "--num_processes",
        "2",
        "--num_machines",
        "1",
        "--mixed_precision",
        "no",
        "--dynamo_backend",
        "no",
        "--main_process_ip",
        "127.0.0.1",
        "--main_process_port",
        str(free_port()),
        str(SCRIPT),
        str(tiny_model_dir),
        str(tmp_path),
    ]
    run = subprocess.run(
        cmd, capture_output=True, text=True, timeout=600, env={**__import__("os").environ, "OMP_NUM_THREADS": "1"}
    )
    assert run.returncode == 0, run.stderr[-4000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [r["world_size"] for r in ranks] == [2, 2]
    assert ranks[0]["global_step"] == ranks[1]["global_step"] == 3
    assert ranks[0]["sha256"] == ranks[1]["sha256"]  # DDP kept the replicas identical
    init = hashlib.sha256()
    for name, p in sorted(load_file(tiny_model_dir / "model.safetensors").items()):
        init.update(name.encode()); init.update(p.float().numpy().tobytes())
    assert ranks[0]["sha256"] != init.hexdigest()  # and they trained
