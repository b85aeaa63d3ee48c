"""Trains a tiny aligner for a few steps; tests/project/test_multiprocess.py runs it under
`accelerate launch --cpu --num_processes 2`.
Each rank writes the SHA-256 of its final weights (and the world size it saw) to OUT/rank{N}.json."""
import hashlib
import json
import os
import sys
from pathlib import Path

from adaptkit.aligner.trainer import AlignerConfig, AlignerTrainer
from adaptkit.models import load_tokenizer

model_dir, out = Path(sys.argv[1]), Path(sys.argv[2])
rows = [{"question": f"what is {i} plus {i}?", "answer": f"{i}", "correction": f"{2 * i}"} for i in range(16)]
args = AlignerConfig(str(out / "run"), max_steps=3, per_device_train_batch_size=2, learning_rate=1e-2, use_cpu=True,
                     save_strategy="no", report_to="none", disable_tqdm=True, gradient_checkpointing=False, seed=0)
trainer = AlignerTrainer(str(model_dir), args, rows, processing_class=load_tokenizer(model_dir))
trainer.train()
digest = hashlib.sha256()
for name, p in sorted(trainer.model.state_dict().items()):
    digest.update(name.encode())
    digest.update(p.detach().float().numpy().tobytes())
rank = int(os.environ.get("RANK", 0))
(out / f"rank{rank}.json").write_text(json.dumps({"sha256": digest.hexdigest(), "world_size": trainer.args.world_size,
                                                   "global_step": trainer.state.global_step}))
