"""Scale-out: every trainer runs unchanged under `accelerate launch` (DDP over gloo on CPU ranks).

For each trainer (`AlignerTrainer`, `PiSSATrainer`, `RepNoiseTrainer`, Trans-LoRA's `TransLoRATrainer`, the DPO round
of `dpo_rounds`) on two ranks: both ranks end with identical weights, the result equals one process with the same
global batch (within `TOLERANCE`, explained there), and saving and pushing from every rank writes and uploads once.

`accelerate launch --cpu --num_processes 2` starts ONE process in accelerate 1.x (`--cpu` selects the simple launcher,
which only spawns several through `--mpirun_hostfile`). The torchrun launcher behind `--multi_gpu` starts two, and the
training arguments' `use_cpu=True` makes them CPU ranks joined by gloo; that is what these tests run. Starting two
interpreters costs most of a launch's time, so one launch trains every trainer in turn (tests/scripts/ddp_trainers.py);
a trainer that launch did not finish is launched again alone, so that its own test shows its own error.
"""
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from huggingface_hub import HfApi, hf_hub_download
from safetensors.torch import load_file

SCRIPT = Path(__file__).parents[1] / "scripts" / "ddp_trainers.py"
_spec = importlib.util.spec_from_file_location("ddp_trainers", SCRIPT)
ddp = importlib.util.module_from_spec(_spec); _spec.loader.exec_module(ddp)

# How far two ranks may be from one process with the same global batch, as a fraction of the update one process made
# (per tensor: ||(W_2 - W0_2) - (W_1 - W0_1)|| <= TOLERANCE ||W_1 - W0_1||). Data parallelism computes the same
# gradient in another order: each rank's mean over its half, all-reduced and halved, against one mean over the batch.
# In float32 that re-association moves a gradient by ~1e-7 of its size; SGD's update is lr x gradient, so after a few
# steps the two runs differ by ~1e-6 of the update. 1e-4 leaves room for that (and for the one-process run using another
# thread count), while the bugs this guards against are of the order of the update itself: a loss averaged twice
# (halves it: 0.5), a rank training on the other's rows or its own init (~1), the noise or hooks of one replica leaking.
TOLERANCE = 1e-4


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(model_dir: Path, out: Path, names: list[str], env: dict, timeout: float = 900):
    "Run tests/scripts/ddp_trainers.py for `names` under `accelerate launch` on two CPU ranks (gloo): its process."
    accelerate = Path(sys.executable).parent / "accelerate"
    cmd = [str(accelerate), "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
           "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_ip", "127.0.0.1",
           "--main_process_port", str(_free_port()), str(SCRIPT), str(model_dir), str(out), *names]
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, **env},
                          start_new_session=True) as proc:
        try: out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:  # the launcher, its agent and both ranks: none outlives the test
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            err += f"\n(stopped after {timeout} s)"
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


class TwoRanks:
    "The two-rank runs of the trainers, launched together on first use; a trainer not finished there is run alone."
    def __init__(self, model_dir: Path, root: Path, endpoint: str):
        self.model_dir, self.root, self.endpoint, self.errors = model_dir, root, endpoint, {}
        self.env = {"HF_ENDPOINT": endpoint, "OMP_NUM_THREADS": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1"}

    def _done(self, folder: Path) -> bool:
        return all((folder / f"rank{r}.json").is_file() for r in (0, 1))

    def __call__(self, name: str) -> Path:
        "OUT/NAME of the two-rank run of `name`, after asserting the launch succeeded."
        joint = self.root / "all"
        if not joint.exists():
            run = launch(self.model_dir, joint, list(ddp.TRAINERS), self.env)
            self.errors["all"] = "" if run.returncode == 0 else run.stderr[-6000:]
        if self._done(joint / name): return joint / name
        alone = self.root / f"{name}-alone"
        run = launch(self.model_dir, alone, [name], self.env)
        assert run.returncode == 0 and self._done(alone / name), run.stderr[-6000:]
        return alone / name


@pytest.fixture(scope="module")
def two_ranks(tiny_model_dir, tmp_path_factory):
    from adaptkit.localhub.server import LocalHub
    with LocalHub(tmp_path_factory.mktemp("hub")) as hub:
        yield TwoRanks(tiny_model_dir, tmp_path_factory.mktemp("ddp"), hub.endpoint)


def _ranks(folder: Path) -> tuple[list[dict], list[dict], list[dict]]:
    "Per rank: its record, its final weights and its initial weights (the model file for dpo_rounds)."
    records = [json.loads((folder / f"rank{r}.json").read_text()) for r in (0, 1)]
    final = [load_file(folder / f"rank{r}.safetensors") for r in (0, 1)]
    init = [load_file(folder / f"init.rank{r}.safetensors") for r in (0, 1)]
    return records, final, init


def assert_identical(states: list[dict], what: str):
    "Both ranks hold the same tensors, bit for bit."
    a, b = states
    assert a.keys() == b.keys(), f"{what}: the ranks hold different tensors"
    differ = [k for k in a if not torch.equal(a[k], b[k])]
    assert not differ, f"{what}: the ranks differ in {differ[:5]}"


def update_errors(final: dict, init: dict, ref_final: dict, ref_init: dict) -> dict[str, float]:
    """Per tensor that one process changed: ||(final - init) - (ref_final - ref_init)|| / ||ref_final - ref_init||,
    less the float32 rounding of the weights themselves (eps * ||ref_final||): two runs cannot agree more closely than
    that, and a tensor barely moved (a LoRA A whose B is still near zero: an update of ~2e-6, measured) would otherwise
    be judged by its rounding alone. A tensor one process left alone must stay as it started on two ranks."""
    assert final.keys() == ref_final.keys(), set(final) ^ set(ref_final)
    errors, eps = {}, torch.finfo(torch.float32).eps
    for k, w in ref_final.items():
        step, ref_step = final[k].double() - init[k].double(), w.double() - ref_init[k].double()
        if not ref_step.any():
            assert not step.any(), f"{k}: one process left it as it was, two ranks changed it"
            continue
        errors[k] = (((step - ref_step).norm() - eps * w.double().norm()).clamp_min(0) / ref_step.norm()).item()
    return errors


def one_process(name: str, model_dir: Path, out: Path, **kwargs) -> tuple[dict, dict]:
    "The same training in this process, the whole global batch in one: (final, initial) weights."
    model, _, init = ddp.train(name, model_dir, out, per_device=ddp.GLOBAL_BATCH, **kwargs)
    return {k: v.detach() for k, v in model.state_dict().items()}, init


def check_against_one_process(folder: Path, ref: tuple[dict, dict], trained: str) -> dict[str, float]:
    "The two ranks' weights identical, and their update within TOLERANCE of one process's; the errors by tensor."
    _, final, init = _ranks(folder)
    assert_identical(final, "final weights")
    errors = update_errors(final[0], init[0], *ref)
    assert errors, "nothing trained"
    assert any(trained in k for k in errors), f"no {trained} tensor trained: {sorted(errors)[:5]}"
    worst = max(errors, key=errors.get)
    assert errors[worst] <= TOLERANCE, f"two ranks vs one process: {worst} off by {errors[worst]:.2e} of its update"
    return errors


def check_saved_and_pushed_once(folder: Path, endpoint: str, repo_id: str, records: list[dict]):
    "Each rank called save_model and push_to_hub: one artifact, written by rank 0 alone, as recorded; one upload."
    from adaptkit.hub import read_metadata, verify_checksums
    saved = folder / "saved"
    verify_checksums(saved, read_metadata(saved)["files"])
    settings = read_metadata(saved)["settings"]  # the artifact says how it was made: 2 processes x 2 rows each
    assert (settings["num_processes"], settings["total_train_batch_size"]) == (2, ddp.GLOBAL_BATCH), settings
    assert any(w.startswith("saved") for w in records[0]["writes"]), records[0]["writes"]  # the hook sees the save
    assert records[1]["writes"] == [], f"rank 1 wrote {records[1]['writes'][:5]}"
    titles = [c.title for c in HfApi(endpoint=endpoint).list_repo_commits(repo_id)]
    assert titles.count("End of training") == 1, titles
    assert [r["world_size"] for r in records] == [2, 2]
    assert records[0]["global_step"] == records[1]["global_step"] == ddp.STEPS


def test_AlignerTrainer_on_two_ranks_equals_one_process(two_ranks, tiny_model_dir, tmp_path):
    folder = two_ranks("aligner")
    records, _, init = _ranks(folder)
    assert_identical(init, "initial weights")
    check_against_one_process(folder, one_process("aligner", tiny_model_dir, tmp_path), "layers")
    check_saved_and_pushed_once(folder, two_ranks.endpoint, "team/ddp-aligner", records)


def test_PiSSATrainer_on_two_ranks_same_init_and_residual_equals_one_process(two_ranks, tiny_model_dir, tmp_path):
    "Each rank initialises PiSSA itself (seeded): the same adapter and the same residual base on both, before DDP."
    folder = two_ranks("pissa")
    records, _, init = _ranks(folder)
    assert_identical(init, "PiSSA's initial adapter and residual base")
    ref = one_process("pissa", tiny_model_dir, tmp_path)
    base = {k: v for k, v in init[0].items() if ".base_layer." in k}
    assert base and all(torch.allclose(v, ref[1][k], rtol=1e-5, atol=1e-6) for k, v in base.items())
    errors = check_against_one_process(folder, ref, "lora_")
    assert all("lora_" in k for k in errors)  # only the adapter trains; the residual base stays as initialised
    assert any(w.startswith("run/_pissa_init/") for w in records[0]["writes"])  # rank 0 wrote the initial adapter
    check_saved_and_pushed_once(folder, two_ranks.endpoint, "team/ddp-pissa", records)


class _NoisePerRank:
    """The one-process reference of RepNoise on two ranks: the global batch as two accumulated halves (RepNoise's loss,
    with the log of a batch mean and the MMD of a batch, is not a sum over rows: DDP averages each half's loss), and
    the second half draws the Gaussian noise the first drew, as the second rank does (both ranks share one seed)."""
    def compute_loss(self, model, inputs, **kwargs):
        self._micro = getattr(self, "_micro", -1) + 1
        if self._micro % 2 == 0: self._rng = torch.get_rng_state()
        else: torch.set_rng_state(self._rng)
        return super().compute_loss(model, inputs, **kwargs)


def test_RepNoiseTrainer_on_two_ranks_hooks_and_mmd_equal_one_process(two_ranks, tiny_model_dir, tmp_path):
    "The layer hooks and the MMD noise term under DDP: the same update as one process accumulating the two halves."
    from adaptkit.repnoise import RepNoiseTrainer
    folder = two_ranks("repnoise")
    records, _, init = _ranks(folder)
    assert_identical(init, "initial weights")
    cls = type("RepNoiseReference", (_NoisePerRank, RepNoiseTrainer), {})
    model, _, ref_init = ddp.train("repnoise", tiny_model_dir, tmp_path, per_device=ddp.GLOBAL_BATCH // 2,
                                   accumulation=2, trainer_class=cls)
    ref = ({k: v.detach() for k, v in model.state_dict().items()}, ref_init)
    check_against_one_process(folder, ref, "mlp")
    check_saved_and_pushed_once(folder, two_ranks.endpoint, "team/ddp-repnoise", records)


def test_TransLoRATrainer_distillation_on_two_ranks_equals_one_process(two_ranks, tiny_model_dir, tmp_path):
    folder = two_ranks("translora")
    records, _, init = _ranks(folder)
    assert_identical(init, "initial LoRA and base")
    errors = check_against_one_process(folder, one_process("translora", tiny_model_dir, tmp_path), "lora_B")
    assert all("lora_" in k for k in errors)
    check_saved_and_pushed_once(folder, two_ranks.endpoint, "team/ddp-translora", records)


def test_dpo_rounds_DPO_round_on_two_ranks_equals_one_process_and_pushes_once(two_ranks, tiny_model_dir, tmp_path):
    "One round of `dpo_rounds` with push_to: the same policy on both ranks as in one process, one commit, one tag."
    folder = two_ranks("dpo")
    records, _, _ = _ranks(folder)
    check_against_one_process(folder, one_process("dpo", tiny_model_dir, tmp_path), "layers")
    api = HfApi(endpoint=two_ranks.endpoint)
    commits = [c for c in api.list_repo_commits("team/ddp-dpo") if c.title == "Aligner DPO round 1"]
    assert len(commits) == 1, [c.title for c in api.list_repo_commits("team/ddp-dpo")]
    tags = {t.name: t.target_commit for t in api.list_repo_refs("team/ddp-dpo").tags}
    assert tags == {"round-1": commits[0].commit_id}
    # every rank returns the round's metrics with the one commit
    assert [r["rounds"][0]["commit"] for r in records] == [commits[0].commit_id] * 2
    assert records[0]["rounds"][0]["pairs"] == records[1]["rounds"][0]["pairs"] == 8
    pushed = json.loads(Path(hf_hub_download("team/ddp-dpo", "adaptkit.json", endpoint=two_ranks.endpoint)).read_text())
    assert (pushed["settings"]["num_processes"], pushed["settings"]["total_train_batch_size"]) == (2, ddp.GLOBAL_BATCH)
